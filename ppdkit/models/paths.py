"""Where ppdkit keeps large rebuilt files (converted weights, data, caches, mlruns): never the repo."""

import hashlib
import json
import os
import shutil
from pathlib import Path


def cache_dir() -> Path:
    """`$PPDKIT_CACHE`, else `$XDG_CACHE_HOME/ppdkit`, else `~/.cache/ppdkit`."""
    if env := os.environ.get("PPDKIT_CACHE"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ppdkit"


def atomic_dir_swap(tmp: Path, final: Path) -> Path:
    """Publish a fully written `tmp` directory as `final` in one rename, so a crash never leaves half a model."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process published a complete copy first
    return final


def write_json_atomic(path: Path, data: dict) -> None:
    """Write JSON to a temporary file, then rename: readers see the old file or the new one, never half."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shown(path: Path) -> str:
    """`path` relative to the working directory where it lies below it (a checkout), else whole (an installed
    wheel): how an error names a file that ships with ppdkit."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
