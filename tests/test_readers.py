import gzip
import json

import pytest

from conftest import FIXTURES
from ppdkit.data_pipeline.conversations import MalformedRow, to_conversation
from ppdkit.data_pipeline.readers import iter_json_array, read_conversations


def test_user_jsonl_keeps_good_rows_and_counts_every_bad_one():
    convs, report = read_conversations(str(FIXTURES / "conversations.jsonl"), require_assistant=True)
    assert [c.id for c in convs] == ["c1", "c2", "c3", "c4", "c5", "c6", "c7"]
    assert report.rows == 12 and report.kept == 7
    assert sum(report.skipped.values()) == 5
    reasons = " | ".join(report.skipped)
    for expected in ("unknown role 'narrator'", "invalid JSON", "not a string", "no assistant turn", "not an object"):
        assert expected in reasons
    assert report.examples[0].startswith("line 4")


def test_sharegpt_and_messages_forms_normalize_alike():
    a = to_conversation({"id": "x", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}, "r")
    b = to_conversation({"id": "x", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "r")
    assert a == b
    assert to_conversation({"question_id": 81, "turns": ["first", "second"]}, "r").messages == ({"role": "user", "content": "first"},)
    with pytest.raises(MalformedRow, match="no user turn"):
        to_conversation({"conversations": [{"from": "gpt", "value": "hello"}]}, "r")


def test_truncated_json_array_yields_complete_items_and_reports_the_tail(tmp_path):
    items = [{"id": f"i{k}", "conversations": [{"from": "human", "value": "q" * 50}, {"from": "gpt", "value": "a"}]}
             for k in range(40)]
    text = json.dumps(items, indent=2)
    cut = text.index('"i39"') + 30  # mid-way through the last item, as the packaged ShareGPT file is
    path = tmp_path / "cut.json"
    path.write_text(text[:cut])
    rows = list(iter_json_array(path, chunk_chars=64))  # tiny chunks: items span many reads
    assert [r["id"] for _, r in rows[:-1]] == [f"i{k}" for k in range(39)]
    where, tail = rows[-1]
    assert isinstance(tail, MalformedRow) and "truncated" in str(tail) and where.startswith("item 39")
    convs, report = read_conversations(str(path))
    assert len(convs) == 39 and report.rows == 40 and sum(report.skipped.values()) == 1


def test_limit_stops_reading_early(tmp_path):
    path = tmp_path / "many.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for k in range(100):
            f.write(json.dumps({"prompt": f"p{k}"}) + "\n")
    convs, report = read_conversations(str(path), limit=5)
    assert [c.first_user_turn for c in convs] == ["p0", "p1", "p2", "p3", "p4"] and report.rows == 5


def test_unknown_source_names_the_packaged_ones():
    with pytest.raises(ValueError, match="sharegpt.*mt-bench|chitchat"):
        read_conversations("sharegtp")


def test_packaged_prompt_sets():
    mt, _ = read_conversations("mt-bench")
    he, _ = read_conversations("humaneval")
    assert len(mt) == 80 and mt[0].id == "81"
    assert len(he) == 164 and he[0].id == "HumanEval/0" and "def " in he[0].first_user_turn


def test_packaged_sharegpt_recovers_every_complete_conversation():
    convs, report = read_conversations("sharegpt")
    # 17,671 complete items and the broken tail; items without a usable user turn are counted, not lost.
    assert report.rows == 17672
    assert report.kept + sum(report.skipped.values()) == report.rows
    assert sum(n for reason, n in report.skipped.items() if "unparseable JSON" in reason) == 1
    assert len(convs) == report.kept > 17000
