"""Prompt-token training: frozen base, DeepSpeed ranks on Ray Train, recorded losses, resume after a kill."""

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from conftest import TINY_BASE, TINY_DATA
from ppdkit.data_pipeline.teacher_cache import TeacherCache
from ppdkit.models.artifact import ArtifactError, read_component
from ppdkit.models.loading import load_base_model
from ppdkit.models.prompt_tokens import PromptTokens, init_from_token_embeddings
from ppdkit.registry.tracking import TrackerRef
from ppdkit.trainer.prompt_batch import collate
from ppdkit.trainer.config import TrainConfig
from ppdkit.trainer.launch import run_training
from ppdkit.trainer.losses import decay_mean, kl_to_compressed_teacher
from ppdkit.trainer.student import student_logprobs

BASE, DATA = TINY_BASE, TINY_DATA  # the session's teacher_dir (conftest) is made from them
# How every method's tests train here: keys of every method that trains weights (WeightTrainingConfig). One rank in
# the test's own process (Ray Train's local mode): a fit on Ray Train workers costs ~20 s of start-up on 2 cores,
# which the tests below that are about the ranks (two of them, a killed one, ZeRO across them) pay.
RUN = {"num_workers": 0, "micro_batch": 1, "epochs": 1, "max_steps": 2, "lr": 0.01, "eval_every": 1,
       "checkpoint_every": 1, "log_every": 1, "eval_sequences": 2}
TRAIN = TrainConfig(**{**RUN, "num_workers": 2}, groups_per_sequence=4)


def train_as(method: str, **keys) -> TrainConfig:
    """RUN for `method`, with `keys` (the method's own, or RUN's changed): a model_copy cannot change the method,
    since each method's section is its own class."""
    return TrainConfig(method=method, **{**RUN, **keys})
# Losses of the first two steps of TRAIN on the fixture (tiny-llama, fp32 base, 2 ranks), recorded once.
RECORDED_LOSSES = [0.00433059, 0.00363564]


def test_a_step_changes_only_the_prompt_embeddings(teacher_dir):
    base = load_base_model("tiny-llama", quantization="nf4", for_training=True)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    k, n = 3, 2
    prompt = PromptTokens(k, n, base.model.config.hidden_size,
                          init=init_from_token_embeddings(base.model.get_input_embeddings(), k, n))
    start = prompt.embeddings.detach().clone()
    opt = torch.optim.AdamW(prompt.parameters(), lr=0.01)
    seqs = list(TeacherCache(teacher_dir).sequences("train"))[:2]
    batch = collate(seqs, k, n, 4, "ensemble", random.Random(0))
    emb, weights = prompt()
    logp = student_logprobs(base.model, emb, weights, k, n, batch).flatten(0, 1)
    per = kl_to_compressed_teacher(logp, batch.teacher_ids.flatten(0, 1), batch.teacher_logp.flatten(0, 1),
                                   batch.teacher_rest.flatten(0, 1))
    decay_mean(per, batch.target_valid.flatten(0, 1), 0.8).backward()
    opt.step()
    assert prompt.embeddings.grad.abs().sum() > 0
    assert not torch.equal(prompt.embeddings.detach(), start)
    after = base.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(p.grad is None for p in base.model.parameters())


# TRAIN through three epochs of the fixture's sequences, with a checkpoint every other step: the run a killed rank
# must resume onto, and (its first two steps) the recorded losses
UNDISTURBED = TRAIN.model_copy(update={"max_steps": None, "epochs": 3, "checkpoint_every": 2, "eval_every": 2})


@pytest.fixture(scope="module")
def undisturbed(teacher_dir, tmp_path_factory) -> tuple[dict, Path]:
    """UNDISTURBED's run on two Ray workers, once for the module (a Ray Train fit costs ~30 s on 2 cores): its result
    and its output folder."""
    out = tmp_path_factory.mktemp("undisturbed") / "train"
    return run_training(BASE, UNDISTURBED, teacher_dir, out, TrackerRef()), out


