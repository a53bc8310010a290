"""ppdkit.runtime"""

if __name__ != "ppdkit.runtime":  # the repo root on sys.path exposes this folder as a top-level module
    raise ImportError(f"{__name__!r} is ppdkit's runtime/ folder; install ppdkit and import ppdkit.runtime")
