"""The README and docs/ stay true to the tree: every relative link (and its #anchor) resolves, the README stays
short, and the generated picture is the one its script draws."""

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(markdown: str) -> set[str]:
    """The anchors a code host gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors, in_code = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_heading_anchors_follow_the_code_hosts_rule():
    assert heading_anchors("# Which method\n## `auto`, ar & co.\n```\n# not a heading\n```") == {
        "which-method", "auto-ar--co"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text()):
            broken.append(f"{target} (no heading with that anchor in {file.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("page, most", [("README.md", 150), ("docs/methods.md", 300), ("docs/devices.md", 300)])
def test_the_front_pages_stay_short(page, most):
    """The README is read in two minutes; methods.md and devices.md say how things work, not what was measured on a
    day (that is docs/history.md and the reports)."""
    lines = (ROOT / page).read_text().splitlines()
    assert len(lines) <= most, f"{page} has {len(lines)} lines (at most {most}): move detail into docs/ or a report"


def test_the_readme_links_every_docs_page():
    readme_links = {Path(t.partition("#")[0]).name for t in links(ROOT / "README.md")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= readme_links, f"docs pages the README does not link: {sorted(pages - readme_links)}"


def test_the_pipeline_picture_is_current():
    script = runpy.run_path(str(ROOT / "docs" / "tools" / "pipeline_picture.py"))
    assert script["main"](["--check"]) == 0, "run python docs/tools/pipeline_picture.py"


def test_a_changed_picture_is_called_stale(tmp_path):
    """--check reads the digest the PNG carries: another picture (here, one with no digest) fails it."""
    script = runpy.run_path(str(ROOT / "docs" / "tools" / "pipeline_picture.py"))
    other = tmp_path / "pipeline.png"
    import matplotlib.pyplot as plt

    plt.figure().savefig(other)
    assert not script["is_current"](other)
    assert script["is_current"](script["draw"](tmp_path / "redrawn.png"))


def test_check_exits_1_with_what_to_run_when_stale(tmp_path):
    """The script as a user runs it: a picture that is not current exits 1 and says the command."""
    code = ("import runpy, sys; s = runpy.run_path(sys.argv[1]); import pathlib; "
            "s['main'].__globals__['OUT'] = pathlib.Path(sys.argv[2]); sys.exit(s['main'](['--check']))")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "docs" / "tools" / "pipeline_picture.py"),
                           str(tmp_path / "missing.png")], capture_output=True, text=True)
    assert done.returncode == 1
    assert "python docs/tools/pipeline_picture.py" in done.stderr
