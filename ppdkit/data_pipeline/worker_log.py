"""Ray workers' own lines (teacher actors, training ranks) go to a file in their stage's folder: the terminal
shows them only with --verbose (Ray's log_to_driver), Ray's dashboard and log files always."""

import logging
from pathlib import Path


def log_to_file(path: Path) -> None:
    """Add a file handler for ppdkit's loggers of this process, once per path (a reused process keeps one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger("ppdkit")
    if any(getattr(h, "baseFilename", None) == str(path.resolve()) for h in root.handlers):
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
