"""docs/tools/corpus_page.py: docs/corpus.md is generated from the committed corpus, measurements and draft history."""

import runpy
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "tools" / "corpus_page.py"


@pytest.fixture(scope="module")
def tool():
    return runpy.run_path(str(SCRIPT))


def _corpus_grown_since_commit() -> bool:
    """Whether the corpus's manifest differs from the committed one (a corpus job at work in this checkout)."""
    manifest = SCRIPT.parents[2] / "ppdkit" / "data_pipeline" / "corpora" / "smollm2-135m" / "corpus.json"
    done = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(manifest)], cwd=SCRIPT.parents[2],
                          capture_output=True)
    return done.returncode == 1


def test_the_committed_corpus_page_is_current(tool):
    if _corpus_grown_since_commit():
        pytest.skip("the corpus has grown since the last commit: the page is made again when its shards are committed")
    assert tool["main"](["--check"]) == 0, "docs/corpus.md is out of date: run python docs/tools/corpus_page.py"


def test_a_stale_page_exits_1_saying_what_to_run(tool, tmp_path, capsys):
    stale = tmp_path / "corpus.md"
    stale.write_text(tool["render"]().replace("| **all** |", "| all |"))
    original = tool["main"].__globals__["OUT"]
    tool["main"].__globals__["OUT"] = stale
    try:
        assert tool["main"](["--check"]) == 1
        assert "is out of date: run python docs/tools/corpus_page.py" in capsys.readouterr().err
    finally:
        tool["main"].__globals__["OUT"] = original
