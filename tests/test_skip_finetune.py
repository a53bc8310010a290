"""The aggressive-skip fine-tune (D&V paper appendix F; ppdkit/trainer/skip_finetune_run.py, runtime `skip-ft`): the
training forward is the runtime draft's first guess exactly, a training step changes only the draft's norms,
and a fine-tuned draft (any norms, any draft vocabulary) never changes greedy output."""

import random
from types import SimpleNamespace

import pytest
import torch
from conftest import lossless_on_random_prompts, plain_tiny_decoder, tiny_model_on

import ppdkit.runtime.drafters.layer_skip as layer_skip
from ppdkit.models.artifact import ArtifactError, write_component
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import LayerSkipParts
from ppdkit.runtime.drafters.layer_skip import DraftExit, SkipDraft
from ppdkit.runtime.forward.llama import LeanLlama
from ppdkit.trainer.config import TrainConfig
from ppdkit.trainer.skip_draft import DraftNorms, draft_states
from ppdkit.trainer.skip_finetune_run import SkipFinetuneRun, aggressive_skip_map

RANKING = ["mlp_1", "attention_0", "attention_1", "mlp_0"]


def _noisy_norms(model, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The base model's norms times random factors: a draft whose norms moved far from the base model's."""
    g = torch.Generator().manual_seed(seed)
    return tuple((t * (0.5 + torch.rand(t.shape, generator=g))).detach() for t in DraftNorms(model)())


def test_aggressive_skip_map_takes_the_top_of_the_ranking():
    assert aggressive_skip_map(RANKING, 2, 0.25) == (0, 2)  # 1 of 4 sub-layers: layer 1's MLP
    assert aggressive_skip_map(RANKING, 2, 0.5) == (1, 2)
    assert aggressive_skip_map(RANKING, 2, 0.75) == (1, 3)


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_the_training_forward_is_the_runtime_drafts_first_guess(path, monkeypatch):
    """At every position t, draft_states equals the runtime draft reading token t on the cache the whole model
    committed for tokens < t: what the fine-tune optimises is what decoding runs."""
    model, _ = tiny_model_on(path, monkeypatch)
    lean = LeanLlama(model)
    assert (lean.native is not None) == (path == "native")
    rng = random.Random(0)
    for case in range(4):
        ids = torch.tensor([rng.randrange(3, 300) for _ in range(20)])
        skip = tuple(rng.randrange(4) for _ in lean.layers)
        norms = _noisy_norms(model, case)
        with torch.no_grad():
            trained = draft_states(model, ids[None], skip, norms)[0]  # [T, H]
        draft = lean.with_norms(*norms)
        for t in (0, 7, 19):
            cache = lean.new_cache(32)
            if t:
                lean.forward(lean.embed_ids(ids[:t]), torch.arange(t), cache, None)
                cache.commit(None, t)
            runtime = draft.forward(draft.embed_ids(ids[t:t + 1]), torch.tensor([t]), cache, None, skip)[0]
            torch.testing.assert_close(runtime, trained[t], atol=2e-5, rtol=1e-4, msg=f"case {case} position {t}")


def test_without_skips_the_training_forward_is_the_base_model(monkeypatch):
    model, _ = tiny_model_on("pytorch", monkeypatch)  # the fixture: a bare MonkeyPatch() was never undone, and left
    # every later test of the process without the native kernels
    ids = torch.randint(3, 300, (2, 17))
    with torch.no_grad():
        ours = draft_states(model, ids, (0,) * model.config.num_hidden_layers, DraftNorms(model)())
        torch.testing.assert_close(ours, model.get_decoder()(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5)


def _sequences(count: int, seed: int = 0):
    """Teacher-cache-like sequences: ids, every position supervised, a top-4 teacher distribution."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for row in range(count):
        ids = torch.randint(3, 300, (12,), generator=g)
        logp = torch.log_softmax(torch.randn(11, 4, generator=g), -1)
        out.append(SimpleNamespace(row=row, input_ids=ids, positions=torch.arange(11),
                                   topk_ids=torch.randint(3, 300, (11, 4), generator=g), topk_logprobs=logp))
    return out


def test_a_training_step_changes_only_the_drafts_norms(tiny_dir, monkeypatch):
    import ppdkit.trainer.skip_finetune_run as run_module

    base = load_base_model(str(tiny_dir), for_training=True)
    monkeypatch.setattr(run_module, "searched_ranking", lambda *a: (RANKING, {}))
    cfg = TrainConfig(method="skip-finetune", skip_from="unused", skip_ratio=0.25, draft_vocab=64, lr=0.05)
    run = SkipFinetuneRun(SimpleNamespace(name="skip-finetune"), cfg, base, _sequences(6))
    assert run.skip == (0, 2) and len(run.module.draft_vocab) == 64
    frozen = {k: v.clone() for k, v in base.model.state_dict().items()}
    before = {k: v.detach().clone() for k, v in run.module.named_parameters()}
    optimizer = torch.optim.AdamW(run.module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)  # as the worker
    loss, positions = run.loss(run.module, _sequences(2, seed=1), random.Random(0), 0)
    loss.backward()
    optimizer.step()
    assert positions > 0 and torch.isfinite(loss)
    assert all(not p.requires_grad for p in base.model.parameters())
    assert all(torch.equal(frozen[k], v) for k, v in base.model.state_dict().items())  # the verifier is untouched
    after = dict(run.module.named_parameters())
    assert not torch.equal(before["norm"], after["norm"])
    assert not torch.equal(before["ln1"][0], after["ln1"][0]) and not torch.equal(before["ln2"][0], after["ln2"][0])
    assert torch.equal(before["ln2"][1], after["ln2"][1])  # layer 1's MLP is skipped: its norm never trains
    figures = run.evaluate(run.module, _sequences(3, seed=2), 1)
    assert 0.0 <= figures["acc_top1_mean"] <= figures["acc_top5_mean"] <= 1.0


def _fine_tuned(decoder, model, skip, seed: int, vocab_size: int) -> SkipDraft:
    vocab = torch.randperm(model.config.vocab_size, generator=torch.Generator().manual_seed(seed))[:vocab_size]
    return SkipDraft.fine_tuned(decoder.model, model.get_output_embeddings().weight.detach(), skip,
                                *_noisy_norms(model, seed), vocab.sort().values)


@pytest.mark.parametrize("path", ["native", "native-q4", "pytorch"])
def test_fine_tuned_drafts_never_change_greedy_output(path, monkeypatch):
    decoder = plain_tiny_decoder(path, monkeypatch)
    model, layers = decoder.hf_model, len(decoder.model.layers)
    rng = random.Random(1)
    for case in range(3):
        skip = tuple(rng.randrange(4) for _ in range(layers))
        decoder.draft = LayerSkipParts(skip_map=skip, fine_tuned=_fine_tuned(decoder, model, skip, case,
                                                                            rng.choice((16, 200))))
        monkeypatch.setattr(layer_skip, "DraftExit", lambda: DraftExit(gamma=rng.choice((0.0, 0.3))))
        pairs = lossless_on_random_prompts(decoder, "skip-ft", 24, cases=6)
        assert all(out.rows_per_step for _, out in pairs)


def test_a_fine_tuned_draft_with_the_base_norms_and_vocabulary_drafts_as_skip(monkeypatch):
    decoder = plain_tiny_decoder("pytorch", monkeypatch)
    model = decoder.hf_model
    skip = (2, 1)
    decoder.draft = LayerSkipParts(skip_map=skip, fine_tuned=SkipDraft.fine_tuned(
        decoder.model, model.get_output_embeddings().weight.detach(), skip, *DraftNorms(model)(),
        torch.arange(model.config.vocab_size)))
    for ids in ([5, 6, 7], [9, 3, 9, 3, 9]):
        a, b = decoder.generate(ids, max_new_tokens=20, method="skip"), decoder.generate(ids, max_new_tokens=20,
                                method="skip-ft")
        assert a.tokens == b.tokens and a.accepted_per_step == b.accepted_per_step and a.rows_per_step == b.rows_per_step


def _component(tmp_path, tiny_dir, tensors: dict, skip=(1, 2)):
    base = load_base_model(str(tiny_dir))
    out = tmp_path / "component"
    write_component(out, "skip-finetune", {"skip_map": list(skip)}, str(tiny_dir), base.fingerprint, {}, tensors)
    return out, base


def test_a_skip_finetune_component_loads_and_a_damaged_one_is_refused(tmp_path, tiny_dir):
    base = load_base_model(str(tiny_dir))
    ln1, ln2, norm = DraftNorms(base.model)()
    good = {"skip_ln1": ln1.detach(), "skip_ln2": ln2.detach(), "skip_norm": norm.detach(),
            "draft_vocab": torch.arange(40)}
    directory, _ = _component(tmp_path / "good", tiny_dir, good)
    decoder = Decoder.from_pretrained(directory)
    assert {"skip", "skip-ft"} <= set(decoder.methods()) and decoder.draft.skip_map == (1, 2)
    assert decoder.generate([5, 6, 7], max_new_tokens=10, method="skip-ft").tokens == decoder.generate([5, 6, 7],
                            max_new_tokens=10, method="ar").tokens
    for name, bad, match in (("nan", {**good, "skip_norm": torch.full_like(good["skip_norm"], float("nan"))},
                              "non-finite"),
                             ("shape", {**good, "skip_ln1": good["skip_ln1"][:1]}, "needs"),
                             ("vocab", {**good, "draft_vocab": torch.tensor([3, 3, 10**6])}, "distinct token ids")):
        directory, _ = _component(tmp_path / name, tiny_dir, bad)
        with pytest.raises(ArtifactError, match=match):
            Decoder.from_pretrained(directory)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf"), 1e30, None])
@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_poisoned_draft_norms_cannot_change_greedy_output(path, poison, monkeypatch):
    """A fine-tuned draft whose norms hold NaN, inf or huge values (None: all kinds at once, beside ordinary ones)
    drafts garbage; verification keeps every output token plain decoding's."""
    decoder = plain_tiny_decoder(path, monkeypatch)
    model = decoder.hf_model
    g = torch.Generator().manual_seed(7)
    norms = []
    for t in DraftNorms(model)():
        t = t.detach().clone()
        if poison is None:
            kinds = torch.randint(0, 4, t.shape, generator=g)
            t[kinds == 0], t[kinds == 1], t[kinds == 2] = float("nan"), float("inf"), -3e38
        else:
            t[torch.rand(t.shape, generator=g) < 0.5] = poison
        norms.append(t)
    skip = (1, 0)
    decoder.draft = LayerSkipParts(skip_map=skip, fine_tuned=SkipDraft.fine_tuned(
        decoder.model, model.get_output_embeddings().weight.detach(), skip, *norms, torch.arange(50, 250)))
    lossless_on_random_prompts(decoder, "skip-ft", 20, cases=5)
