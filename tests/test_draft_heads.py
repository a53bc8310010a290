"""Draft heads over the base model's features (feature-head, medusa): training on Ray Train workers with
recorded losses, only the heads move, calibration and decoding from the trained component, and the lossless
property whatever the heads hold (poisoned heads on both kernel paths, random heads and trees in float64
against transformers' greedy, an oracle drafter whose guesses are often right so the accepted paths and
cache pruning run)."""

import dataclasses
import logging
import math
import random

import pytest
import torch
from conftest import hf_greedy, tiny_model_on
from test_lossless import _random_early_head
from test_training import BASE, DATA, train_as

import ppdkit.runtime.drafters.heads_drafter as draft_heads_module
from ppdkit.data_pipeline.config import TeacherConfig
from ppdkit.data_pipeline.teacher_cache import TeacherCache, TeacherCacheError
from ppdkit.data_pipeline.teacher_stage import run_teacher_stage
from ppdkit.models.artifact import ArtifactError, read_component
from ppdkit.models.draft_heads import DraftHeads, frequent_tokens
from ppdkit.models.loading import load_base_model
from ppdkit.registry.tracking import TrackerRef
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import HeadParts
from ppdkit.runtime.drafters.heads_drafter import DraftHeadSet, head_tree
from ppdkit.runtime.kernels.native import native_kernels
from ppdkit.runtime.trees.tree import candidate_tree
from ppdkit.bench.head_features import features_benchmark
from ppdkit.trainer.calibrate import calibrate
from ppdkit.trainer.config import TrainConfig, methods_taking
from ppdkit.trainer.launch import run_training
from ppdkit.trainer.training_methods import TRAINING_METHODS

HIDDEN, VOCAB = 64, 384
# The head methods' keys on top of test_training's TRAIN; each method takes those its section has (head_inner: the
# feature head's alone, head_depth: not the early head's).
HEAD_KEYS = {"groups_per_sequence": 4, "head_depth": 3, "draft_vocab": 128, "head_inner": 32, "lr": 0.001}


def head_train(method: str, **keys) -> TrainConfig:
    return train_as(method, **{**{k: v for k, v in HEAD_KEYS.items() if method in methods_taking(k)}, **keys})


# Losses of the first two steps of head_train(method) on the fixture (tiny-llama, fp32 base, one rank), recorded once.
RECORDED_LOSSES = {"feature-head": [3.59656978, 3.53307724], "medusa": [3.17872214, 3.13449407]}
RECORDED_EARLY_LOSSES = [4.36969185, 4.26675987]


def _heads(kind: str, depth: int, g: torch.Generator, model, vocab: torch.Tensor, scale: float = 0.1,
           dtype=torch.float32, matrices=None) -> DraftHeadSet:
    module = DraftHeads(kind, HIDDEN, depth, 32, seed=int(torch.randint(0, 1000, (), generator=g)))
    tensors = tuple((t.detach() + scale * torch.randn(t.shape, generator=g)).to(dtype) for t in module())
    return DraftHeadSet(kind, tensors, vocab, model.get_output_embeddings().weight.detach()[vocab].to(dtype), depth,
                        matrices)


