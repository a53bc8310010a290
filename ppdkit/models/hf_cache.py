"""Running a transformers decoder on a key/value cache that ppdkit owns (the trainer's two-pass forwards).

transformers 5 renamed a forward's `past_key_values` argument, and its outputs' field, to `cache` (5.24, the release
installed here, has it); passing the old name warns with a FutureWarning on every call, and reading
`output.past_key_values` logs a deprecation line. So callers create the cache object themselves (a DynamicCache,
filled in place by the forward), hand it over by whichever name the installed forward declares, and read it from
their own variable, never from the output.
"""

import inspect

from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    """An empty DynamicCache laid out for `model`'s config (a causal LM or its decoder)."""
    return DynamicCache(config=model.config)


def cache_kwargs(module, cache: DynamicCache) -> dict:
    """{name: cache} with the name `module.forward` takes its key/value cache by: `cache` on transformers releases
    that have it, `past_key_values` on earlier 5.x ones (where it is the only name and does not warn)."""
    params = inspect.signature(module.forward).parameters  # follows transformers' decorators (functools.wraps)
    if "cache" in params:
        return {"cache": cache}
    if "past_key_values" in params:
        return {"past_key_values": cache}
    raise TypeError(f"{type(module).__name__}.forward takes neither `cache` nor `past_key_values`: this transformers "
                    "release is not one ppdkit supports (install transformers 5)")
