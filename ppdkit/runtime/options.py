"""What GenerateOptions and LoadOptions share: options given as an object, keywords, or both, checked as one."""

from pydantic import BaseModel, ValidationError


def merged(kind: type[BaseModel], options: BaseModel | None, overrides: dict, noun: str, example: str) -> BaseModel:
    """`options` (a `kind`; default: the defaults) with `overrides` applied. A ValueError names an unknown option (and
    the options there are) or a bad value; a TypeError says that `options` must be a `kind` (`example`: how to call
    by name instead)."""
    if options is not None and not isinstance(options, kind):
        raise TypeError(f"options must be a {kind.__name__}, not {type(options).__name__}: {example}")
    unknown = sorted(set(overrides) - set(kind.model_fields))
    if unknown:
        raise ValueError(f"unknown {noun} option(s) {', '.join(unknown)}; the options are "
                         f"{', '.join(kind.model_fields)}")
    try:
        return kind(**{**(options.model_dump() if options else {}), **overrides})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"bad {noun} option: {problems}") from None
