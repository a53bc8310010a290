"""Writes docs/job-spec.md, the job-spec reference, from the pydantic models under ppdkit.jobs.spec.JobSpec.

    .venv/bin/python docs/tools/spec_reference.py           # write the page
    .venv/bin/python docs/tools/spec_reference.py --check   # exit 1 when the committed page is out of date

Each key's type, bounds, choices, default and description are read from the models (`model_fields`, their
annotations, `field.metadata`, `Field(description=...)`), so nothing here is written per key: a new key or a
changed bound reaches the page by rerunning this, and tests/test_docs_spec.py fails until someone does. A section
that is a union of models told apart by a key (train, by `method`) gets one table per class of its hierarchy: the
keys that class adds, under the values of the key whose sections have them.
"""

import json
import sys
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ppdkit.jobs.pipeline import STAGE_ORDER, STAGES
from ppdkit.jobs.spec import JobSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # page_check.py, beside this script
from page_check import page_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "job-spec.md"
RECIPES = ROOT / "ppdkit" / "jobs" / "configs"
COMMAND = "python docs/tools/spec_reference.py"
_SCALARS = {int: "int", float: "float", bool: "true or false"}


def _number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _bound(metadata: list, attr: str):
    return next((getattr(m, attr) for m in metadata if getattr(m, attr, None) is not None), None)


def _range(metadata: list) -> str:
    """' in (0, 1]', ' >= 1' or '' from pydantic's Gt/Ge/Lt/Le bounds."""
    gt, ge, lt, le = (_bound(metadata, attr) for attr in ("gt", "ge", "lt", "le"))
    low, high = (gt, "(") if gt is not None else (ge, "["), (lt, ")") if lt is not None else (le, "]")
    if low[0] is not None and high[0] is not None:
        return f" in {low[1]}{_number(low[0])}, {_number(high[0])}{high[1]}"
    if low[0] is not None:
        return f" {'>' if gt is not None else '>='} {_number(low[0])}"
    if high[0] is not None:
        return f" {'<' if lt is not None else '<='} {_number(high[0])}"
    return ""