def test_heads_train_on_the_features_the_teacher_kept(teacher_dir, tmp_path):
    """The same cache with teacher.features: the feature head's first losses are the recorded ones (the kept
    float16 states are those it computed itself), and they change when the kept states are zeroed: it read them."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    features_dir = teacher_dir.parent / "features"  # the session fixture made it beside the plain cache
    assert TeacherCache(features_dir).has_features and not TeacherCache(teacher_dir).has_features
    cfg = head_train("feature-head")
    result = run_training(BASE, cfg, features_dir, tmp_path / "train", TrackerRef())
    assert [loss for _, loss in result["history"]] == pytest.approx(RECORDED_LOSSES["feature-head"], rel=1e-3)
    zeroed = shutil.copytree(features_dir, tmp_path / "zeroed")
    for path in zeroed.glob("*/*.features.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            shape = f.get_slice("features").get_shape()
        save_file({"features": torch.zeros(shape, dtype=torch.float16)}, str(path))
    result = run_training(BASE, cfg, zeroed, tmp_path / "train-zeroed", TrackerRef())
    assert [loss for _, loss in result["history"]] != pytest.approx(RECORDED_LOSSES["feature-head"], rel=1e-3)


def test_features_computed_in_training_are_the_teachers(teacher_dir, tmp_path):
    """A bfloat16 teacher that kept no features: the workers compute them from the base in bfloat16 on the teacher's
    engine (the decoder's runtime here where its kernels run bfloat16), as the teacher did, so the feature head's
    losses are those on the same cache with the features kept; calibration too computes in the teacher's dtype and
    engine (its targets are the greedy tokens of the model the decoder verifies with)."""
    teacher = TeacherConfig(workers=1, top_k=16, compute_dtype="bfloat16")
    for name, kept in (("computed", False), ("kept", True)):
        run_teacher_stage(BASE, DATA, teacher.model_copy(update={"features": kept}), teacher_dir.parent / "data",
                          tmp_path / name / "teacher")
    computed = TeacherCache(tmp_path / "computed" / "teacher")
    assert computed.compute_dtype == "bfloat16"
    # on the runtime where its native kernels run bfloat16 (both passes), else through transformers (both too)
    assert computed.teacher_engine == ("runtime" if native_kernels() and native_kernels().bf16_available()
                                       else "transformers")
    cfg = head_train("feature-head")
    losses = {name: [loss for _, loss in run_training(BASE, cfg, tmp_path / name / "teacher", tmp_path / name / "train",
                                                      TrackerRef())["history"]] for name in ("computed", "kept")}
    # measured: 3e-6 apart (the teacher's padded batches); float32 features instead of the teacher's were 1.3e-4
    assert losses["computed"] == pytest.approx(losses["kept"], rel=2e-5)
    trees = calibrate("tiny-llama", tmp_path / "computed" / "train" / "component", tmp_path / "computed" / "teacher",
                      [4], 4, 4, 8, 2)
    assert trees["dtype"] == "bfloat16" and trees["trees"]["4"]["tau"] >= 1.0


@pytest.mark.parametrize("engine, dtype, path, on_runtime", [
    ("runtime", "float32", "native", True), ("transformers", "float32", "native", False),
    ("runtime", "q4", "native", False), ("runtime", "float32", "pytorch", False)])
def test_features_are_computed_on_the_engine_the_teacher_ran_on(engine, dtype, path, on_runtime, monkeypatch, caplog):
    """A runtime teacher's features are computed on the runtime again, the final states and EAGLE-3's layers each
    what reading the sequence as `ar` does gives; a transformers teacher's, or a 4-bit one's (held de-quantized),
    through transformers; without the native kernels here, through transformers with a warning."""
    from types import SimpleNamespace

    from ppdkit.runtime.drafters.drafter import read_prompt
    from ppdkit.runtime.forward.layer_states import forward_with_states
    from ppdkit.trainer.features import FeatureCache, teacher_runtime

    model, _ = tiny_model_on(path, monkeypatch)
    cache = SimpleNamespace(teacher_engine=engine, compute_dtype=dtype, dir="cache")  # what teacher_runtime reads
    runtime = teacher_runtime(model, cache)
    assert (runtime is not None) == on_runtime
    assert ("cannot run here" in caplog.text) == (path == "pytorch")
    if runtime is None:
        return
    ids = torch.randint(3, 200, (23,), generator=torch.Generator().manual_seed(0))
    final, layers = FeatureCache(model), FeatureCache(model, (1, 2))
    for features in (final, layers):
        features.compute_on(runtime)
    seq = SimpleNamespace(features=None, row=0, input_ids=ids)
    expected = read_prompt(runtime, ids, runtime.new_cache(len(ids))).to(torch.float16).float()
    assert torch.equal(final(seq, "train"), expected)
    _, states = forward_with_states(runtime, runtime.embed_ids(ids), torch.arange(len(ids)),
                                    runtime.new_cache(len(ids)), None, (1, 2))
    assert torch.equal(layers(seq, "train"), states.to(torch.bfloat16).float())


def test_features_on_disk_are_written_once_read_by_a_later_run_and_never_trusted_stale(tmp_path, monkeypatch,
                                                                                       caplog):
    """train.features_on_disk: the first visit computes a sequence's states and writes them; a later cache (another
    worker or run) reads the same numbers without running the base; a file computed from other token ids (a cache
    rebuilt since) or cut short is computed again and rewritten, with a warning; other layers get another folder."""
    from types import SimpleNamespace

    from ppdkit.trainer import features as features_module
    from ppdkit.trainer.features import FeatureCache, feature_store

    caplog.set_level(logging.INFO, logger="ppdkit")
    model, _ = tiny_model_on("pytorch", monkeypatch)
    cache = SimpleNamespace(dir=tmp_path / "teacher", float_dtype="float32")
    store = feature_store(cache, (1, 2), None)
    assert store != feature_store(cache, (1, 3), None) != feature_store(cache, None, None)
    ids = torch.randint(3, 200, (23,), generator=torch.Generator().manual_seed(0))
    seq = SimpleNamespace(features=None, row=7, input_ids=ids)
    first = FeatureCache(model, (1, 2), keep_bytes=0)  # nothing kept in memory: every visit goes to the disk
    first.keep_on_disk(store, positions=23, hidden=HIDDEN)
    computed = first(seq, "train")
    assert (store / "train" / "7.safetensors").exists() and not list(store.glob("*/*.partial"))

    later = FeatureCache(model, (1, 2))
    later.keep_on_disk(store, positions=23, hidden=HIDDEN)
    with monkeypatch.context() as patched:
        patched.setattr(later, "_compute", lambda ids: pytest.fail("the states were on disk"))
        assert torch.equal(later(seq, "train"), computed)
    assert "256 bytes a position" in caplog.text and "files there already: 1" in caplog.text  # 2 x 64 x 2 layers

    rebuilt = SimpleNamespace(features=None, row=7, input_ids=ids.flip(0))  # row 7 of a cache rebuilt since
    expected = FeatureCache(model, (1, 2))(rebuilt, "train")
    assert torch.equal(first(rebuilt, "train"), expected)
    assert "another sequence's states" in caplog.text
    with monkeypatch.context() as patched:  # rewritten: read back without computing
        patched.setattr(first, "_compute", lambda ids: pytest.fail("the rewritten states were on disk"))
        assert torch.equal(first(rebuilt, "train"), expected)

    path = store / "train" / "7.safetensors"
    path.write_bytes(path.read_bytes()[:40])  # cut short
    assert torch.equal(first(rebuilt, "train"), expected) and "cannot read" in caplog.text
    assert features_module.ids_digest(ids) != features_module.ids_digest(ids.flip(0))


def test_the_features_benchmark_times_kept_against_computed_features(teacher_dir):
    features_dir = teacher_dir.parent / "features"
    cfg = head_train("feature-head", micro_batch=2)
    report = features_benchmark(BASE, cfg, features_dir, batches=2, threads=1)
    kept, computed = report["results"]
    assert report["batches"] == 2 and kept["positions"] == computed["positions"] > 0  # the same paths in both modes
    assert report["speedup"] == pytest.approx(kept["positions_per_second"] / computed["positions_per_second"])
    on_disk = sum(p.stat().st_size for p in features_dir.glob("*/*.features.safetensors"))
    assert report["feature_bytes"] == on_disk and report["compute_dtype"] == "float32"
    with pytest.raises(TeacherCacheError, match="keeps no features to compare with"):
        features_benchmark(BASE, cfg, teacher_dir)
    with pytest.raises(ValueError, match="train.method ept trains no head"):
        features_benchmark(BASE, TrainConfig(method="ept", micro_batch=2), features_dir)
    with pytest.raises(ValueError, match="the benchmark needs a warm-up batch"):
        features_benchmark(BASE, cfg.model_copy(update={"micro_batch": 8}), features_dir)


def _random_tree(rng: random.Random, depth: int, size: int):
    table = [sorted((rng.random() * 0.5 for _ in range(4)), reverse=True) for _ in range(depth)]
    parents, depths, ranks, _ = candidate_tree(table, depth, size - 1)
    return head_tree(parents, depths, ranks)


def _decoder(model, tok, heads: DraftHeadSet, tree, **weights) -> Decoder:
    return Decoder(model, tok, HeadParts(heads=heads, trees={} if tree is None else {0: tree}), **weights)


@pytest.mark.parametrize("method", ["feature-head", "medusa"])
def test_two_steps_match_the_recorded_losses(method, teacher_dir, tmp_path):
    cfg = head_train(method)
    result = run_training(BASE, cfg, teacher_dir, tmp_path / "train", TrackerRef())
    losses = [loss for _, loss in result["history"]]
    print(method, "losses:", losses)
    assert losses == pytest.approx(RECORDED_LOSSES[method], rel=1e-4)
    fingerprint = load_base_model("tiny-llama").fingerprint
    component = read_component(tmp_path / "train" / "component", expect_fingerprint=fingerprint)
    assert component.method == method and component.hyperparameters["head_depth"] == 3
    assert component.tensors["draft_vocab"].shape == (128,)
    assert set(result["best"]) >= {"acc_top1_d1", "acc_top5_d3", "acc_top10_mean", "draft_vocab_coverage"}
    with pytest.raises(ArtifactError, match="trained for base model tiny-llama"):
        read_component(tmp_path / "train" / "component", expect_fingerprint="sha256:" + "1" * 64)
    # calibrated trees, then the bundled decoder runs the component: identical to plain greedy decoding
    trees = calibrate("tiny-llama", tmp_path / "train" / "component", teacher_dir, [4, 8], 4, 4, 8, 2)
    assert trees["kind"] == "heads" and set(trees["trees"]) == {"4", "8"}
    assert trees["trees"]["8"]["tau"] >= trees["trees"]["4"]["tau"] >= 1.0
    from ppdkit.models.artifact import add_files

    add_files(tmp_path / "train" / "component", json_files={"trees": trees})
    decoder = Decoder.from_pretrained(tmp_path / "train" / "component", tree_size=8)
    grown = ["feature-grown", "feature-grown-anpd"] if method == "feature-head" else []
    assert decoder.methods() == ["ar", "auto", "anpd", "self-draft", method, *grown] and decoder.draft.head_tree.layout.size == len(trees["trees"]["8"]["parents"])
    for prompt in ("Hello there", "Name three colors."):
        assert decoder.generate(prompt, max_new_tokens=16, method=method).tokens == decoder.generate(prompt,
                                max_new_tokens=16, method="ar").tokens
        for name in grown:  # tree_size fixes the grown trees too: every step that many nodes
            out = decoder.generate(prompt, max_new_tokens=16, method=name)
            assert out.tokens == decoder.generate(prompt, max_new_tokens=16,
                                                  method="ar").tokens and set(out.rows_per_step) <= {8, 9}
            # each step's drafting timed by part (the bench's breakdown, bench/step_breakdown.py)
            assert all({"draft.grow", "draft.chains", "draft.choose", "verify", "accept"} <= set(step)
                       for step in out.step_seconds) and len(out.step_seconds) == out.steps - 1
    assert all(decoder.step_rows(name) == 8 for name in grown)
    with pytest.raises(ValueError, match="method ppd needs prompt tokens"):
        decoder.generate("Hi", max_new_tokens=4, method="ppd")


@pytest.mark.parametrize("method", ["feature-head", "medusa", "early-head"])
def test_a_head_step_changes_only_the_heads(method, teacher_dir):
    """One step on the 4-bit base: the heads move, the base model stays bit-identical and gets no gradient."""
    base = load_base_model("tiny-llama", quantization="nf4", for_training=True)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    seqs = list(TeacherCache(teacher_dir).sequences("train"))[:2]
    cfg = head_train(method, **({"early_layer": 1} if method == "early-head" else {}))
    run = TRAINING_METHODS[cfg.method].start(cfg, base, seqs)
    start = {k: v.detach().clone() for k, v in run.module.state_dict().items()}
    groups, _ = run.param_groups(total_steps=10)
    opt = torch.optim.AdamW(groups, lr=0.01)
    loss, supervised = run.loss(run.module, seqs, random.Random(0), 0)
    assert supervised > 0 and torch.isfinite(loss)
    loss.backward()
    opt.step()
    moved = [k for k, v in run.module.state_dict().items() if not torch.equal(v, start[k])]
    assert sorted(moved) == sorted(k for k in start if k != "draft_vocab")
    after = base.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(p.grad is None for p in base.model.parameters())


def test_the_draft_vocabulary_is_the_most_frequent_tokens():
    ids = [torch.tensor([5, 5, 5, 9, 9, 2, 7]), torch.tensor([9, 1])]
    assert frequent_tokens(ids, 2, 12).tolist() == [5, 9]  # 9 and 5 three times each, then by id
    assert frequent_tokens(ids, 4, 12).tolist() == [1, 2, 5, 9]  # 1, 2 and 7 once: the smaller ids first
    # growing a vocabulary: the most frequent of the others; never more than the others there are
    assert frequent_tokens(ids, 2, 12, besides=torch.tensor([9, 1])).tolist() == [2, 5]
    assert len(frequent_tokens(ids, 20, 12, besides=torch.tensor([9, 1]))) == 10


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_poisoned_heads_cannot_change_greedy_output(path, monkeypatch):
    """Heads full of NaN, inf or huge values draft garbage; the verified output is still ar's exactly."""
    model, tok = tiny_model_on(path, monkeypatch)
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    vocab = torch.arange(3, VOCAB, 3)
    for case, value in enumerate((math.nan, math.inf, -math.inf, 1e30, 3e38)):
        kind, depth = ("feature", "medusa")[case % 2], 1 + case % 4
        heads = _heads(kind, depth, g, model, vocab)
        heads = dataclasses.replace(heads, tensors=tuple(torch.full_like(t, value) if i % 2 == case % 2 else t
                                                         for i, t in enumerate(heads.tensors)))
        decoder = _decoder(model, tok, heads, _random_tree(rng, depth, rng.choice([4, 8, 16, 32])))
        assert (decoder.model.native is not None) == (path == "native")  # the path under test really runs
        for seed in range(3):
            ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 16))]
            method = "feature-head" if kind == "feature" else "medusa"
            assert decoder.generate(ids, max_new_tokens=20, method=method).tokens == decoder.generate(ids,
                                    max_new_tokens=20, method="ar").tokens, (case, seed)


