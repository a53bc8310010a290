"""ppdkit.jobs"""

if __name__ != "ppdkit.jobs":  # the repo root on sys.path exposes this folder as a top-level module
    raise ImportError(f"{__name__!r} is ppdkit's jobs/ folder; install ppdkit and import ppdkit.jobs")
