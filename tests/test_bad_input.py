"""Bad input gets a clear error or a counted skip: never a traceback from deep inside, never lost rows.

Job-spec values out of range are refused at load, naming the key and the allowed range; data files that
are empty, not UTF-8, truncated or hold 1 MB messages are read row by row, every unusable row counted
by reason, and a file with nothing usable is an error that names it and the form expected.
"""

import gzip
import json
import os
from typing import get_args

import pytest
import yaml
from pydantic import ValidationError

from conftest import FIXTURES, free_port
from ppdkit.data_pipeline.config import DataConfig, TeacherConfig
from ppdkit.data_pipeline.conversations import Conversation, MalformedRow, to_conversation
from ppdkit.data_pipeline.data_stage import run_data_stage, tokenize_shard
from ppdkit.data_pipeline.readers import NOT_UTF8, DataSourceError, read_conversations
from ppdkit.bench.decoding import load_prompts
from ppdkit.cli.main import main
from ppdkit.jobs.spec import EvalMethod, SpecError, load_spec, spec_from_dict
from ppdkit.models.config import BaseModelConfig
from ppdkit.runtime.trees.tree import best_tree_for_size
from ppdkit.serving.requests import ChatRequest, RequestError, ServeLimits, generate_options
from ppdkit.trainer.config import CalibrateConfig

