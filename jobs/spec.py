"""The job spec: one typed tree (pydantic, unknown keys rejected), read from YAML plus `key=value` overrides.

    ppdkit run jobs/configs/demo.yaml data.limit=64 base_model.quantization=none
"""

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from ppdkit.data_pipeline.config import DataConfig, TeacherConfig
from ppdkit.models.config import BaseModelConfig, Section
from ppdkit.registry.config import TrackingConfig
from ppdkit.trainer.config import CalibrateConfig, TrainConfig


class RayConfig(Section):
    address: str | None = Field(None, description="a running cluster ('auto' or host:port); default: an embedded local Ray")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for the embedded Ray (default: all)")
    object_store_mb: int = Field(512, ge=64, description="object store of the embedded Ray")


class EvaluateConfig(Section):
    prompts: str = Field("mt-bench", description="mt-bench | humaneval | FILE.jsonl")
    limit: int = Field(5, ge=1)
    max_new_tokens: int = Field(128, ge=1)
    methods: list[str] = Field(["hf-greedy", "ar", "ppd"], description="of hf-greedy, hf-pld, ar, ppd, ppd-lookup")


class JobSpec(Section):
    name: str = Field(description="the job's name: MLflow run name and default output folder")
    base_model: BaseModelConfig = BaseModelConfig()
    data: DataConfig = DataConfig()
    teacher: TeacherConfig = TeacherConfig()
    train: TrainConfig = TrainConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    tracking: TrackingConfig = TrackingConfig()
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def _name_is_a_folder_name(self) -> "JobSpec":
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name {self.name!r} must be a plain folder name")
        return self


class SpecError(ValueError):
    """A spec that cannot be used; the message says what is wrong and what is allowed."""


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def _explain(err: ValidationError, origin: str) -> SpecError:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(JobSpec, e["loc"])
            lines.append(f"unknown key '{key}'; allowed here: {', '.join(allowed)}")
        else:
            lines.append(f"'{key}': {e['msg']} (got {e.get('input')!r})")
    return SpecError(f"invalid job spec {origin}:\n  " + "\n  ".join(lines))


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.lr=0.01' -> (['train', 'lr'], 0.01); the value is read as YAML (numbers, true, null, lists)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"override {text!r} is not of the form key=value (e.g. data.limit=64)")
    return key.strip().split("."), yaml.safe_load(value) if value.strip() else ""


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError(f"override {text!r}: '{part}' is a value, not a section")
            node = child
        node[path[-1]] = value
    return raw


def load_spec(path: str | Path, overrides: list[str] = ()) -> JobSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"job spec {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(f"job spec {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"job spec {path} must be a mapping of sections, not {type(raw).__name__}")
    return spec_from_dict(apply_overrides(raw, list(overrides)), origin=str(path))


def spec_from_dict(raw: dict, origin: str = "(dict)") -> JobSpec:
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as e:
        raise _explain(e, origin) from None


def flatten(spec: BaseModel) -> dict[str, Any]:
    """{'data.limit': 512, ...}: the spec as MLflow params."""
    return _flatten_dict(spec.model_dump())


def _flatten_dict(d: dict) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in _flatten_dict(v).items()})
        else:
            out[k] = v
    return out
