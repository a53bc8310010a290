"""ppdkit.registry"""

if __name__ != "ppdkit.registry":  # the repo root on sys.path exposes this folder as a top-level module
    raise ImportError(f"{__name__!r} is ppdkit's registry/ folder; install ppdkit and import ppdkit.registry")
