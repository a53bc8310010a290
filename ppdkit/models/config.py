"""Config sections are pydantic models that reject unknown keys; each folder owns the section it reads."""

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # Keys that change how a stage runs (parallelism), never what it writes: a change of them alone
    # does not make a finished stage's output stale.
    execution_only: ClassVar[frozenset[str]] = frozenset()


class BaseModelConfig(Section):
    name: str = Field("smollm2-135m", min_length=1, description="catalog name (smollm2-135m, tiny-llama) or a local HF model directory")
    quantization: Literal["nf4", "none"] = Field("nf4", description="how the FROZEN base is held: 4-bit NF4 or as saved")
    dtype: Literal["float32", "bfloat16", "float64"] = Field(
        "float32", description="dtype the base model is loaded in (with nf4: the compute dtype of its 4-bit layers)")