def test_random_heads_and_trees_never_change_greedy_output(tiny_f64):
    """Many random cases in float64 against transformers' greedy: random heads of both kinds, depths 1-5,
    every tree size the calibrate stage builds up to 64, random prompts and budgets."""
    model, tok = tiny_f64
    rng, g = random.Random(3), torch.Generator().manual_seed(3)
    for case in range(40):
        kind, depth = rng.choice(["feature", "medusa"]), rng.randint(1, 5)
        vocab = torch.tensor(sorted(rng.sample(range(VOCAB), rng.choice([16, 128, VOCAB]))))
        heads = _heads(kind, depth, g, model, vocab, scale=rng.choice([0.01, 0.3, 3.0]), dtype=torch.float64)
        decoder = _decoder(model, tok, heads, _random_tree(rng, depth, rng.choice([2, 4, 8, 16, 32, 64])))
        ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(1, 40)
        truth = hf_greedy(model, ids, budget)
        out = decoder.generate(ids, max_new_tokens=budget, method="feature-head" if kind == "feature" else "medusa")
        assert out.tokens == truth[:len(out.tokens)] and len(out.tokens) in (budget, len(truth)), case


class Oracle:
    """Replaces the heads' drafting: the true continuation on most branches (right wherever its ancestors
    are), the heads' own guesses elsewhere. `start(ids, truth)` before a generate call whose `stream` is
    `follow`, so the oracle knows what was emitted."""

    def __init__(self, monkeypatch, rng: random.Random):
        self.rng, self.real = rng, draft_heads_module.draft
        monkeypatch.setattr(draft_heads_module, "draft", self.draft)

    def start(self, ids: list[int], truth: list[int]) -> None:
        self.ids, self.truth, self.context = ids, truth, list(ids)

    def follow(self, tokens: list[int]) -> None:
        self.context.extend(tokens)

    def draft(self, model, heads, tree, feature, root):
        tokens = self.real(model, heads, tree, feature, root)
        assert self.context[-1] == root  # the root was emitted (streamed) by the step before
        truth = self.truth[len(self.context) - len(self.ids):]  # what follows the root
        for node in range(1, tree.layout.nodes):
            depth = len(tree.layout.paths[node]) - 1
            if self.rng.random() < 0.8 and depth <= len(truth):
                tokens[node] = truth[depth - 1]
        return tokens


