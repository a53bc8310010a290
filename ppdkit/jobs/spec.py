"""The job spec: one typed tree (pydantic, unknown keys rejected), read from YAML plus `key=value` overrides.

    ppdkit run ppdkit/jobs/configs/demo.yaml data.limit=64 base_model.quantization=none
"""

from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ppdkit.data_pipeline.config import DataConfig, TeacherConfig
from ppdkit.data_pipeline.corpus import corpus_source, has_committed_corpus
from ppdkit.data_pipeline.ray_placement import Placement
from ppdkit.data_pipeline.readers import ENDLESS_SOURCES
from ppdkit.models.config import BaseModelConfig, Section
from ppdkit.models.paths import shown
from ppdkit.registry.config import TrackingConfig
from ppdkit.runtime.forward.dtypes import DTYPES
from ppdkit.runtime.decoding_methods import COMPONENT_FREE, METHODS as DECODING_METHODS, Need

from ppdkit.bench.llama_cpp import LLAMA_METHODS
from ppdkit.trainer.config import (CLASS_OF_METHOD, CalibrateConfig, PromptTokenConfig, TrainSection, methods_taking,
                                   trains_online, with_default_method)


RECIPES = Path(__file__).parent / "configs"  # the job specs that ship with ppdkit

# The decoding methods `ppdkit bench` runs: transformers' two (bench/decoding.py) and the runtime's registry.
EvalMethod = Literal[("hf-greedy", "hf-pld", *DECODING_METHODS, *LLAMA_METHODS)]


class RayConfig(Section):
    address: str | None = Field(None, min_length=1,
                                description="a running cluster ('auto' or host:port); default: an embedded local Ray")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for the embedded Ray (default: all)")
    object_store_mb: int = Field(512, ge=64, description="object store of the embedded Ray")
    placement: Placement = Field(
        "spread", description="where the teacher's actors and the training ranks go on a cluster of several nodes: "
                              "spread puts them on different nodes where there is room (a lost node takes only its "
                              "share, restarted elsewhere), pack fills one node first")


class EvaluateConfig(Section):
    prompts: str = Field("mt-bench", min_length=1, description="mt-bench | humaneval | FILE.jsonl")
    limit: int = Field(5, ge=1, description="prompts decoded by every method")
    max_new_tokens: int = Field(128, ge=1, description="tokens every method decodes per prompt")
    dtype: Literal[DTYPES] = Field(
        "auto", description="the decoder's weight precision: auto is gguf where the base model has a GGUF and the "
                            "CPU AVX512-VNNI, else bfloat16 where the native kernels run (AVX-512 or AVX2 "
                            "with FMA), else float32 "
                            "(docs/devices.md)")
    tree_size: int | None = Field(
        None, ge=1, description="the tree size the tree methods decode with, one of calibrate.sizes (a fixed size "
                                "compares runs by their drafts alone); null: the size profiled as fastest here")
    methods: list[EvalMethod] | None = Field(
        None, min_length=1, description="the methods benchmarked, each named once (hf-*: transformers' generate); "
                                        "those needing a component must be ones train.method's component serves "
                                        "(a corpus method also needs base_model.name's committed corpus). "
                                        "Default: hf-greedy, ar, that component's decoding methods (the corpus "
                                        "ones where that corpus exists), auto")

    @field_validator("methods")
    @classmethod
    def _each_method_once(cls, methods: list[str] | None) -> list[str] | None:
        if methods is None:
            return methods
        twice = sorted({m for m in methods if methods.count(m) > 1})
        if twice:  # each would be timed again and reported as two rows of one name
            raise ValueError(f"lists {', '.join(twice)} more than once; name each method once")
        return methods


