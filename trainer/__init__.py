"""ppdkit.trainer"""

if __name__ != "ppdkit.trainer":  # the repo root on sys.path exposes this folder as a top-level module
    raise ImportError(f"{__name__!r} is ppdkit's trainer/ folder; install ppdkit and import ppdkit.trainer")
