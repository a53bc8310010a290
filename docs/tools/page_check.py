"""What the generated pages' tools share: write the page, or with --check say that the committed one is out of date."""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(out: Path, page: str, command: str, root: Path, check: bool) -> int:
    """Write `page` to `out` (0), or with `check` compare: 0 when the committed page is `page`, else 1 with the
    command that makes it."""
    shown = out.relative_to(root) if out.is_relative_to(root) else out
    if check:
        if not out.is_file() or out.read_text() != page:
            print(f"{shown} is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    print(f"wrote {shown}")
    return 0


def page_main(argv: list[str] | None, doc: str, out: Path, render: Callable[[], str], command: str, root: Path,
              pictures: Callable[[bool], list[str]] | None = None) -> int:
    """A page tool's command line: write the page, or --check it. `pictures(check)`, for a page with pictures:
    the names of those out of date (check), or of those it drew again (not check)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed page is out of date")
    check = parser.parse_args(argv).check
    status = write_or_check(out, render(), command, root, check)
    named = pictures(check) if pictures is not None else []
    if check and named:
        print(f"{', '.join(named)} out of date: run {command}", file=sys.stderr)
        return 1
    for name in named:
        print(f"wrote {name}")
    return status