class JobSpec(Section):
    name: str = Field(description="the job's name: MLflow run name and default output folder")
    base_model: BaseModelConfig = Field(BaseModelConfig(), description="the frozen base model the component drafts "
                                                                       "for: trained against, decoded with")
    data: DataConfig = Field(DataConfig(), description="the conversations: source, held-out split, tokenization")
    teacher: TeacherConfig = Field(TeacherConfig(), description="the teacher pass: the base model's next-token "
                                                                "distributions over the data, on Ray actors")
    train: TrainSection = Field(PromptTokenConfig(), description="the training method and its hyperparameters "
                                "(DeepSpeed on Ray Train workers): the keys of train.method's own section")
    calibrate: CalibrateConfig = Field(CalibrateConfig(), description="per-distance acceptance on held-out data, the "
                                                                      "trees built from it, the n-gram table")
    evaluate: EvaluateConfig = Field(EvaluateConfig(), description="the decoding benchmark of the trained component")
    tracking: TrackingConfig = Field(TrackingConfig(), description="MLflow: the run, and the registered model the "
                                                                   "component becomes a version of")
    ray: RayConfig = Field(RayConfig(), description="the Ray cluster the stages run on")

    @model_validator(mode="before")
    @classmethod
    def _train_method_defaults_to_ept(cls, raw: Any) -> Any:
        # the train union picks its class by `method`, so a section that names none gets the default before
        if isinstance(raw, dict) and isinstance(raw.get("train"), dict):
            return {**raw, "train": with_default_method(raw["train"])}
        return raw

    @model_validator(mode="after")
    def _name_is_a_folder_name(self) -> "JobSpec":
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name {self.name!r} must be a plain folder name")
        return self

    @model_validator(mode="after")
    def _evaluated_methods_fit_the_component(self) -> "JobSpec":
        from ppdkit.trainer.config import PARALLEL_METHODS
        from ppdkit.trainer.training_methods import TRAINING_METHODS

        served = (*COMPONENT_FREE, *self.train.decoding_methods())
        # a corpus method drafts from the corpus that comes with a catalog base model, not from the component
        corpus = has_committed_corpus(self.base_model.name)

        def uncarried(m: str) -> bool:
            return not corpus and m in DECODING_METHODS and Need.CORPUS in DECODING_METHODS[m].needs

        if self.evaluate.methods is None:
            self.evaluate.methods = ["hf-greedy", "ar", *(m for m in self.train.decoding_methods() if not uncarried(m)),
                                     "auto"]
        unserved = [m for m in self.evaluate.methods if m in DECODING_METHODS and m not in served]
        if unserved:
            trainers = sorted({t.name for m in unserved for t in TRAINING_METHODS.values() if m in t.decoding_methods}
                              | ({"eagle3 and train.parallel_draft true"} if set(unserved) & set(PARALLEL_METHODS)
                                 else set()))
            fix = f"train with {' / '.join(trainers)}" if trainers else "run them with ppdkit bench"
            raise ValueError(f"evaluate.methods {unserved} cannot decode with what train.method={self.train.method} "
                             f"trains (its component serves {', '.join(served)}): drop them, or {fix}")
        if without := [m for m in self.evaluate.methods if uncarried(m)]:
            raise ValueError(f"evaluate.methods {without} need {Need.CORPUS.value}, and base_model.name "
                             f"{self.base_model.name!r} has none: drop them, or grow one first")
        return self

    @model_validator(mode="after")
    def _trees_fit_the_prompt_tokens(self) -> "JobSpec":
        if isinstance(self.train, PromptTokenConfig):  # the trees of the other methods hold no EPTs
            self.calibrate.check_epts(self.train.num_epts)
        return self

    @model_validator(mode="after")
    def _block_teacher_is_the_gguf_model(self) -> "JobSpec":
        from ppdkit.models.catalog import base_gguf
        from ppdkit.runtime.forward.dtypes import BLOCK_FORMATS, GGUF

        if self.teacher.compute_dtype not in BLOCK_FORMATS:
            return self
        if self.base_model.quantization != "none":
            raise ValueError(f"teacher.compute_dtype {self.teacher.compute_dtype} runs the teacher on the runtime's "
                             "4-bit blocks, which it makes from the unquantized model: set base_model.quantization "
                             "none")
        if self.teacher.compute_dtype == GGUF:
            try:
                base_gguf(self.base_model.name)
            except ValueError as error:
                raise ValueError(f"teacher.compute_dtype gguf: {error}; use q4 (the same format quantized from its "
                                 "weights)") from None
        return self

    @model_validator(mode="after")
    def _online_teacher_is_a_float_model(self) -> "JobSpec":
        from ppdkit.runtime.forward.dtypes import BLOCK_FORMATS

        if trains_online(self.train) and self.base_model.quantization != "none":
            raise ValueError(f"train.online computes the targets with the base model the trainer holds, which must be "
                             f"the model the decoder verifies with, not its {self.base_model.quantization} copy: set "
                             "base_model.quantization none")
        if trains_online(self.train) and self.teacher.compute_dtype in BLOCK_FORMATS:
            raise ValueError(f"train.online computes the targets with the base model the trainer holds, in a float "
                             f"dtype, not on {self.teacher.compute_dtype} blocks: set teacher.compute_dtype auto, "
                             "bfloat16 or float32")
        return self

    @model_validator(mode="after")
    def _written_prompts_are_answered(self) -> "JobSpec":
        if self.data.source in ENDLESS_SOURCES and not self.teacher.regenerate:
            raise ValueError(f"data.source {self.data.source} holds only prompts for the base model to write, and the "
                             "teacher's regeneration writes them and their answers: set teacher.regenerate true")
        if corpus_source(self.data.source, self.base_model.name) is not None and self.teacher.regenerate:
            raise ValueError("data.source is a corpus: its answers are the base model's own already (ppdkit corpus "
                             "grow wrote them) and its rows keep no text to rewrite: set teacher.regenerate false")
        return self

    @model_validator(mode="after")
    def _evaluated_tree_is_calibrated(self) -> "JobSpec":
        if self.evaluate.tree_size is not None and self.evaluate.tree_size not in self.calibrate.sizes:
            raise ValueError(f"evaluate.tree_size {self.evaluate.tree_size} is not one of calibrate.sizes "
                             f"{self.calibrate.sizes}: only calibrated trees exist")
        return self