def test_guesses_that_are_often_right_keep_the_output_exact(tiny_f64, monkeypatch):
    """An oracle drafter (the true continuation on some branches, noise on others): steps accept several
    tokens, the cache keeps only the kept path, and the output is still transformers' greedy."""
    model, tok = tiny_f64
    rng, g = random.Random(4), torch.Generator().manual_seed(4)
    oracle = Oracle(monkeypatch, rng)
    steps = emitted = 0
    for case in range(12):
        kind, depth = ("feature", "medusa")[case % 2], rng.randint(2, 5)
        heads = _heads(kind, depth, g, model, torch.arange(VOCAB), dtype=torch.float64)
        decoder = _decoder(model, tok, heads, _random_tree(rng, depth, rng.choice([8, 16, 32])))
        ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
        oracle.start(ids, hf_greedy(model, ids, 60))
        out = decoder.generate(ids, max_new_tokens=30, method="feature-head" if kind == "feature" else "medusa",
                               stream=oracle.follow)
        assert out.tokens == oracle.truth[:30], case
        steps, emitted = steps + out.steps, emitted + len(out.tokens)
    print("tokens per step", emitted / steps)
    assert emitted / steps > 1.5  # guesses were accepted, so the pruning of the cache really ran


def test_the_early_head_trains_on_the_layer_it_is_given(teacher_dir, tmp_path):
    """ProPD's early prediction head on 2 Ray workers (recorded losses): recall at K = 1..16 reported, and
    only the head moves; a layer the base model does not have is refused before any work."""
    cfg = head_train("early-head", early_layer=1)
    result = run_training(BASE, cfg, teacher_dir, tmp_path / "train", TrackerRef())
    losses = [loss for _, loss in result["history"]]
    print("early-head losses:", losses)
    assert losses == pytest.approx(RECORDED_EARLY_LOSSES, rel=1e-4)
    assert result["best"]["acc_top16_d1"] >= result["best"]["acc_top4_d1"] >= result["best"]["acc_top1_d1"]
    component = read_component(tmp_path / "train" / "component")
    assert component.method == "early-head" and component.hyperparameters["early_layer"] == 1
    assert component.tensors["early_weight"].shape == (HIDDEN, HIDDEN)
    base = load_base_model("tiny-llama", quantization="nf4", for_training=True)
    with pytest.raises(ValueError, match=r"train.early_layer=2: the head must sit after 1 .. 1 of"):
        TRAINING_METHODS["early-head"].start(cfg.model_copy(update={"early_layer": 2}), base, [])
    with pytest.raises(ValueError, match="is an early-head component: it prunes the trees of another component"):
        calibrate("tiny-llama", tmp_path / "train" / "component", teacher_dir, [4], 4, 4, 8, 2)
    with pytest.raises(ArtifactError, match="pass this one as early_head="):
        Decoder.from_pretrained(tmp_path / "train" / "component")
    from ppdkit.runtime.trees.pruning import load_early_head

    early = load_early_head(component, load_base_model("tiny-llama").model, 4)  # as an early head it loads
    assert early.layer == 1 and early.top_k == 4 and len(early.vocab) == 128


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_early_pruning_never_changes_greedy_output(path, monkeypatch):
    """Random early heads (K from 1, pruning almost everything, to the whole vocabulary, pruning nothing),
    poisoned ones, random heads and trees: feature-head-prune and medusa-prune give ar's tokens, the native
    layers and the PyTorch layers alike, and rows really were dropped."""
    model, tok = tiny_model_on(path, monkeypatch)
    rng, g = random.Random(6), torch.Generator().manual_seed(6)
    dropped = kept = 0
    for case in range(10):
        kind, depth = ("feature", "medusa")[case % 2], rng.randint(1, 4)
        decoder = _decoder(model, tok, _heads(kind, depth, g, model, torch.arange(VOCAB)),
                           _random_tree(rng, depth, rng.choice([4, 8, 16, 32])))
        decoder.draft.early_head = _random_early_head(g, model, rng.choice([1, 2, 8, 64, VOCAB]))
        if case == 9:
            decoder.draft.early_head.weight = torch.full_like(decoder.draft.early_head.weight, math.nan)
        assert (decoder.model.native is not None) == (path == "native")
        method = ("feature-head" if kind == "feature" else "medusa") + "-prune"
        for _ in range(3):
            ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 16))]
            out = decoder.generate(ids, max_new_tokens=20, method=method)
            assert out.tokens == decoder.generate(ids, max_new_tokens=20, method="ar").tokens, (case, method)
            dropped, kept = dropped + sum(out.pruned_rows), kept + len(out.pruned_rows)
    assert dropped > 0 and kept > 0


