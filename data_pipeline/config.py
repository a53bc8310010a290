from pydantic import Field

from ppdkit.models.config import Section


class DataConfig(Section):
    source: str = Field("sharegpt", description="sharegpt | mt-bench | humaneval | chitchat | path to .json/.jsonl(.gz)")
    limit: int | None = Field(512, ge=1, description="usable conversations to read (null: all)")
    max_length: int = Field(512, ge=8, description="tokens kept per conversation")
    holdout: float = Field(0.1, ge=0.0, lt=1.0, description="fraction of conversations held out for evaluation")
    seed: int = 0
    shards: int = Field(2, ge=1, description="Ray tasks that template and tokenize in parallel")
    check_sequences: int = Field(8, ge=0, description="held-out sequences the base model scores as a data check")
