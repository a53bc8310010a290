"""What one `Decoder.generate` call asks for, as one typed object: the CLI, the bench, the server and MLflow's pyfunc
build a `GenerateOptions` and hand it over, instead of threading eight keyword arguments through each layer.

Like transformers' `generate(inputs, generation_config, **kwargs)`, a call may pass options, keyword overrides, or
both: `decoder.generate(prompt, max_new_tokens=64, method="ar")`. A misspelt option is refused by name."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .acceptance import ACCEPTANCE_RULES, Sampling
from .decoding_methods import get_method
from .options import merged as merged_options


class GenerateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(128, ge=1, description="new tokens at most (an end token stops sooner)")
    method: str = Field("ppd", description="a decoding method of runtime/decoding_methods.py, or auto")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy, token for token the base model's own")
    acceptance: Literal[ACCEPTANCE_RULES] = Field(
        "speculative", description="above temperature 0: speculative keeps the base model's distribution exactly; "
                                   "typical (epsilon, delta) accepts more guesses without that guarantee")
    epsilon: float = Field(0.09, gt=0.0, le=1.0, description="typical acceptance: the hard probability threshold")
    delta: float = Field(0.3, gt=0.0, le=1.0, description="typical acceptance: the entropy-scaled threshold factor")
    seed: int | None = Field(None, description="fixes a sampled answer's draws")
    truncate: Literal["left"] | None = Field(
        None, description="a prompt too long for max_new_tokens within max_length: refused (None) or cut to its last "
                          "tokens that fit (left)")

    @field_validator("method")
    @classmethod
    def _known_method(cls, name: str) -> str:
        get_method(name)  # raises naming the methods there are
        return name

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.acceptance, self.epsilon, self.delta)

    def with_overrides(self, **overrides) -> "GenerateOptions":
        """These options with some replaced, each checked as at construction."""
        return merged(self, overrides)


def merged(options: GenerateOptions | None, overrides: dict) -> GenerateOptions:
    """`options` (default: the defaults) with `overrides` applied; an unknown name or a bad value is a ValueError
    that names it and the options there are."""
    return merged_options(GenerateOptions, options, overrides, "generate",
                          "pass max_new_tokens and method by name, e.g. generate(prompt, max_new_tokens=64, "
                          "method='ar')")
