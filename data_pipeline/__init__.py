"""ppdkit.data_pipeline"""

if __name__ != "ppdkit.data_pipeline":  # the repo root on sys.path exposes this folder as a top-level module
    raise ImportError(f"{__name__!r} is ppdkit's data_pipeline/ folder; install ppdkit and import ppdkit.data_pipeline")