def test_early_pruning_keeps_accepted_paths_exact(tiny_f64, monkeypatch):  # noqa: F811
    """The oracle drafter (often right) under a random early head in float64: whatever survives is verified
    exactly, the cache keeps the survivors' rows in every layer, and the output is transformers' greedy."""
    model, tok = tiny_f64
    rng, g = random.Random(7), torch.Generator().manual_seed(7)
    oracle = Oracle(monkeypatch, rng)
    steps = emitted = dropped = 0
    for case in range(10):
        kind, depth = ("feature", "medusa")[case % 2], rng.randint(2, 4)
        decoder = _decoder(model, tok, _heads(kind, depth, g, model, torch.arange(VOCAB), dtype=torch.float64),
                           _random_tree(rng, depth, rng.choice([8, 16, 32])))
        decoder.draft.early_head = _random_early_head(g, model, rng.choice([32, 128, 256]), torch.float64, scale=0.05)
        ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
        oracle.start(ids, hf_greedy(model, ids, 60))
        method = ("feature-head" if kind == "feature" else "medusa") + "-prune"
        out = decoder.generate(ids, max_new_tokens=30, method=method, stream=oracle.follow)
        assert out.tokens == oracle.truth[:30], case
        steps, emitted, dropped = steps + out.steps, emitted + len(out.tokens), dropped + sum(out.pruned_rows)
    assert emitted / steps > 1.3 and dropped > 0  # accepted paths and pruned rows in the same steps