def test_two_steps_on_two_ray_workers_match_the_recorded_losses(undisturbed):
    result, out = undisturbed
    losses = [loss for _, loss in result["history"]][:2]  # a step's loss does not depend on the steps after it
    print("losses:", losses)
    assert losses == pytest.approx(RECORDED_LOSSES, rel=1e-4)
    component = read_component(out / "component", expect_fingerprint=load_base_model("tiny-llama").fingerprint)
    assert component.method == "ept"
    assert component.tensors["prompt_embeddings"].shape == (3, 1, 64)
    assert set(result["best"]) >= {"acc_top1_d1", "acc_top5_d3", "acc_top10_mean"}
    assert (out / "plots" / "loss.png").stat().st_size > 0
    assert (out / "plots" / "accuracy_by_distance.png").stat().st_size > 0


def _listening_beyond_loopback() -> set:
    import psutil

    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.ip not in ("127.0.0.1", "::1")}


def test_local_mode_trains_in_this_process_as_one_ray_worker_does_and_puts_the_process_back(teacher_dir, tmp_path):
    """train.num_workers 0 (Ray Train's local mode): the rank runs here, on a gloo group of one, and trains exactly
    what one Ray Train worker trains; afterwards the process has its threads, environment, log handlers and level
    back, no process group, and nothing new listening beyond loopback."""
    import logging

    import torch.distributed as dist

    cfg = TRAIN.model_copy(update={"num_workers": 1, "max_steps": 2})
    on_a_worker = run_training(BASE, cfg, teacher_dir, tmp_path / "worker", TrackerRef())
    ppdkit_log = logging.getLogger("ppdkit")
    before = (torch.get_num_threads(), dict(os.environ), list(ppdkit_log.handlers), ppdkit_log.level,
              _listening_beyond_loopback())
    here = run_training(BASE, cfg.model_copy(update={"num_workers": 0}), teacher_dir, tmp_path / "here", TrackerRef())
    after = (torch.get_num_threads(), dict(os.environ), list(ppdkit_log.handlers), ppdkit_log.level,
             _listening_beyond_loopback())
    assert here["history"] == on_a_worker["history"] and len(here["history"]) == 2
    assert {k: v for k, v in after[1].items() if before[1].get(k) != v} == {}
    assert after == before and not dist.is_initialized()
    placement = json.loads((tmp_path / "here" / "placement.json").read_text())
    assert len(placement[0]["ranks"]) == 1 and placement[0]["allreduce"] is None
    assert "step 2/2 loss" in (tmp_path / "here" / "worker-0.log").read_text()
    with pytest.raises(ValueError, match="set train.num_workers to 1 or more"):
        TrainConfig(method="layer-skip", num_workers=0)


def dying_once_at_step(step: int, marker: Path):
    """The worker loop, with rank 0 dying (as a killed process does, no cleanup) right after optimizer step `step`,
    once: `marker` records it, so the group Ray Train restarts trains through. Defined here, the closure is pickled
    by value into the workers, where it patches the loop's step in the worker's own module."""
    def loop(config: dict) -> None:
        import ppdkit.trainer.worker as worker

        optimizer_step = worker._optimizer_step

        def step_then_die(t):
            result = optimizer_step(t)
            if t.ranks.rank == 0 and t.progress.step == step and not marker.exists():
                marker.write_text(str(step))
                os._exit(1)
            return result

        worker._optimizer_step = step_then_die
        worker.train_loop_per_worker(config)
    return loop


def test_killed_worker_resumes_on_the_same_loss_curve(undisturbed, teacher_dir, tmp_path, monkeypatch):
    marker = tmp_path / "died"
    monkeypatch.setattr("ppdkit.trainer.launch.train_loop_per_worker", dying_once_at_step(3, marker))
    resumed = run_training(BASE, UNDISTURBED, teacher_dir, tmp_path / "b", TrackerRef())
    assert marker.read_text() == "3"  # rank 0 really died at step 3, after the step-2 checkpoint
    assert len(undisturbed[0]["history"]) == len(resumed["history"]) == 6
    for (s1, l1), (s2, l2) in zip(undisturbed[0]["history"], resumed["history"]):
        assert s1 == s2 and l1 == pytest.approx(l2, rel=1e-5)


