"""The teacher stage on a real local Ray: complete, exact, resumable after a killed worker or driver."""

import json
import os
import signal

import psutil
import pytest
import torch
from datasets import Dataset, load_from_disk

from conftest import FIXTURES, kernels_or_skip, q4_weights_or_skip
from ppdkit.data_pipeline.config import DataConfig, TeacherConfig
from ppdkit.data_pipeline.data_stage import run_data_stage
from ppdkit.data_pipeline.teacher_cache import TeacherCache, TeacherCacheError, file_sha256
from ppdkit.data_pipeline.teacher_stage import _resume_manifest, run_teacher_stage, supervised_positions
from ppdkit.models.config import BaseModelConfig
from ppdkit.models.loading import load_base_model

BASE = BaseModelConfig(name="tiny-llama", quantization="none")
DATA = DataConfig(source=str(FIXTURES / "conversations.jsonl"), limit=None, max_length=64, holdout=0.3,
                  shards=1, check_sequences=0)
# float32: the cache is checked against a float32 forward to 2e-3 (bfloat16's own test bounds its KL instead)
TEACHER = TeacherConfig(workers=2, top_k=16, rows_per_shard=1, batch_size=2, compute_dtype="float32")


@pytest.fixture(scope="module")
def data_dir(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    run_data_stage(BASE, DATA, out)
    return out


@pytest.fixture(scope="module")
def undisturbed(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher")
    summary = run_teacher_stage(BASE, DATA, TEACHER, data_dir, out)
    return out, summary


def _manifest(out):
    """The manifest without what differs between two runs of the same shards: who computed each and how fast."""
    manifest = json.loads((out / "manifest.json").read_text())
    for record in manifest["shards"].values():
        record.pop("timing")
    return manifest


def test_cache_is_complete_and_matches_a_direct_forward(undisturbed, data_dir):
    out, summary = undisturbed
    manifest = _manifest(out)
    assert manifest["complete"] and manifest["top_k"] == 16 and manifest["quantization"] == "none"
    assert len(manifest["shards"]) == 7 == summary["shards"]  # 5 train + 2 holdout rows, one per shard
    for rec in manifest["shards"].values():
        assert file_sha256(out / rec["split"] / rec["file"]) == rec["sha256"]
    figures = manifest["figures"]
    assert figures["bytes_per_position"] < figures["full_vocab_fp16_bytes_per_position"]
    assert 0 < figures["mass_kept_p5"] <= figures["mass_kept_mean"] <= 1
    assert summary["positions_per_second"] > 0

    base = load_base_model("tiny-llama")
    cache = TeacherCache(out, expect_fingerprint=base.fingerprint, verify=True)
    train = load_from_disk(str(data_dir / "train"))
    seen = 0
    for seq in cache.sequences("train"):
        row = train[seq.row]
        assert seq.input_ids.tolist() == row["input_ids"]
        assert seq.positions.tolist() == supervised_positions(row["loss_mask"])
        with torch.no_grad():
            logp = torch.log_softmax(base.model(seq.input_ids[None]).logits[0].float(), -1)[seq.positions]
        assert torch.allclose(logp.gather(1, seq.topk_ids.long()), seq.topk_logprobs.float(), atol=2e-3)
        assert torch.allclose(1 - logp.gather(1, seq.topk_ids.long()).exp().sum(-1), seq.rest_mass, atol=1e-4)
        seen += 1
    assert seen == len(train) == figures["splits"]["train"]["sequences"]


def test_a_bfloat16_teacher_stays_close_to_the_float32_one(undisturbed, data_dir, tmp_path):
    """The teacher in bfloat16 (auto's choice on CPUs with AVX512-BF16): per position, the KL divergence from the
    float32 teacher's distribution to the bfloat16 one, both as the cache reconstructs them, is below 0.01 nats
    on average and 0.05 at worst on the tiny model (measured: about 1e-4 and 1e-3)."""
    from ppdkit.data_pipeline.teacher_cache import reconstruct_logprobs

    out32, _ = undisturbed
    summary = run_teacher_stage(BASE, DATA, TEACHER.model_copy(update={"compute_dtype": "bfloat16"}), data_dir, tmp_path)
    assert summary["compute_dtype"] in ("bfloat16", "float32")  # float32 where this CPU has no bfloat16 kernels
    caches = [TeacherCache(out) for out in (out32, tmp_path)]
    kls = []
    for a, b in zip(*(c.sequences("train") for c in caches), strict=True):
        assert a.positions.tolist() == b.positions.tolist()
        p, q = (reconstruct_logprobs(s.topk_ids, s.topk_logprobs, s.rest_mass, caches[0].vocab_size) for s in (a, b))
        kls.append((p.exp() * (p - q)).sum(-1))
    kl = torch.cat(kls)
    assert kl.mean() < 0.01 and kl.max() < 0.05, (kl.mean(), kl.max())


@pytest.mark.parametrize("dtype", ["q4", "bfloat16"])
def test_the_teacher_computes_on_the_decoders_runtime(undisturbed, data_dir, tmp_path, dtype):
    """teacher.compute_dtype q4 (gguf for a base model with a GGUF) or bfloat16, base_model.quantization none: the
    teacher pass runs on the runtime (over the 4-bit blocks, or the bfloat16 weights on the native kernels), so
    its targets and features are those of the model `--dtype q4` or `bfloat16` verifies with, not float32's."""
    from ppdkit.runtime.drafters.drafter import read_prompt
    from ppdkit.runtime.forward.llama import LeanLlama

    if dtype == "q4":
        model = load_base_model("tiny-llama").model  # the q4 decoder's model, built here as the actors built theirs
        runtime = LeanLlama(model, DATA.max_length + 1, **q4_weights_or_skip(model))
    else:
        kernels_or_skip("native")  # bfloat16 on every build of them
        runtime = LeanLlama(load_base_model("tiny-llama", "none", "bfloat16").model, DATA.max_length + 1)
    assert runtime.weight_format == dtype and runtime.native is not None
    summary = run_teacher_stage(BASE, DATA, TEACHER.model_copy(update={"compute_dtype": dtype, "features": True}),
                                data_dir, tmp_path)
    assert summary["compute_dtype"] == dtype and summary["teacher_engine"] == "runtime"
    cache, cache32 = TeacherCache(tmp_path, verify=True), TeacherCache(undisturbed[0])
    # what calibration and computed features load transformers' model in: blocks' weights de-quantized to float32
    assert cache.float_dtype == ("float32" if dtype == "q4" else "bfloat16")
    moved = 0.0
    for seq, seq32 in zip(cache.sequences("train", features=True), cache32.sequences("train"), strict=True):
        with torch.inference_mode():
            hidden = read_prompt(runtime, seq.input_ids, runtime.new_cache(len(seq.input_ids)))  # [T, H]
            logp = torch.log_softmax(runtime.logits(hidden[seq.positions]).float(), -1)  # [P, V]
        assert torch.allclose(logp.gather(1, seq.topk_ids.long()), seq.topk_logprobs.float(), atol=2e-3)
        assert torch.allclose(seq.features.float(), hidden, atol=2e-2, rtol=1e-2)
        moved = max(moved, (seq.topk_logprobs[:, 0].float() - seq32.topk_logprobs[:, 0].float()).abs().max().item())
    assert moved > 1e-3  # the narrow model's own distributions, not float32's


def test_kept_features_are_the_final_hidden_states_and_heads_read_them(undisturbed, data_dir, tmp_path):
    """teacher.features keeps every token's final hidden state (float16) in a checksummed companion file per shard,
    memory-mapped on reading; ppdkit/trainer/features.py then reads them instead of running the base model."""
    from ppdkit.trainer.features import FeatureCache

    summary = run_teacher_stage(BASE, DATA, TEACHER.model_copy(update={"features": True}), data_dir, tmp_path)
    assert summary["feature_bytes_per_position"] > summary["bytes_per_position"]
    cache = TeacherCache(tmp_path, verify=True)
    assert cache.has_features and all(r["features"]["sha256"] for r in cache.shards())
    base = load_base_model("tiny-llama")
    never = FeatureCache(None)  # a cache with no model: it can only answer from the kept features
    for seq in cache.sequences("train", features=True):
        with torch.no_grad():
            hidden = base.model.get_decoder()(input_ids=seq.input_ids[None]).last_hidden_state[0]  # [T, H]
        assert seq.features.shape == hidden.shape and seq.features.dtype == torch.float16
        assert torch.allclose(never(seq, "train"), hidden, atol=2e-2, rtol=1e-2)
    shard = next(tmp_path.glob("train/*.features.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-2] + b"\0\0")
    with pytest.raises(TeacherCacheError, match="does not match its manifest checksum"):
        TeacherCache(tmp_path, verify=True)
    with pytest.raises(TeacherCacheError, match="keeps no features"):
        next(TeacherCache(undisturbed[0]).sequences("train", features=True))


def test_cache_refuses_another_base_model(undisturbed):
    from ppdkit.data_pipeline.teacher_cache import TeacherCacheError

    with pytest.raises(TeacherCacheError, match="not by the model in use"):
        TeacherCache(undisturbed[0], expect_fingerprint="sha256:" + "0" * 64)


def test_killed_worker_is_retried_and_changes_nothing(undisturbed, data_dir, tmp_path):
    killed = []

    def kill_one(record, pids):
        if not killed:
            killed.append(psutil.Process(pids[0]))
            os.kill(pids[0], signal.SIGKILL)  # it has a shard queued: Ray restarts the actor and retries it

    out = tmp_path / "teacher"
    run_teacher_stage(BASE, DATA, TEACHER, data_dir, out, on_shard_done=kill_one)
    assert killed
    gone, alive = psutil.wait_procs(killed, timeout=10)
    assert gone and not alive  # the actor's process really died (and the stage still finished)
    assert _manifest(out) == _manifest(undisturbed[0])


def test_regeneration_resumes_after_a_killed_actor_with_the_same_shards(data_dir, tmp_path):
    """Greedy regeneration on the runtime is a function of the shard alone (batched answers equal ar's), so a shard
    retried on a restarted actor is byte-identical to the undisturbed run's."""
    cfg = TEACHER.model_copy(update={"workers": 1, "rows_per_shard": 3, "regenerate": True, "max_new_tokens": 8,
                                     "generate_batch": 2})
    undisturbed = run_teacher_stage(BASE, DATA, cfg, data_dir, tmp_path / "a")
    assert undisturbed["regeneration_engine"] == "runtime" and undisturbed["generated_tokens_per_second"] > 0
    killed = []

    def kill_first(record, pids):
        if not killed:
            killed.append(pids[0])
            os.kill(pids[0], signal.SIGKILL)  # its next shard is queued: Ray restarts it and retries the shard

    run_teacher_stage(BASE, DATA, cfg, data_dir, tmp_path / "b", on_shard_done=kill_first)
    assert killed and _manifest(tmp_path / "b") == _manifest(tmp_path / "a")


def test_driver_crash_then_rerun_writes_only_missing_shards(undisturbed, data_dir, tmp_path):
    class Crash(Exception):
        pass

    def crash_after_three(record, pids, seen=[]):
        seen.append(record)
        if len(seen) == 3:
            raise Crash()

    out = tmp_path / "teacher"
    with pytest.raises(Crash):
        run_teacher_stage(BASE, DATA, TEACHER, data_dir, out, on_shard_done=crash_after_three)
    partial = _manifest(out)
    assert not partial["complete"] and len(partial["shards"]) == 3
    summary = run_teacher_stage(BASE, DATA, TEACHER, data_dir, out)
    assert summary["shards_computed_now"] == 4
    assert _manifest(out) == _manifest(undisturbed[0])


@pytest.mark.parametrize("saved_extra, kept", [({}, True), ({"engine": "runtime"}, False)])
def test_a_cache_resumes_only_under_the_very_header_it_was_started_with(tmp_path, saved_extra, kept):
    # a saved header with a setting this run's lacks (one dropped or renamed since) was made another way
    header = {"format": 1, "top_k": 64, "generation": {"engine": "runtime"}}
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "shard-00000.safetensors").write_bytes(b"computed")
    saved = {**header, **saved_extra, "complete": False, "figures": {},
             "shards": {"train-00000": {"split": "train", "file": "shard-00000.safetensors"}}}
    (tmp_path / "manifest.json").write_text(json.dumps(saved))
    manifest = _resume_manifest(tmp_path / "manifest.json", header, tmp_path)
    assert list(manifest["shards"]) == (["train-00000"] if kept else [])
    assert (tmp_path / "train" / "shard-00000.safetensors").is_file() == kept


def test_malformed_rows_are_counted_not_fatal(ray_local, tmp_path):
    data = tmp_path / "data"
    good = {"id": "g", "input_ids": [1, 40, 41, 2, 1, 42, 43, 2], "loss_mask": [0, 0, 0, 0, 0, 1, 1, 1], "messages": "[]"}
    rows = [good,
            {**good, "id": "too-big", "input_ids": [1, 40, 99999, 2, 1, 42, 43, 2]},
            {**good, "id": "ragged", "loss_mask": [0, 1]},
            {**good, "id": "nothing-to-learn", "loss_mask": [0] * 8}]
    Dataset.from_list(rows).save_to_disk(str(data / "train"))
    summary = run_teacher_stage(BASE, DATA, TeacherConfig(workers=1, top_k=8), data, tmp_path / "teacher")
    assert summary["skipped_rows"] == 3
    reasons = " | ".join(summary["skipped_by_reason"])
    assert "vocabulary" in reasons and "one length" in reasons and "no assistant token" in reasons
    assert summary["splits"]["train"]["sequences"] == 1


def test_4bit_teacher_with_self_distillation(data_dir, tmp_path):
    base = BaseModelConfig(name="tiny-llama", quantization="nf4")
    cfg = TeacherConfig(workers=2, top_k=16, rows_per_shard=3, batch_size=3, regenerate=True, max_new_tokens=6)
    summary = run_teacher_stage(base, DATA, cfg, data_dir, tmp_path / "teacher")
    manifest = _manifest(tmp_path / "teacher")
    assert manifest["quantization"] == "nf4" and manifest["regenerate"] and summary["positions"] > 0
    assert summary["teacher_engine"] == "transformers"  # the 4-bit model itself: its unquantized copy only regenerates
    # Greedy regeneration: the regenerated text is what the model itself predicts, so the teacher's
    # top-1 at a regenerated position is the token that follows (up to near-ties of the random model).
    cache = TeacherCache(tmp_path / "teacher")
    original = load_from_disk(str(data_dir / "train"))
    end = load_base_model("tiny-llama").tokenizer.convert_tokens_to_ids("<|im_end|>")
    agree = total = changed = 0
    for seq in cache.sequences("train"):
        changed += seq.input_ids.tolist() != original[seq.row]["input_ids"]
        # The end-of-turn marker after max_new_tokens, and the newline after it, come from the template.
        generated = (seq.input_ids[seq.positions + 1] != end) & (seq.input_ids[seq.positions] != end)
        nxt = seq.input_ids[seq.positions + 1][generated]
        agree += (seq.topk_ids[generated, 0].long() == nxt).sum().item()
        total += len(nxt)
    assert changed > 0 and total >= 20
    assert agree / total > 0.95, (agree, total)


def test_regeneration_drops_an_assistant_turn_with_no_prompt_before_it():
    from ppdkit.data_pipeline.conversations import Conversation
    from ppdkit.data_pipeline.regenerate import regenerate_conversations

    base = load_base_model("tiny-llama", quantization="none")
    conv = Conversation("c", ({"role": "assistant", "content": "hello, how can I help?"},
                              {"role": "user", "content": "add two and two"},
                              {"role": "assistant", "content": "four"}))
    [new] = regenerate_conversations(base.model, base.tokenizer, [conv], max_new_tokens=4, max_length=64,
                                     temperature=0.0, seed=0, batch_size=2)
    assert [m["role"] for m in new.messages] == ["user", "assistant"]
    assert new.messages[0]["content"] == "add two and two" and new.messages[1]["content"] != "four"


def test_magpie_conversations_are_written_and_answered_by_the_base_model(ray_local, tmp_path):
    """data.source magpie end to end on Ray: the data stage holds only marks (nothing to score), the teacher's
    regeneration writes each prompt and its answer, and the cache supervises the answers, not the prompts."""
    data = DataConfig(source="magpie", limit=6, max_length=64, holdout=0.2, shards=1, check_sequences=4)
    summary = run_data_stage(BASE, data, tmp_path / "data")
    assert summary["train_sequences"] + summary["holdout_sequences"] == 6 and "check_nll" not in summary
    cfg = TEACHER.model_copy(update={"workers": 1, "rows_per_shard": 3, "regenerate": True, "max_new_tokens": 8})
    teacher = run_teacher_stage(BASE, data, cfg, tmp_path / "data", tmp_path / "teacher")
    assert teacher["skipped_rows"] <= 1 and teacher["positions"] > 0
    assert _manifest(tmp_path / "teacher")["generation"]["prompt_temperature"] == cfg.prompt_temperature
    tok = load_base_model("tiny-llama").tokenizer
    prompts = set()
    for seq in TeacherCache(tmp_path / "teacher").sequences("train"):
        text = tok.decode(seq.input_ids)
        user = text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        assert user.strip()  # the model's own prompt, where the data stage left an empty turn
        prompts.add(user)
        first_answer = text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
        starts = [len(tok.decode(seq.input_ids[:p + 1])) for p in seq.positions.tolist()]
        assert min(starts) >= first_answer - 1  # supervised: the answer's tokens only
    assert len(prompts) > 1


def test_transformers_regeneration_writes_marked_user_turns_too():
    """Where the native kernels cannot run, transformers' generate writes the marked prompt (sampled) and answers it."""
    from ppdkit.data_pipeline.conversations import Conversation
    from ppdkit.data_pipeline.regenerate import regenerate_conversations

    base = load_base_model("tiny-llama", quantization="none")
    convs = [Conversation(f"m{i}", ({"role": "user", "content": "", "write": True},
                                    {"role": "assistant", "content": ""})) for i in range(3)]
    new = regenerate_conversations(base.model, base.tokenizer, convs, max_new_tokens=6, max_length=64,
                                   temperature=0.0, seed=0, batch_size=2, prompt_temperature=1.0)
    assert all(not c.has_turns_to_write() for c in new)
    assert any([m["role"] for m in c.messages] == ["user", "assistant"] and c.messages[0]["content"] for c in new)


def test_an_empty_written_prompt_ends_its_conversation_and_is_skipped_not_fatal():
    """A prompt the model writes empty (its end token first) leaves nothing to answer: the conversation ends there,
    and one with no turn left is a counted skip, never a template error inside a shard."""
    from ppdkit.data_pipeline.conversations import Conversation, MalformedRow
    from ppdkit.data_pipeline.regenerate import _answered, _Progress
    from ppdkit.data_pipeline.templating import encode_conversation

    state = _Progress(Conversation("m", ({"role": "user", "content": "", "write": True},
                                         {"role": "assistant", "content": ""})), writing_prompt=True)
    _answered(state, "  \n")
    assert state.done and state.messages == []
    with pytest.raises(MalformedRow, match="no messages"):
        encode_conversation(load_base_model("tiny-llama").tokenizer, Conversation("m", ()), 64)
