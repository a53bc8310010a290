"""What the decoder reads of a component's hyperparameters, typed per method and checked where the artifact is read.

component.json records every setting of the run that trained the component (its `hyperparameters`); a loader needs
only the few that shape its tensors and trees, and each kind of component needs others. Those are declared here, one
model per kind; the rest is kept in the file for people and ignored. What depends on the base model (a layer index
within its depth, a skip map's length) is checked by the loader that has the model."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .artifact import ArtifactError, Component
from .draft_heads import HEAD_KINDS


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # the run's other settings stay in the file, unread


class PromptTokenHyperparameters(_Read):
    """ept, ept-head: the prompt tokens' shape and attention among them."""

    num_prompt_tokens: int = Field(ge=1)  # k
    num_epts: int = Field(ge=1)  # n
    mask: Literal["ensemble", "decoder", "encoder"]


class HeadHyperparameters(_Read):
    """feature-head, medusa: which heads, and how many token distances they guess."""

    head_kind: Literal[HEAD_KINDS]
    head_depth: int = Field(ge=1)


class Eagle3Hyperparameters(_Read):
    """eagle3: the three base hidden states the draft fuses (Hugging Face's hidden_states index: after k layers)."""

    aux_layers: tuple[int, int, int]


class LayerSkipHyperparameters(_Read):
    """layer-skip, skip-finetune: per decoder layer 0 keep, 1 skip the attention, 2 the MLP, 3 both."""

    skip_map: tuple[Literal[0, 1, 2, 3], ...] = Field(min_length=1)


class EarlyHeadHyperparameters(_Read):
    """early-head: the decoder layers before the head (ProPD's n)."""

    early_layer: int = Field(ge=1)


HYPERPARAMETERS: dict[str, type[_Read]] = {
    "ept": PromptTokenHyperparameters, "ept-head": PromptTokenHyperparameters,
    "feature-head": HeadHyperparameters, "medusa": HeadHyperparameters,
    "eagle3": Eagle3Hyperparameters,
    "layer-skip": LayerSkipHyperparameters, "skip-finetune": LayerSkipHyperparameters,
    "early-head": EarlyHeadHyperparameters,
}


def read_hyperparameters(component: Component) -> _Read:
    """The hyperparameters the decoder needs of `component`, typed for its method; ArtifactError naming each missing
    or malformed key, and the file, otherwise."""
    kind = HYPERPARAMETERS.get(component.method)
    if kind is None:
        raise ArtifactError(f"{component.path}/component.json: method {component.method!r} is not a component the "
                            f"decoder reads (one of {', '.join(HYPERPARAMETERS)})")
    try:
        return kind.model_validate(component.hyperparameters)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'hyperparameters'}: {err['msg']}"
                             for err in e.errors())
        raise ArtifactError(f"{component.path}/component.json: the hyperparameters of a {component.method} component "
                            f"are not usable ({problems}); was it written by another ppdkit version? Train or export "
                            "it again") from None