MB = 1 << 20
ONE_MB_TEXT = ("The quick brown fox jumps over the lazy dog; " * (MB // 45 + 1))[:MB]


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\n")
    return path


# --- the job spec: (override, words the error must hold: the key and the allowed range) ---

OUT_OF_RANGE = [
    ("train.num_prompt_tokens=0", ["'train.num_prompt_tokens' = 0", "allowed 1 <= train.num_prompt_tokens <= 16"]),
    ("train.num_prompt_tokens=17", ["'train.num_prompt_tokens' = 17", "allowed 1 <= train.num_prompt_tokens <= 16"]),
    ("teacher.top_k=0", ["'teacher.top_k' = 0", "allowed 1 <= teacher.top_k", "vocabulary"]),
    ("calibrate.sizes=[]", ["'calibrate.sizes'", "at least 1 item"]),
    ("calibrate.sizes=[1,8]", ["'calibrate.sizes[0]' = 1", "allowed 2 <= calibrate.sizes[0] <= 1024"]),
    ("calibrate.sizes=[8,4096]", ["'calibrate.sizes[1]' = 4096", "<= 1024"]),
    ("train.lr=0", ["'train.lr' = 0", "allowed 0 < train.lr <= 1"]),
    ("train.lr=-0.01", ["'train.lr' = -0.01", "allowed 0 < train.lr <= 1"]),
    ("train.lr=5", ["'train.lr' = 5", "allowed 0 < train.lr <= 1"]),
    ("train.alpha=0", ["'train.alpha' = 0", "allowed 0 < train.alpha <= 1"]),
    ("train.alpha=1.5", ["'train.alpha' = 1.5", "allowed 0 < train.alpha <= 1"]),
    ("train.weight_decay=-1", ["'train.weight_decay' = -1", "allowed 0 <= train.weight_decay"]),
    ("train.method=eagle", ["'train.method'", "'ept'", "'medusa'", "eagle"]),
    ("train.init_token_ids=[1,2]", ["'train.init_token_ids'", "3 * 1 = 3 token ids, not 2"]),
    ("evaluate.methods=[ppd,eagle]", ["'evaluate.methods[1]'",
                                      "'hf-greedy', 'hf-pld', 'ar', 'auto', 'anpd', 'self-draft', 'skip', 'skip-ft', 'ppd', "
                                      "'ppd-lookup', 'ppd-corpus', 'ppd-head', "
                                      "'feature-head', 'feature-grown', 'feature-grown-anpd', 'eagle3', 'eagle3-anpd', "
                                      "'eagle3-corpus', 'eagle3-ppd', 'eagle3-ppd-corpus', 'medusa', 'ppd-prune', "
                                      "'feature-head-prune', 'medusa-prune', 'llama.cpp', 'llama.cpp-lookup', "
                                      "'llama.cpp-q4', 'llama.cpp-server' or 'llama.cpp-eagle3'",
                                      "'eagle'"]),
    ("evaluate.methods=[]", ["'evaluate.methods'", "at least 1 item"]),
    ("evaluate.methods=ppd", ["'evaluate.methods'", "valid list", "write a YAML list"]),
    ("evaluate.methods=[ar,ppd,ar]", ["'evaluate.methods' lists ar more than once"]),
    ("evaluate.limit=0", ["'evaluate.limit' = 0", "allowed 1 <= evaluate.limit"]),
    ("evaluate.max_new_tokens=0", ["'evaluate.max_new_tokens' = 0", "allowed 1 <= evaluate.max_new_tokens"]),
    ("data.holdout=1", ["'data.holdout' = 1", "allowed 0 <= data.holdout < 1"]),
    ("data.max_length=4", ["'data.max_length' = 4", "allowed 8 <= data.max_length"]),
    ("data.limit=0", ["'data.limit' = 0", "allowed 1 <= data.limit"]),
    ("data.source=", ["'data.source'", "at least 1 character"]),
    ("tracking.experiment=", ["'tracking.experiment'", "at least 1 character"]),
]


@pytest.mark.parametrize("override,words", OUT_OF_RANGE, ids=[o for o, _ in OUT_OF_RANGE])
def test_out_of_range_value_names_the_key_and_the_allowed_range(job, override, words):
    with pytest.raises(SpecError) as err:
        load_spec(job, [override])
    message = str(err.value)
    assert message.startswith(f"invalid job spec {job}:")
    for word in words:
        assert word in message


def test_tree_sizes_must_hold_the_root_and_one_prompt_tokens_epts(job):
    with pytest.raises(SpecError) as err:
        load_spec(job, ["train.num_epts=3", "calibrate.sizes=[2,3,4,8]"])
    message = str(err.value)
    assert "calibrate.sizes [2, 3]" in message and "train.num_epts=3" in message and ">= 4" in message
    spec = load_spec(job, ["train.num_epts=3", "calibrate.sizes=[4,8]"])
    assert spec.calibrate.sizes == [4, 8]


def test_the_evaluated_tree_size_must_be_a_calibrated_one(job):
    with pytest.raises(SpecError, match=r"evaluate.tree_size 12 is not one of calibrate.sizes \[4, 8\]"):
        load_spec(job, ["calibrate.sizes=[4,8]", "evaluate.tree_size=12"])
    assert load_spec(job, ["calibrate.sizes=[4,8]", "evaluate.tree_size=8"]).evaluate.tree_size == 8


@pytest.mark.parametrize("epts", [1, 2, 5])
def test_the_size_check_is_exactly_what_the_tree_builder_needs(epts):
    acceptance = [[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]]  # 3 distances x 3 ranks
    for size in range(2, 2 * epts + 8):
        try:
            CalibrateConfig(sizes=[size]).check_epts(epts)
            accepted = True
        except ValueError:
            accepted = False
        if accepted:
            assert best_tree_for_size(acceptance, size, epts).size <= size
        else:
            with pytest.raises(ValueError, match="no tree fits"):
                best_tree_for_size(acceptance, size, epts)


def test_every_error_of_a_spec_is_listed_at_once():
    with pytest.raises(SpecError) as err:
        spec_from_dict({"name": "x", "train": {"lr": 5, "alpha": 0}, "teacher": {"top_k": 0}})
    keys = [line.split("'")[1] for line in str(err.value).splitlines()[1:]]
    assert sorted(keys) == ["teacher.top_k", "train.alpha", "train.lr"]


def test_cli_prints_the_range_and_exits_2(job, tmp_path, capsys):
    assert main(["run", str(job), "train.lr=5", "calibrate.sizes=[1]", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "ppdkit: error: invalid job spec" in err
    assert "'train.lr' = 5 is out of range: allowed 0 < train.lr <= 1" in err
    assert "'calibrate.sizes[0]' = 1 is out of range: allowed 2 <= calibrate.sizes[0] <= 1024" in err
    assert "Traceback" not in err


def test_a_missing_job_api_is_said_in_one_line_without_loading_torch(tmp_path):
    """`ppdkit jobs` (like submit and ui) only talks to a server: it must not pay torch's import to say so."""
    import subprocess
    import sys

    nowhere = f"http://127.0.0.1:{free_port()}"
    code = ("import sys; from ppdkit.cli.main import main; "
            f"rc = main(['jobs', 'list', '--address', '{nowhere}']); print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.stdout.split()[-2:] == ["2", "False"], out.stderr[-2000:]
    assert "no Ray job API" in out.stderr and "Traceback" not in out.stderr


def test_verbose_after_the_command_is_taken_not_refused(tmp_path):
    """`ppdkit jobs list ... --verbose` turns debug logging on, as `ppdkit --verbose jobs list ...` does."""
    import subprocess
    import sys

    nowhere = f"http://127.0.0.1:{free_port()}"
    code = ("import logging; from ppdkit.cli.main import main; "
            f"rc = main(['jobs', 'list', '--address', '{nowhere}', '--verbose']); "
            "print(rc, logging.getLogger().level == logging.DEBUG)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "unrecognized arguments" not in out.stderr
    assert out.stdout.split()[-2:] == ["2", "True"], out.stderr[-2000:]


def test_the_spec_knows_every_method_the_bench_runs():
    from ppdkit.bench.decoding import ALL_METHODS

    assert set(get_args(EvalMethod)) == set(ALL_METHODS)


def test_top_k_beyond_the_vocabulary_is_refused_before_any_teacher_work(tiny_dir):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_dir).vocab_size
    TeacherConfig(top_k=vocab).check_vocabulary(vocab)  # the whole vocabulary is allowed
    with pytest.raises(ValueError) as err:
        TeacherConfig(top_k=vocab + 1).check_vocabulary(vocab)
    assert f"teacher.top_k={vocab + 1}" in str(err.value) and f"between 1 and {vocab}" in str(err.value)


def test_max_length_beyond_the_model_context_is_refused_before_reading(tmp_path):
    with pytest.raises(ValueError, match=r"data.max_length=4096 is longer than the base model's context of 1024 "
                                         r"positions: set data.max_length between 8 and 1024"):
        run_data_stage(BaseModelConfig(name="tiny-llama", quantization="none"),
                       DataConfig(source=str(FIXTURES / "bad_empty.jsonl"), max_length=4096), tmp_path / "data")


# --- data files ---

def _expect_no_usable_data(path, *words):
    with pytest.raises(DataSourceError) as err:
        read_conversations(str(path), require_assistant=True)
    message = str(err.value)
    assert str(path) in message and "Expected one JSON object per line" in message and "assistant turn" in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("content", [b"", b"\n  \n\t\n"], ids=["empty", "blank lines"])
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_an_empty_file_is_an_error_naming_it_and_the_form(tmp_path, content, suffix):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(content)
    _expect_no_usable_data(path, "is empty")


def test_the_empty_fixture_stops_the_data_stage_before_any_work(tmp_path):
    path = FIXTURES / "bad_empty.jsonl"
    with pytest.raises(DataSourceError, match="bad_empty.jsonl' is empty"):
        run_data_stage(BaseModelConfig(name="tiny-llama", quantization="none"), DataConfig(source=str(path)),
                       tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_bad_rows_are_skipped_and_counted_by_reason():
    convs, report = read_conversations(str(FIXTURES / "bad_mixed.jsonl"), require_assistant=True)
    assert [c.id for c in convs] == ["ok1", "ok2", "ok3"]
    assert report.rows == 5 and report.kept == 3
    assert report.skipped == {NOT_UTF8: 1, "invalid JSON (Unterminated string starting at)": 1}
    assert report.examples == [f"line 3: {NOT_UTF8}", "line 6: invalid JSON (Unterminated string starting at)"]
    assert not any("\ufffd" in m["content"] for c in convs for m in c.messages)  # nothing decoded by guesswork


def test_a_not_utf8_item_of_a_json_array_is_skipped_alone(tmp_path):
    items = [{"id": f"i{k}", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
             for k in range(3)]
    raw = json.dumps(items).encode().replace(b'"id": "i1"', b'"id": "i\xff1"')
    path = tmp_path / "data.json"
    path.write_bytes(raw)
    convs, report = read_conversations(str(path))
    assert [c.id for c in convs] == ["i0", "i2"] and report.skipped == {NOT_UTF8: 1}


def test_a_utf16_file_is_an_error_saying_it_is_not_utf8():
    _expect_no_usable_data(FIXTURES / "bad_utf16.jsonl", "no usable conversation in", "line 1: not UTF-8 text",
                           "4 rows, 0 kept, 4 skipped")


def test_a_utf8_bom_is_not_a_problem(tmp_path):
    path = tmp_path / "bom.jsonl"
    text = (FIXTURES / "bad_mixed.jsonl").read_bytes().split(b"\n")[0]
    path.write_bytes(b"\xef\xbb\xbf" + text + b"\n")
    convs, report = read_conversations(str(path))
    assert [c.id for c in convs] == ["ok1"] and not report.skipped


def test_binary_garbage_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "weights.jsonl"
    path.write_bytes(bytes(range(256)) * 64)
    _expect_no_usable_data(path, "no usable conversation in", NOT_UTF8)


def test_truncated_json_array_keeps_the_complete_items():
    convs, report = read_conversations(str(FIXTURES / "bad_truncated.json"), require_assistant=True)
    assert [c.id for c in convs] == ["ok1", "ok2"]
    [reason] = report.skipped
    assert report.rows == 3 and reason.startswith("unparseable JSON") and "truncated?" in reason


def test_a_json_array_truncated_in_its_first_item_is_an_error(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[{"id": "a", "conversations": [{"from": "human", "val')
    _expect_no_usable_data(path, "unparseable JSON", "truncated?")


def test_a_json_object_instead_of_an_array_is_an_error(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}))
    _expect_no_usable_data(path, "file is not a JSON array")


def test_truncated_gzip_keeps_the_lines_before_the_cut(tmp_path):
    rows = [{"id": f"r{k}", "conversations": [{"from": "human", "value": f"question {k} " * 20},
                                              {"from": "gpt", "value": f"answer {k} " * 20}]} for k in range(2000)]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    convs, report = read_conversations(str(path))
    assert 0 < len(convs) < 2000 and [c.id for c in convs] == [f"r{k}" for k in range(len(convs))]
    reason = "gzip data ends early or is damaged (file truncated?)"
    assert report.skipped == {reason: 1}
    assert report.rows == len(convs) + 1 and report.examples == [f"line {len(convs) + 1}: {reason}"]


def test_a_plain_file_named_gz_is_an_error(tmp_path):
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes((FIXTURES / "bad_mixed.jsonl").read_bytes())
    _expect_no_usable_data(path, "not gzip data")


class _CharCounter:
    """The tokenizer, noting the longest text it was asked to tokenize."""

    def __init__(self, tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, len(text))
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_one_mb_messages_are_cut_to_max_length_without_tokenizing_megabytes(tmp_path, tiny_tokenizer):
    rows = [{"id": "small", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
            {"id": "big-answer", "messages": [{"role": "user", "content": "Write a lot."},
                                              {"role": "assistant", "content": ONE_MB_TEXT}]},
            {"id": "big-question", "messages": [{"role": "user", "content": ONE_MB_TEXT},
                                                {"role": "assistant", "content": "Too long to read."}]}]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs, report = read_conversations(str(path), require_assistant=True)
    assert report.kept == 3 and len(convs[1].messages[1]["content"]) == MB

    counter = _CharCounter(tiny_tokenizer)
    encoded, shard_report = tokenize_shard(counter, convs, max_length=64)
    assert [r.id for r in encoded] == ["small", "big-answer"]
    assert shard_report.skipped == {"no assistant tokens within max_length=64": 1}
    assert counter.longest < 10_000  # a prefix that holds 64 tokens, not the megabyte
    big = encoded[1]
    text = tiny_tokenizer.apply_chat_template(list(convs[1].messages), tokenize=False)
    assert big.input_ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"][:64]  # as if cut after
    assert len(big.input_ids) == 64 and 0 < sum(big.loss_mask) < 64


def test_the_data_stage_counts_every_skip_in_its_summary(ray_local, tmp_path):
    path = tmp_path / "mixed.jsonl"
    big = {"id": "big-question", "messages": [{"role": "user", "content": ONE_MB_TEXT},
                                              {"role": "assistant", "content": "Too long to read."}]}
    path.write_bytes((FIXTURES / "bad_mixed.jsonl").read_bytes() + b"\n" + json.dumps(big).encode() + b"\n")
    summary = run_data_stage(BaseModelConfig(name="tiny-llama", quantization="none"),
                             DataConfig(source=str(path), limit=None, max_length=64, holdout=0.0, shards=2,
                                        check_sequences=1), tmp_path / "data")
    assert summary["read"]["rows"] == 6 and summary["read"]["kept"] == 4
    # the cut line now ends in a newline inside its string
    assert summary["read"]["skipped_by_reason"] == {NOT_UTF8: 1, "invalid JSON (Invalid control character at)": 1}
    assert summary["templating"]["train"]["skipped_by_reason"] == {"no assistant tokens within max_length=64": 1}
    assert summary["train_sequences"] == 3


def test_cli_names_a_file_with_nothing_usable_and_exits_2(ray_local, tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "base_model": {"name": "tiny-llama", "quantization": "none"},
                                    "data": {"source": str(FIXTURES / "bad_utf16.jsonl")},
                                    "tracking": {"enabled": False}}))
    assert main(["run", str(spec), "--stages", "data", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"ppdkit: error: no usable conversation in {FIXTURES / 'bad_utf16.jsonl'}" in err
    assert "line 1: not UTF-8 text" in err and "Expected one JSON object per line" in err
    assert "Traceback" not in err and not (tmp_path / "out" / "data" / "summary.json").exists()


def test_the_job_api_address_given_is_the_one_used(monkeypatch):
    """Ray's job client lets RAY_API_SERVER_ADDRESS / RAY_ADDRESS override the address it is given (an
    embedded Ray's processes carry the former): `--address` must win, and the environment stay as it was."""
    from ppdkit.jobs.submit import client

    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:1")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:3")
    with pytest.raises(ConnectionError) as refused:
        client("http://127.0.0.1:2")
    assert "Failed to connect to Ray at address: http://127.0.0.1:2" in str(refused.value)
    assert os.environ["RAY_API_SERVER_ADDRESS"] == "http://127.0.0.1:1" and os.environ["RAY_ADDRESS"] == "127.0.0.1:3"


def test_a_head_method_evaluated_without_a_head_is_refused(job):
    with pytest.raises(SpecError, match=r"evaluate.methods \['ppd-head'\] cannot decode with what train.method=ept "
                                        r"trains \(its component serves ar, anpd, self-draft, auto, ppd, ppd-lookup, ppd-corpus\): drop them, or train "
                                        "with ept-head"):
        load_spec(job, ["evaluate.methods=[ar,ppd-head]"])
    assert load_spec(job, ["evaluate.methods=[ar,ppd-head]", "train.method=ept-head"]).train.method == "ept-head"
    with pytest.raises(SpecError, match=r"evaluate.methods \['ppd'\] cannot decode with what train.method=medusa"):
        load_spec(job, ["evaluate.methods=[ar,ppd,medusa]", "train.method=medusa"])
    # a corpus method drafts from the corpus that comes with a catalog base model: the tiny model has none
    tiny = ["train.method=eagle3", "base_model.name=tiny-llama"]
    with pytest.raises(SpecError, match=r"evaluate.methods \['eagle3-corpus'\] need the base model's self-distilled "
                                        r"corpus .*base_model.name 'tiny-llama' has none"):
        load_spec(job, ["evaluate.methods=[ar,eagle3-corpus]", *tiny])
    assert "eagle3-corpus" not in load_spec(job, tiny).evaluate.methods  # nor by default
    committed = load_spec(job, ["train.method=eagle3"]).evaluate.methods  # SmolLM2's corpus comes with ppdkit
    assert "eagle3-corpus" in committed and "eagle3-anpd" in committed
    # each method's train section takes its own keys only: another method's fails, naming the methods it is a key of
    with pytest.raises(SpecError, match="'train.head_start_step' does not apply to train.method ept: it is a key of "
                                        "ept-head. ept takes: aggregation, alpha,"):
        load_spec(job, ["train.head_start_step=5"])
    with pytest.raises(SpecError, match="'train.draft_vocab' does not apply to train.method ept-head: it is a key of "
                                        "feature-head, medusa, eagle3, early-head, skip-finetune"):
        load_spec(job, ["train.method=ept-head", "train.draft_vocab=100"])
    with pytest.raises(SpecError, match="'train.feature_weight' does not apply to train.method medusa: it is a key of "
                                        "feature-head."):
        load_spec(job, ["train.method=medusa", "train.feature_weight=0.5"])
    with pytest.raises(SpecError, match="'train.features_on_disk' does not apply to train.method ept: it is a key of "
                                        "feature-head, medusa, eagle3."):
        load_spec(job, ["train.features_on_disk=true"])
    with pytest.raises(SpecError, match="'train.lr' does not apply to train.method layer-skip"):  # it trains no weights
        load_spec(job, ["train.method=layer-skip", "train.lr=0.1"])
    with pytest.raises(SpecError, match="'train.lrr' does not apply to train.method ept: no training method takes it"):
        load_spec(job, ["train.lrr=0.1"])
    assert load_spec(job, ["train.features_on_disk=true", "train.method=feature-head"]).train.features_on_disk


def test_a_block_format_teacher_needs_the_unquantized_model_and_a_gguf():
    """teacher.compute_dtype gguf/q4 runs the teacher on the runtime's blocks: refused, with the fix, where the
    base model is NF4 or has no GGUF (gguf). Sampled regeneration runs there too
    (ppdkit/runtime/batching/batched_decoding.py)."""
    base = {"name": "smollm2-135m", "quantization": "none"}
    assert spec_from_dict({"name": "x", "base_model": base, "teacher": {"compute_dtype": "gguf"}})
    with pytest.raises(SpecError, match="set base_model.quantization none"):
        spec_from_dict({"name": "x", "teacher": {"compute_dtype": "gguf"}})  # the default base is NF4
    with pytest.raises(SpecError, match="'tiny-llama' has no GGUF file.*use q4"):
        spec_from_dict({"name": "x", "base_model": {"name": "tiny-llama", "quantization": "none"},
                        "teacher": {"compute_dtype": "gguf"}})
    assert spec_from_dict({"name": "x", "base_model": base,
                           "teacher": {"compute_dtype": "q4", "regenerate": True, "temperature": 0.7}})


def test_magpie_prompts_need_a_limit_and_regeneration_and_only_user_turns_are_written():
    """data.source magpie is endless and holds only prompts for the base model to write: refused without data.limit
    or teacher.regenerate, saying which key to set. A file's write mark goes on a user turn without content only."""
    with pytest.raises(SpecError, match="magpie has no end.*set data.limit"):
        spec_from_dict({"name": "x", "data": {"source": "magpie", "limit": None}, "teacher": {"regenerate": True}})
    with pytest.raises(SpecError, match="set teacher.regenerate true"):
        spec_from_dict({"name": "x", "data": {"source": "magpie", "limit": 8}})
    with pytest.raises(SpecError, match="teacher.prompt_temperature"):
        spec_from_dict({"name": "x", "teacher": {"prompt_temperature": 0}})
    assert spec_from_dict({"name": "x", "data": {"source": "magpie", "limit": 8}, "teacher": {"regenerate": True}})
    convs, _ = read_conversations("magpie", limit=3, require_assistant=True)
    assert [c.id for c in convs] == ["magpie-0000000", "magpie-0000001", "magpie-0000002"]
    assert all(c.has_turns_to_write() for c in convs)
    with pytest.raises(ValueError, match="left for the base model to write"):
        load_prompts("magpie", 2)
    rows = [{"messages": [{"role": "user", "write": True}, {"role": "assistant", "content": ""}]},
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "write": True}]},
            {"messages": [{"role": "user", "content": "Hi", "write": True}, {"role": "assistant", "content": ""}]}]
    assert to_conversation(rows[0], "0").has_turns_to_write()
    for row in rows[1:]:
        with pytest.raises(MalformedRow, match="only a user turn without content can be marked write"):
            to_conversation(row, "1")


# --- `ppdkit serve`'s requests: what a text model cannot serve is refused by name (tests/test_serve.py: over HTTP) ---

def _chat_refusal(content) -> str:
    with pytest.raises(ValidationError) as refused:
        ChatRequest.model_validate({"messages": [{"role": "user", "content": content}]})
    [error] = refused.value.errors()
    assert error["loc"] == ("messages", 0, "content")
    return error["msg"]


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                                  {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                                  {"type": "file", "file": {"file_id": "file-1"}},
                                  {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}],
                         ids=lambda part: part["type"])
def test_a_content_part_that_is_not_text_is_refused_by_its_type(part):
    said = _chat_refusal([{"type": "text", "text": "What is this?"}, part])
    assert f"content part 1 is of type '{part['type']}'" in said and "serves text parts only" in said, said


@pytest.mark.parametrize("part, says", [({"type": "text"}, "content part 0 has no 'text'"),
                                        ({"type": "text", "text": 3}, "has 'text' of type int, not a string"),
                                        ({"type": "text", "text": ["a"]}, "has 'text' of type list, not a string"),
                                        ("Hello", "content part 0 is a str, not a content part")])
def test_a_text_part_without_a_string_text_says_so(part, says):
    assert says in _chat_refusal([part])


def test_no_content_parts_at_all_is_refused():
    assert "no content parts" in _chat_refusal([])


@pytest.mark.parametrize("field, value, says", [
    ("tools", [{"type": "function", "function": {"name": "weather", "parameters": {}}}], "calls no tools"),
    ("functions", [{"name": "weather", "parameters": {}}], "calls no tools"),
    ("n", 2, "one choice per request; send n=1"),
    ("tool_choice", "required", "calls no tools"),
    ("tool_choice", {"type": "function", "function": {"name": "weather"}}, "calls no tools"),
    ("response_format", {"type": "json_object"}, "no JSON mode or schema"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}, "no JSON mode"),
    ("logprobs", True, "no log-probabilities"),
    ("logprobs", 5, "no log-probabilities"),
    ("top_logprobs", 3, "no log-probabilities"),
    ("logit_bias", {"50256": -100}, "own distribution"),
    ("frequency_penalty", 0.5, "own distribution"),
    ("presence_penalty", -1.0, "own distribution"),
])
def test_what_the_server_cannot_honour_is_refused_by_name(field, value, says):
    """Checked before the decoder is asked anything: no decoder needed."""
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], field: value})
    with pytest.raises(RequestError) as refused:
        generate_options(request, None, ServeLimits(), "ar")
    assert refused.value.status == 400 and refused.value.param == field and says in refused.value.message
    assert refused.value.message.startswith(field)


@pytest.mark.parametrize("field, value", [("tool_choice", "none"), ("response_format", {"type": "text"}),
                                          ("logprobs", False), ("logprobs", 0), ("top_logprobs", 0),
                                          ("logit_bias", {}), ("frequency_penalty", 0), ("presence_penalty", 0.0)])
def test_the_neutral_values_clients_send_by_default_pass(field, value, tiny_base_decoder):
    """What OpenAI's SDKs and LangChain send when nothing is asked: served, not refused."""
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], field: value})
    assert generate_options(request, tiny_base_decoder, ServeLimits(), "ar").method == "ar"


@pytest.fixture(scope="module")
def tiny_base_decoder():
    from ppdkit.runtime.decoder import Decoder

    return Decoder.from_base("tiny-llama")
