"""`ppdkit serve-bench` (ppdkit/bench/serving_load.py, serving_backends.py): the real `ppdkit serve` driven by 1 and 4
concurrent streamed clients gives a report of the documented shape whose answers equal the sequential ones; a peer
that is not installed is reported skipped with the make target that provides it; a user's mistakes get clear errors."""

import json
import runpy
import socket
from pathlib import Path

import pytest

from ppdkit.bench.decoding import load_prompts
from ppdkit.bench.serving_backends import ServeBenchSettings
from ppdkit.bench.serving_load import Answer, _proc_tree_rss, level_figures, parse_clients, run_serve_bench, tree_rss
from ppdkit.bench.serving_plot import plot_serving
from ppdkit.cli.main import main as ppdkit_main

FIGURE_BLOCKS = Path(__file__).resolve().parents[1] / "docs" / "tools" / "figure_blocks.py"
LEVEL_KEYS = {"clients", "requests", "errors", "completion_tokens", "wall_s", "tokens_per_s", "ttft_ms_p50",
              "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "latency_s_p50", "peak_rss_mib", "identical",
              "tokens_counted_by"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    work = tmp_path_factory.mktemp("serve-bench")
    settings = ServeBenchSettings(source="tiny-llama", base_only=True, method="ar", max_clients=4, max_tokens=8,
                                  vllm_python=work / "no-venv" / "bin" / "python",
                                  llama_server=work / "no-llama-server", work=work)
    return run_serve_bench(["ppdkit", "vllm", "llama.cpp"], settings, load_prompts("mt-bench", 3), "mt-bench", [1, 4],
                           command="ppdkit serve-bench --base tiny-llama --method ar --clients 1,4 --limit 3")


@pytest.mark.integration  # starts `ppdkit serve` in a process of its own
def test_the_real_server_at_1_and_4_clients_gives_the_sequential_answers(report):
    assert report["kind"] == "serving-load" and report["clients"] == [1, 4] and report["prompts"] == 3
    assert report["machine"]["cpu"] and report["date"] and report["command"].startswith("ppdkit serve-bench")
    ppdkit = report["servers"][0]
    assert ppdkit["name"] == "ppdkit" and ppdkit["status"] == "ran" and ppdkit["startup_s"] > 0
    assert [r["clients"] for r in ppdkit["levels"]] == [1, 4]
    for level in ppdkit["levels"]:
        assert LEVEL_KEYS <= set(level) <= LEVEL_KEYS | {"tokens_per_step"}  # no error, no draft counters here
        assert level["errors"] == 0 and level["tokens_per_s"] > 0 and level["peak_rss_mib"] > 0
        assert level["identical"] == level["requests"]  # tiny-llama greedy: every answer as at 1 client
        assert 0 < level["ttft_ms_p50"] <= level["ttft_ms_p99"] and level["tpot_ms_p50"] > 0
        assert level["tokens_counted_by"] == ["usage"]
    assert [r["requests"] for r in ppdkit["levels"]] == [3, 4]  # max(prompts, clients), the prompts in turn
    assert ppdkit["levels"][0]["completion_tokens"] == 3 * 8  # tiny-llama's random weights never end early


@pytest.mark.integration
def test_peers_that_are_not_installed_are_skipped_with_the_make_target(report):
    vllm, llama = report["servers"][1:]
    assert vllm["status"] == llama["status"] == "skipped"
    assert "vLLM's CPU build is not installed" in vllm["reason"] and "`make setup-vllm`" in vllm["reason"]
    assert vllm["provided_by"] == "make setup-vllm"
    assert "llama-server not found" in llama["reason"] and "`make setup-llama-server`" in llama["reason"]


@pytest.mark.integration
def test_the_report_renders_as_a_figures_block_and_a_plot(report, tmp_path):
    tool = runpy.run_path(str(FIGURE_BLOCKS))
    (tmp_path / "measurements").mkdir()
    (tmp_path / "measurements" / "load.json").write_text(json.dumps(report))
    text = tool["rewrite"]("<!-- figures: measurements/load -->\n<!-- /figures -->\n", tmp_path / "page.md", tmp_path)
    assert "| `ppdkit` | 4 |" in text and "/4 |" in text
    assert "Not run: `vllm` skipped" in text and "[report](measurements/load.json)" in text
    assert plot_serving(report, tmp_path / "load.png").stat().st_size > 0


def test_level_figures_from_answers():
    answers = [Answer(0, "a", 5, sent=0.0, first=0.1, done=0.5, counted="usage"),
               Answer(1, "b", 3, sent=0.0, first=0.3, done=0.5, counted="usage"),
               Answer(0, "changed", 5, sent=0.2, first=0.4, done=1.0, counted="usage"),
               Answer(1, "", 0, sent=0.2, first=None, done=0.3, counted="none", error="HTTP 503: busy")]
    row = level_figures(2, answers, 1.0, {0: "a", 1: "b"}, 3 * 2**20)
    assert row["completion_tokens"] == 13 and row["tokens_per_s"] == 13.0
    assert row["errors"] == 1 and row["first_error"] == "HTTP 503: busy"
    assert row["identical"] == 2 and row["requests"] == 4 and row["peak_rss_mib"] == 3.0
    assert row["ttft_ms_p50"] == pytest.approx(200.0)  # 100, 200, 300 ms
    assert row["tpot_ms_p50"] == pytest.approx(100.0)  # 400/4, 200/2, 600/4 ms
    assert row["latency_s_p50"] == pytest.approx(0.5)


def test_memory_from_proc_alone_is_what_psutil_reads_of_the_process_tree():
    """The /proc fallback sums the same processes as psutil: this one and its descendants (a test run before this one
    may have left children, a server or Ray's workers, and both count them)."""
    import os

    pytest.importorskip("psutil")
    assert _proc_tree_rss(os.getpid()) == pytest.approx(tree_rss(os.getpid()), rel=0.2)


def test_clients_are_positive_integers_with_1_first():
    assert parse_clients("16,4,64") == [1, 4, 16, 64]
    assert parse_clients("1,1,4") == [1, 4]
    for bad in ("0,4", "four", "", "-1"):
        with pytest.raises(ValueError, match="--clients takes comma-separated positive integers"):
            parse_clients(bad)


def _cli(argv: list[str]) -> int:
    return ppdkit_main(argv)


@pytest.mark.parametrize("flags, message", [
    (["--clients", "1,x"], "--clients takes comma-separated positive integers"),
    (["--servers", "ppdkit,tgi"], "unknown server kind(s) ['tgi']: use one or more of ppdkit, vllm, vllm-eagle3, "
                                  "llama.cpp"),
    (["--port", "70000"], "a port is 0 (pick a free one) or 1-65535"),
])
def test_a_bad_option_is_refused_by_name(flags, message, capsys):
    with pytest.raises(SystemExit) as ended:
        _cli(["serve-bench", "--base", "tiny-llama", *flags])
    assert ended.value.code == 2 and message in capsys.readouterr().err


def test_a_port_in_use_is_refused_before_anything_starts(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert _cli(["serve-bench", "--base", "tiny-llama", "--port", str(port)]) == 2
    assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err