class SpecError(ValueError):
    """A spec that cannot be used; the message says what is wrong and what is allowed."""


def _section_model(field: Any, method: str | None) -> type[BaseModel] | None:
    """The model of a spec field that is a section: its class, or for train the class of the method named."""
    annotation = getattr(field, "annotation", None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return CLASS_OF_METHOD.get(method) if field is JobSpec.model_fields["train"] else None


def _allowed_keys(loc: tuple) -> list[str]:
    model: type[BaseModel] | None = JobSpec
    for part in loc[:-1]:
        model = _section_model(model.model_fields.get(str(part)), None)
        if model is None:
            return []
    return sorted(model.model_fields)


def _user_loc(loc: tuple) -> tuple[tuple, str | None]:
    """(the key's place as a user writes it, the train method whose class pydantic validated it in): pydantic puts
    the union's tag after 'train', ('train', 'ept', 'lr'), where the spec has train.lr."""
    if len(loc) > 1 and loc[0] == "train" and loc[1] in CLASS_OF_METHOD:
        return ("train", *loc[2:]), loc[1]
    return tuple(loc), None


def _not_taken(key: str, method: str) -> str:
    """A train key that train.method's section does not have: which methods take it, and what this one takes."""
    owners = methods_taking(key.rsplit(".", 1)[-1])
    where = f"it is a key of {', '.join(owners)}" if owners else "no training method takes it"
    return (f"'{key}' does not apply to train.method {method}: {where}. {method} takes: "
            f"{', '.join(sorted(CLASS_OF_METHOD[method].model_fields))}")


def _key(loc: tuple) -> str:
    """('calibrate', 'sizes', 0) -> 'calibrate.sizes[0]': the key as a user writes it."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _non_null(annotation: Any) -> Any:
    """list[int] from `list[int] | None`: an optional value's own type."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if get_origin(annotation) in (Union, UnionType) and len(args) == 1 else annotation


def _constraints(loc: tuple, method: str | None) -> tuple[list, str | None]:
    """The bounds and description of the spec value at `loc` (in train: of `method`'s key); a list index steps
    into the list's item type, whose own bounds apply to each item."""
    model, annotation, metadata, description = JobSpec, None, [], None
    for part in loc:
        if isinstance(part, int):
            item = next(iter(get_args(_non_null(annotation))), None)
            annotation = get_args(item)[0] if get_origin(item) is Annotated else item
            metadata = [m for info in getattr(item, "__metadata__", ()) for m in getattr(info, "metadata", [info])]
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return [], None
        annotation, metadata, description = field.annotation, field.metadata, field.description
        model = _section_model(field, method)
    return metadata, description


def _allowed_range(name: str, metadata: list) -> str | None:
    """'0 < train.lr <= 1' from the field's bounds (pydantic keeps them as annotated_types Gt, Ge, Lt, Le)."""
    def bound(attr: str):
        return next((getattr(m, attr) for m in metadata if getattr(m, attr, None) is not None), None)

    def text(x) -> str:  # 1.0 as 1, as a user would write it
        return f"{x:g}" if isinstance(x, float) else str(x)

    gt, ge, lt, le = (bound(attr) for attr in ("gt", "ge", "lt", "le"))
    low = f"{text(gt)} < " if gt is not None else f"{text(ge)} <= " if ge is not None else ""
    high = f" < {text(lt)}" if lt is not None else f" <= {text(le)}" if le is not None else ""
    return f"{low}{name}{high}" if low or high else None


_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _explain_one(e: dict) -> str:
    loc, method = _user_loc(e["loc"])
    key = _key(loc)
    if e["type"] == "extra_forbidden" and method is not None:
        return _not_taken(key, method)
    if e["type"] == "extra_forbidden":
        return f"unknown key '{key}'; allowed here: {', '.join(_allowed_keys(loc))}"
    if e["type"] == "union_tag_invalid":  # the train section's method
        return f"'{key}.method' = {e['ctx']['tag']!r} is not a training method; allowed: {e['ctx']['expected_tags']}"
    if e["type"] == "missing":
        return f"'{key}' is required"
    if e["type"] == "value_error":  # our validators' messages name their keys and say what to do
        message = e["msg"].removeprefix("Value error, ")
        return f"'{key}' {message} (got {e.get('input')!r})" if key else message
    metadata, description = _constraints(loc, method)
    allowed = _allowed_range(key, metadata)
    if e["type"] in _BOUND_ERRORS and allowed:
        line = f"'{key}' = {e.get('input')!r} is out of range: allowed {allowed}"
        return f"{line}; {description}" if description else line
    hint = "; write a YAML list, e.g. [a, b]" if e["type"] == "list_type" else ""
    return f"'{key}': {e['msg']} (got {e.get('input')!r}{hint})"


def _explain(err: ValidationError, origin: str) -> SpecError:
    lines = [_explain_one(e) for e in err.errors()]
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
        recipe = RECIPES / path.name
        hint = f"; the recipe of that name ships with ppdkit: {shown(recipe)}" if recipe.is_file() else ""
        raise SpecError(f"job spec {path} does not exist{hint}")
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


def run_tags(spec: "JobSpec") -> dict[str, str]:
    """The MLflow run's tags: what it trains, for which base model, from which spec and ppdkit commit, and a
    description (the run page's text, `mlflow.note.content`)."""
    from ppdkit.registry.tracking import ppdkit_commit

    commit = ppdkit_commit()
    limit = "all" if spec.data.limit is None else spec.data.limit
    note = (f"ppdkit job `{spec.name}`: train.method **{spec.train.method}** for base model "
            f"**{spec.base_model.name}** ({spec.base_model.quantization}, {spec.base_model.dtype}) on "
            f"{spec.data.source} ({limit} rows). Stages: data, teacher, train, calibrate, evaluate "
            f"({spec.evaluate.prompts}, {spec.evaluate.limit} prompts), register. The spec is the artifact "
            "`spec.yaml`; stage figures are metrics named by stage (`data.*`, `teacher.*`, `train.*`, `eval.*`, "
            "`calibrate.*`, `evaluate.*`).")
    return {"method": spec.train.method, "base_model": spec.base_model.name, "spec": spec.name,
            "mlflow.note.content": note, **({"ppdkit.commit": commit} if commit else {})}


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
