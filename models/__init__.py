"""ppdkit.models"""

if __name__ != "ppdkit.models":  # the repo root on sys.path exposes this folder as a top-level module
    raise ImportError(f"{__name__!r} is ppdkit's models/ folder; install ppdkit and import ppdkit.models")