def type_text(annotation, metadata: list = (), key: str = "?") -> str:
    """A reader's type: `int in [1, 16]`, `one of: mean | learned`, `list of int in [2, 1024] (1 or more)`,
    `int >= 1 or null`.
    Raises TypeError naming the key for an annotation this page cannot yet describe."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:  # a list item's own bounds: list[Annotated[int, Field(ge=2)]]
        inner, *infos = args
        return type_text(inner, [m for i in infos for m in (i.metadata if isinstance(i, FieldInfo) else [i])], key)
    if origin in (Union, UnionType):
        text = " or ".join(type_text(a, metadata, key) for a in args if a is not NoneType)
        if NoneType not in args:
            return text
        return f"null, or {text}" if "one of" in text else f"{text} or null"  # not read as one more choice
    if origin is Literal:
        return "one of: " + " | ".join(str(a) for a in args)
    if origin is list:
        item, least = type_text(args[0], (), key), _bound(metadata, "min_length")
        count = f" ({least} or more)" if least else ""
        return f"list{count}, each {item}" if item.startswith("one of") else f"list of {item}{count}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is str:
        return "non-empty text" if _bound(metadata, "min_length") else "text"
    if annotation in _SCALARS:
        return _SCALARS[annotation] + _range(metadata)
    raise TypeError(f"{key}: docs/tools/spec_reference.py cannot describe the type {annotation!r}; teach type_text "
                    "about it")


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return f"`{value if isinstance(value, str) and value else json.dumps(value)}`"  # YAML as a user writes it


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _is_section(field: FieldInfo) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) or bool(union_members(field))


def union_members(field: FieldInfo) -> list[type[BaseModel]]:
    """The models of a section that is a discriminated union of them (train: one per method), else []."""
    if field.discriminator is None or get_origin(field.annotation) not in (Union, UnionType):
        return []
    return list(get_args(field.annotation))


def _anchor(key: str) -> str:  # as a code host makes it from a heading: dots dropped, underscores kept
    return key.replace(".", "")


_HEADER = ["| key | type | default | description |", "|---|---|---|---|"]


def _row(key: str, field: FieldInfo, execution_only: bool = False) -> str:
    if not field.description:
        raise ValueError(f"{key} has no description: add Field(description=...) to its key in the model")
    if _is_section(field):
        kind, default = f"section, see [{key}](#{_anchor(key)})", ""
    else:
        kind, default = f"`{type_text(field.annotation, field.metadata, key)}`", default_text(field)
    described = field.description + (" (*execution only*)" if execution_only else "")
    return f"| `{key}` | {_cell(kind)} | {default} | {_cell(described)} |"


def _reruns(section: str) -> str:
    """Which stage a change of this section makes stale: the first whose recorded inputs hold it; the pipeline
    refuses it (and every later stage) on an existing output until it is redone with --force (ppdkit/jobs/pipeline.py)."""
    first = next((name for name in STAGE_ORDER if section in STAGES[name].sections), None)
    if first is None:
        return "No stage's output depends on it: a change needs no stage redone."
    later = STAGE_ORDER[STAGE_ORDER.index(first) + 1:]
    return (f"The {first} stage is made from it: on an existing output, a change is refused from that stage on "
            f"(use another `--output`, or `--stages {','.join([first, *later])} --force`).")


def _table(key: str, model: type[BaseModel], names) -> list[str]:
    return ["", *_HEADER, *(_row(f"{key}.{name}", model.model_fields[name], name in getattr(model, "execution_only", ()))
                            for name in names), ""]


def _tag(model: type[BaseModel], discriminator: str) -> str:
    return get_args(model.model_fields[discriminator].annotation)[0]


def _own_keys(model: type[BaseModel], discriminator: str) -> list[str]:
    """The keys `model` adds to (or redeclares from) its parent; the discriminator's row is the root's alone."""
    declared = model.__dict__.get("__annotations__", {})
    return [name for name in model.model_fields if name in declared and name != discriminator]


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _union_tables(key: str, field: FieldInfo, level: int) -> list[str]:
    """One table per class of the union's hierarchy, from the root every member shares down: the keys that class
    adds, headed by the tags (methods) whose sections have them."""
    members, tag = union_members(field), field.discriminator
    root = next(c for c in members[0].__mro__ if all(issubclass(m, c) for m in members))
    lines = [f"`{key}.{tag}` picks the section's keys: each table below holds the keys of the `{tag}` values it "
             f"names, and a key of no table naming the chosen one fails at load, naming the values that take it.", ""]

    def walk(model: type[BaseModel]) -> None:
        tags = [_tag(m, tag) for m in members if issubclass(m, model)]
        names = [n for n in model.model_fields] if model is root else _own_keys(model, tag)
        if names:
            title = f"every {tag}" if model is root else ", ".join(tags)
            lines.extend([f"{'#' * (level + 1)} {key}: {title}", "", _first_paragraph(model.__doc__),
                          *_table(key, model, names)])
        children = {c for m in members if issubclass(m, model) for c in m.__mro__ if c.__bases__[:1] == (model,)}
        for child in sorted(children, key=lambda c: min(i for i, m in enumerate(members) if issubclass(m, c))):
            walk(child)

    walk(root)
    return lines


def _section(key: str, field: FieldInfo, level: int) -> list[str]:
    """A heading, the field's description, and a table: of the section's keys, or of the one top-level value.
    Sections inside a section follow under their own, deeper headings."""
    if not _is_section(field):
        return [f"{'#' * level} {key}", "", *_HEADER, _row(key, field), ""]
    lines = [f"{'#' * level} {key}", "", f"{field.description[0].upper()}{field.description[1:]}."]
    if level == 2:
        lines.append(_reruns(key))
    if union_members(field):
        return [*lines, "", *_union_tables(key, field, level)]
    model = field.annotation
    lines += _table(key, model, model.model_fields)
    for name, sub in model.model_fields.items():
        if _is_section(sub):
            lines += _section(f"{key}.{name}", sub, level + 1)
    return lines


def _intro() -> list[str]:
    recipes = ", ".join(f"[{p.name}](../ppdkit/jobs/configs/{p.name})" for p in sorted(RECIPES.glob("*.yaml")))
    keys = ", ".join(f"[{name}](#{name})" for name in JobSpec.model_fields)
    return [
        "# Job-spec reference",
        "",
        f"<!-- Generated by docs/tools/spec_reference.py from the job spec's pydantic models: change a model's "
        f"Field(description=...) and run `{COMMAND}`, do not edit this page. -->",
        "",
        "A job spec is a YAML file of sections, read by `ppdkit run`, `ppdkit demo`, `ppdkit submit`, "
        "`ppdkit bench-insertion`, `bench-features` and `bench-online`. `key=value` overrides after the spec's path set "
        "one key each, in order (the last wins); the value is read as YAML (`64`, `0.5`, `true`, `null`, `[8, 16]`):",
        "",
        "```",
        "ppdkit run ppdkit/jobs/configs/demo.yaml data.limit=64 base_model.quantization=none",
        "```",
        "",
        "- Only `name` is required; every other key has the default below.",
        "- Every section refuses unknown keys: a misspelled key fails at load, and the message lists the keys "
        "allowed there. A value out of range fails with the range allowed.",
        "- The train section takes the keys of its `train.method` only (each method's are listed under "
        "[train](#train)): a key of another method fails at load, naming the methods that take it.",
        "- Each stage's output records the sections it was made from. Run the same spec on the same output with a "
        "key changed and the first stage made from it is refused, naming what changed (`OUTPUT/data was made from "
        "other inputs (data.limit: 64 -> 16)`): use another `--output`, or `--stages` that stage and the later ones "
        "with `--force`. Keys marked *execution only* change how a stage runs (parallelism, logging), never what it "
        "writes: a change to them alone is not refused. See [the pipeline](pipeline.md).",
        "- A run logs its whole spec to MLflow, as params (`data.limit`, ...) and as the artifact `spec.yaml`.",
        "",
        f"Recipes to start from, in [ppdkit/jobs/configs/](../ppdkit/jobs/configs/): {recipes}.",
        "",
        f"Top-level keys: {keys}.",
        "",
    ]


def render() -> str:
    lines = _intro()
    for name, field in JobSpec.model_fields.items():
        lines += _section(name, field, 2)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    return page_main(argv, __doc__, OUT, render, COMMAND, ROOT)


if __name__ == "__main__":
    sys.exit(main())
