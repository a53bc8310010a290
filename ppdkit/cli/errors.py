"""A refused write (a full, read-only or forbidden file system), found in an error however deeply a stage or a Ray
worker wrapped it, and said in one line with what to do."""

import errno
import os
from pathlib import Path


# A file system that refuses writes, and what to do about it. (Root ignores file permissions, so for
# root EACCES comes from mount options or special file systems; for others, from permissions.)
WRITE_PROBLEMS = {
    errno.ENOSPC: "Free space there or choose another --output",
    errno.EDQUOT: "Free space within your quota or choose another --output",
    errno.EROFS: "Choose an --output on a writable file system",
    errno.EACCES: "Choose an --output you may write to, or change its permissions",
}
# Writers that report the OS error only in their message (safetensors, Arrow): these phrases are
# specific enough to recognise there; "Permission denied" is not.
WRITE_PROBLEM_TEXTS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def write_problem(exc: BaseException) -> tuple[int, str | None] | None:
    """(errno, path or None) when `exc`, or an error it wraps, is a refused write (full, read-only,
    forbidden). Ray task and Ray Train errors carry the worker's exception."""
    chain, stack = [], [exc]
    while stack:
        e = stack.pop()
        if e is None or any(e is seen for seen in chain):
            continue
        chain.append(e)
        stack += [e.__cause__, e.__context__, getattr(e, "cause", None), getattr(e, "controller_failure", None)]
        stack += list((getattr(e, "worker_failures", None) or {}).values())  # Ray Train: {rank: exception}
    for e in chain:  # an OSError first: it names the file
        if isinstance(e, OSError) and e.errno in WRITE_PROBLEMS:
            return e.errno, e.filename
    for e in chain:
        for code in WRITE_PROBLEM_TEXTS:
            if os.strerror(code) in str(e):
                return code, None
    return None


def write_problem_message(code: int, path: str | None, output: Path | None) -> str:
    """The one line for a refused write: where (the command's output directory, when the file is in it), what the
    file system said, and what to do."""
    if output is not None and (path is None or Path(path).resolve().is_relative_to(output.resolve())):
        where = f"the output directory {output}"
    else:  # not the output (e.g. the cache), or a command without one
        where = f"{Path(path).parent}" if path else "a directory ppdkit writes to"
    writing = f" (writing {path})" if path and (output is None or Path(path) != output) else ""
    return (f"{where}: {os.strerror(code)}{writing}. {WRITE_PROBLEMS[code]}, then rerun the same command: "
            "finished stages are kept")
