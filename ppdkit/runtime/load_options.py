"""How a decoder is loaded, as one typed object: `Decoder.from_pretrained(source, options)` and `from_base(name,
options)` take a `LoadOptions` (or the same names by keyword), and the CLI, the bench and MLflow's pyfunc build one
instead of threading nine arguments through each layer. A misspelt option, or one that applies only to a component
when loading a base model alone (or the reverse), is refused by name."""

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .forward.dtypes import DTYPES
from .options import merged as merged_options


class LoadOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str = Field("auto", description="the weights' precision: auto, float32, bfloat16, gguf or q4 "
                                           "(runtime/forward/precision.py)")
    device: str = Field("cpu", description="where the model and drafts run (cuda: the PyTorch layers; the native "
                                           "kernels are CPU only)")
    fixed_shapes: bool | None = Field(None, description="steps of one shape (runtime/forward/fixed_shapes.py); "
                                                        "None: off the CPU only")
    max_length: int = Field(2048, ge=2, description="the most positions of a prompt and its answer")
    # a component's drafts
    tree_size: int | None = Field(None, ge=1, description="the calibrated tree nearest this size (default: the size "
                                                          "this machine's profile chose); grown trees this many nodes")
    lookup_chains: int = Field(1, ge=1, description="ppd-lookup's chains per step: the context's, then the n-gram "
                                                    "table's")
    dynamic_size: bool = Field(False, description="pick the tree size per step (runtime/trees/tree_sizer.py)")
    early_head: str | None = Field(None, description="an early-head component (a directory or models:/ URI) for the "
                                                     "pruning methods")
    prune_top_k: int = Field(8, ge=1, description="early pruning keeps a node whose token is among its parent's K "
                                                  "early guesses")
    # a base model alone
    skip_map: tuple[int, ...] | None = Field(None, description="Draft & Verify's skip map for `skip`: per decoder "
                                                               "layer 0 keep, 1 skip the attention, 2 the MLP, 3 both")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, dtype: str) -> str:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        return dtype

    @field_validator("early_head", "device", mode="before")
    @classmethod
    def _as_text(cls, value):  # a Path, a torch.device
        return None if value is None else str(value)


COMPONENT_ONLY = ("tree_size", "lookup_chains", "dynamic_size", "early_head", "prune_top_k")
BASE_ONLY = ("skip_map",)


def load_options(options: LoadOptions | None, overrides: dict, refused: tuple[str, ...] = (),
                 why: str = "") -> LoadOptions:
    """`options` (default: the defaults) with `overrides` applied; a ValueError naming an unknown option, a bad value,
    or one of `refused` set away from its default (`why` says what the caller loads)."""
    merged = merged_options(LoadOptions, options, overrides, "load",
                            "pass dtype, tree_size, ... by name, e.g. Decoder.from_pretrained(path, dtype='float32')")
    set_here = [name for name in refused if getattr(merged, name) != LoadOptions.model_fields[name].default]
    if set_here:
        raise ValueError(f"{', '.join(set_here)} cannot apply {why}")
    return merged