def test_component_for_another_base_model_is_refused(undisturbed, tmp_path):
    component = shutil.copytree(undisturbed[1] / "component", tmp_path / "component")  # the fixture's stays whole
    with pytest.raises(ArtifactError, match="trained for base model tiny-llama"):
        read_component(component, expect_fingerprint="sha256:" + "1" * 64)
    meta = json.loads((component / "component.json").read_text())
    del meta["hyperparameters"]
    (component / "component.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="lacks hyperparameters"):
        read_component(component)


def test_zero_stage_2_trains_and_resumes(teacher_dir, tmp_path):
    cfg = TRAIN.model_copy(update={"zero_stage": 2, "max_steps": 2, "epochs": 2})
    first = run_training(BASE, cfg, teacher_dir, tmp_path / "z", TrackerRef())
    assert len(first["history"]) == 2
    more = run_training(BASE, cfg.model_copy(update={"max_steps": 3}), teacher_dir, tmp_path / "z", TrackerRef())
    assert [s for s, _ in more["history"]] == [1, 2, 3] and more["history"][:2] == first["history"]


def test_a_hundred_epts_per_prompt_token(teacher_dir):
    base = load_base_model("tiny-llama", quantization="nf4", for_training=True)
    k, n = 3, 100
    prompt = PromptTokens(k, n, base.model.config.hidden_size, aggregation="learned",
                          init=init_from_token_embeddings(base.model.get_input_embeddings(), k, n))
    seqs = list(TeacherCache(teacher_dir).sequences("train"))[:1]
    batch = collate(seqs, k, n, 2, "ensemble", random.Random(0))
    emb, weights = prompt()
    logp = student_logprobs(base.model, emb, weights, k, n, batch)
    assert logp.shape[-2:] == (k, base.model.config.vocab_size)
    logp[batch.target_valid][:, 7].sum().backward()  # any token's log-probability
    assert prompt.embeddings.grad.abs().sum() > 0 and prompt.ept_weights.grad.abs().sum() > 0


def test_ept_head_two_stage_trains_the_head_from_its_start_step_only(teacher_dir, tmp_path):
    """2-stage ept-head: the prompt tokens alone first (the head is left out, so those steps are exactly
    ept's: an ept run's losses), then both at the lower lr; the base model stays bit-identical."""
    cfg = train_as("ept-head", groups_per_sequence=4, epochs=2, max_steps=3, head_start_step=2, head_lr_scale=0.5)
    result = run_training(BASE, cfg, teacher_dir, tmp_path / "train", TrackerRef())
    losses = [loss for _, loss in result["history"]]
    ept = run_training(BASE, train_as("ept", groups_per_sequence=4, max_steps=2), teacher_dir, tmp_path / "ept",
                       TrackerRef())
    assert losses[:2] == pytest.approx([loss for _, loss in ept["history"]], rel=1e-6) and len(losses) == 3
    from ppdkit.models.state_io import load_state

    states = {s: load_state(tmp_path / "train" / "checkpoints" / f"step-{s:06d}" / "rank-0")["module"] for s in (2, 3)}
    assert not states[2]["head.weight"].any() and not states[2]["head.bias"].any()  # untouched in stage 1
    assert states[3]["head.weight"].abs().sum() > 0 and states[3]["head.bias"].abs().sum() > 0
    component = read_component(tmp_path / "train" / "component",
                               expect_fingerprint=load_base_model("tiny-llama").fingerprint)
    assert component.method == "ept-head" and component.hyperparameters["head_start_step"] == 2
    assert component.tensors["head_weight"].shape == (64, 64) and component.tensors["head_bias"].shape == (64,)


def test_warmup_steps_start_the_lr_low_on_the_deepspeed_run(teacher_dir, tmp_path):
    """train.warmup_steps scales the first steps' lr on the workers' schedule: AdamW's first update moves each weight
    by about lr times the factor, so over 1000 warm-up steps the prompt tokens move about 0.01/1000 after step 1."""
    from ppdkit.models.state_io import load_state
    from ppdkit.trainer.training_methods import TRAINING_METHODS

    cfg = train_as("ept", groups_per_sequence=4, warmup_steps=1000, max_steps=1)
    run_training(BASE, cfg, teacher_dir, tmp_path / "train", TrackerRef())
    start = TRAINING_METHODS["ept"].start(cfg, load_base_model("tiny-llama"), []).module.state_dict()
    after = load_state(tmp_path / "train" / "checkpoints" / "step-000001" / "rank-0")["module"]
    moved = max((after[k] - start[k]).abs().max().item() for k in start)
    assert 0 < moved < 3 * cfg.lr / cfg.warmup_steps, moved  # without the warm-up: about cfg.lr


def test_the_warmup_factor_rises_linearly_and_multiplies_the_schedule():
    from ppdkit.trainer.training_methods import cosine, warmed, warmup

    assert [warmup(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup(0, 0) == 1.0
    decay = lambda s: cosine(s, 10)  # noqa: E731
    assert warmed(decay, 0) is decay
    assert warmed(decay, 4)(1) == pytest.approx(0.5 * cosine(1, 10)) and warmed(decay, 4)(7) == cosine(7, 10)
    with pytest.raises(ValueError):
        TrainConfig(warmup_steps=-1)


def test_a_head_step_changes_only_the_drafts(teacher_dir):
    """One 1-stage ept-head step on the 4-bit base: prompt tokens and head move, the base stays bit-identical."""
    from ppdkit.trainer.training_methods import TRAINING_METHODS

    base = load_base_model("tiny-llama", quantization="nf4", for_training=True)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    cfg = TrainConfig(method="ept-head", num_prompt_tokens=3, num_epts=1)
    run = TRAINING_METHODS["ept-head"].start(cfg, base, [])
    drafts = run.module
    groups, _ = run.param_groups(total_steps=10)
    opt = torch.optim.AdamW(groups, lr=0.01)
    batch = collate(list(TeacherCache(teacher_dir).sequences("train"))[:2], 3, 1, 4, "ensemble", random.Random(0))
    emb, weights, head = drafts(run.head_active(0))
    logp = student_logprobs(base.model, emb, weights, 3, 1, batch, head).flatten(0, 1)
    per = kl_to_compressed_teacher(logp, batch.teacher_ids.flatten(0, 1), batch.teacher_logp.flatten(0, 1),
                                   batch.teacher_rest.flatten(0, 1))
    decay_mean(per, batch.target_valid.flatten(0, 1), 0.8).backward()
    opt.step()
    assert drafts.head.weight.abs().sum() > 0 and drafts.prompt.embeddings.grad.abs().sum() > 0
    after = base.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(p.grad is None for p in base.model.parameters())


def test_training_subsets_are_nested_and_hold_the_positions_asked_for():
    from types import SimpleNamespace

    from ppdkit.trainer.worker import subset_of_positions

    seqs = [SimpleNamespace(positions=list(range(n))) for n in [5, 50, 7, 300, 12, 80, 33, 1, 64, 9] * 10]
    small, large = (subset_of_positions(seqs, n, seed=0) for n in (500, 2000))
    assert 500 <= sum(len(s.positions) for s in small) < 500 + 300  # stops at the first sequence past the mark
    assert {id(s) for s in small} < {id(s) for s in large}  # nested: the larger set holds the smaller
    where = {id(s): i for i, s in enumerate(seqs)}
    assert [where[id(s)] for s in large] == sorted(where[id(s)] for s in large)  # in cache order
    assert subset_of_positions(seqs, 10**9, seed=0) == seqs
    assert subset_of_positions(seqs, 500, seed=1) != small  # the seed picks the subset


@pytest.mark.parametrize("method, settings", [("eagle3", {"head_depth": 2, "draft_vocab": 96}),
                                              ("feature-head", {"head_depth": 2, "draft_vocab": 96, "head_inner": 16}),
                                              ("ept", {})])
def test_a_run_starts_from_a_trained_components_weights_and_vocabulary(teacher_dir, tmp_path, method, settings):
    """train.init_from: every tensor (the draft vocabulary too, whatever this run's data would give) is the
    component's, and the run's token maps follow its vocabulary; another method, other shapes or another base
    model are refused with the key to change."""
    from ppdkit.models.artifact import write_component
    from ppdkit.trainer.training_methods import TRAINING_METHODS
    from ppdkit.trainer.warm_start import starting_component

    base = load_base_model("tiny-llama", for_training=True)
    seqs = [s for s in TeacherCache(teacher_dir).sequences("train") if len(s.positions) > 1]
    cfg = TrainConfig(method=method, **settings)
    fresh = TRAINING_METHODS[method].start(cfg, base, seqs)
    gen = torch.Generator().manual_seed(1)
    trained = {name: (t.flip(0) if name == "draft_vocab" else t + torch.randn(t.shape, generator=gen))
               for name, t in fresh.export_tensors(fresh.module.state_dict()).items()}
    write_component(tmp_path / "c", method, fresh.hyperparameters(), base.name, base.fingerprint, {}, trained)
    cfg = cfg.model_copy(update={"init_from": str(tmp_path / "c")})
    run = TRAINING_METHODS[method].start(cfg, base, seqs, starting_component(cfg, base.fingerprint))
    loaded = run.export_tensors(run.module.state_dict())
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)
    assert all(not torch.equal(loaded[k], t) for k, t in fresh.export_tensors(fresh.module.state_dict()).items())
    if "draft_vocab" in trained:  # a token's draft index is its place in the component's vocabulary
        assert torch.equal(run.vocab_index[trained["draft_vocab"]], torch.arange(len(trained["draft_vocab"])))
        with pytest.raises(ArtifactError, match="set train.draft_vocab to the component's"):
            starting = cfg.model_copy(update={"draft_vocab": 64})
            TRAINING_METHODS[method].start(starting, base, seqs, starting_component(starting, base.fingerprint))
    with pytest.raises(ArtifactError, match=f"is a {method} component; a run of train.method medusa"):
        starting_component(TrainConfig(method="medusa", init_from=cfg.init_from), base.fingerprint)
    with pytest.raises(ArtifactError, match="trained for base model tiny-llama"):
        starting_component(cfg, "sha256:" + "1" * 64)
    if method == "ept":
        wider = cfg.model_copy(update={"num_epts": 2})
        with pytest.raises(ArtifactError, match="prompt_embeddings .* set the train keys that size them"):
            TRAINING_METHODS[method].start(wider, base, seqs, starting_component(wider, base.fingerprint))


@pytest.mark.parametrize("method, settings", [("eagle3", {"head_depth": 2}),
                                              ("feature-head", {"head_depth": 2, "head_inner": 16})])
def test_a_larger_draft_vocab_grows_the_starting_components(teacher_dir, tmp_path, method, settings):
    """train.init_from with a larger train.draft_vocab: the component's tokens stay, this run's most frequent
    other tokens join them (ascending ids, as the export needs), a component token's readout row is the
    component's wherever it now sits, and a new token's row starts as a fresh run's (the base's LM-head row)."""
    from ppdkit.models.artifact import write_component
    from ppdkit.trainer.training_methods import TRAINING_METHODS
    from ppdkit.trainer.warm_start import starting_component

    base = load_base_model("tiny-llama", for_training=True)
    seqs = [s for s in TeacherCache(teacher_dir).sequences("train") if len(s.positions) > 1]
    start = TRAINING_METHODS[method].start
    frequent = {n: start(TrainConfig(method=method, draft_vocab=n, **settings), base, seqs) for n in (24, 96)}
    # the component's 64 tokens: rare ones, none of the 96 most frequent, so growth must come from the data
    rare = torch.tensor(sorted(set(range(base.model.config.vocab_size))
                               - set(frequent[96].module.draft_vocab.tolist()))[:64])
    fresh = start(TrainConfig(method=method, draft_vocab=64, **settings), base, seqs)
    gen = torch.Generator().manual_seed(1)
    trained = {name: (rare if name == "draft_vocab" else t + torch.randn(t.shape, generator=gen))
               for name, t in fresh.export_tensors(fresh.module.state_dict()).items()}
    write_component(tmp_path / "c", method, fresh.hyperparameters(), base.name, base.fingerprint, {}, trained)
    cfg = TrainConfig(method=method, draft_vocab=88, init_from=str(tmp_path / "c"), **settings)
    run = start(cfg, base, seqs, starting_component(cfg, base.fingerprint))
    loaded = run.export_tensors(run.module.state_dict())
    vocab = loaded["draft_vocab"]
    assert torch.equal(vocab, torch.cat([rare, frequent[24].module.draft_vocab]).sort().values)
    assert torch.equal(run.vocab_index[vocab], torch.arange(88))
    kept = run.vocab_index[rare]
    for name, t in loaded.items():
        if name == "draft_vocab":
            continue
        if method == "eagle3" and name == "lm_head.weight":
            assert torch.equal(t[kept], trained[name])
            new = torch.ones(88, dtype=torch.bool).index_fill(0, kept, False)
            assert torch.equal(t[new], base.model.get_output_embeddings().weight.detach().float()[vocab[new]])
        else:
            assert torch.equal(t, trained[name])
    with pytest.raises(ArtifactError, match="or larger, to grow its vocabulary"):
        smaller = cfg.model_copy(update={"draft_vocab": 32})
        start(smaller, base, seqs, starting_component(smaller, base.fingerprint))
