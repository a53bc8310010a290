"""Calibration: how often each guess rank at each distance is right, on held-out data; trees from that.

The target is what the decoder will verify against: the base model's own greedy token, computed by
the same model the decoder runs (the unquantized base), at every position of the held-out text. For a
dynamic tree, the rate at distance d is measured where every nearer distance was guessed within the
ranks kept (a guess at distance d is only verified when its ancestors were accepted).
"""

import random
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.teacher_cache import TeacherCache
from ppdkit.models.artifact import read_component
from ppdkit.models.draft_heads import TENSORS, draft_logits, inverse_index, path_states
from ppdkit.models.decoding_head import HEAD_TENSORS
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.drafters.drafter import read_prompt
from ppdkit.runtime.forward.llama import LeanLlama
from ppdkit.runtime.trees.tree import best_tree_for_size, candidate_tree

from .prompt_batch import collate
from .features import teacher_runtime
from .head_batch import head_batch, path_starts
from .student import student_forward

OUTSIDE = 10**6  # the rank of a token the draft vocabulary does not hold: never guessed


def guess_ranks(base_model, component, sequences, groups: int, micro_batch: int, seed: int = 0) -> torch.Tensor:
    """[N, k]: rank of the base model's greedy token among the prompt tokens' guesses (0 = top-1)."""
    h = component.hyperparameters
    k, n = h["num_prompt_tokens"], h["num_epts"]
    emb = component.tensors["prompt_embeddings"].reshape(k * n, -1).to(base_model.dtype)
    weights = component.tensors.get("ept_weights")
    draft_head = None  # a custom decoding head is what the component's guesses go through (ppd-head)
    if HEAD_TENSORS[0] in component.tensors:
        draft_head = tuple(component.tensors[name].to(base_model.dtype) for name in HEAD_TENSORS)
    lm_head = base_model.get_output_embeddings()
    rng = random.Random(seed)
    out = []
    with torch.no_grad():
        for i in tqdm(range(0, len(sequences), micro_batch), desc="calibrating", unit="batch"):
            batch = collate(sequences[i:i + micro_batch], k, n, groups, h["mask"], rng).to(base_model.device)
            logp, hidden = student_forward(base_model, emb, weights, k, n, batch, draft_head)  # [B,G,k,V], [B,T,H]
            # greedy token of the base at t + d (ordinary positions are untouched by prompt tokens)
            insert_at = batch.position_ids.gather(1, batch.group_slots[..., 0]) - 1  # [B, G]
            at = insert_at[..., None] + torch.arange(1, k + 1, device=insert_at.device)  # [B, G, k]
            rows = torch.arange(len(at), device=at.device)[:, None, None]
            greedy = lm_head(hidden[rows, at.clamp(max=hidden.shape[1] - 1)]).argmax(-1)  # [B, G, k]
            target_logp = logp.gather(-1, greedy[..., None])  # [B, G, k, 1]
            rank = (logp > target_logp).sum(-1)  # [B, G, k]
            valid = batch.group_valid[..., None] & batch.target_valid  # [B, G, k]
            out.append(torch.where(valid, rank, torch.full_like(rank, -1)).flatten(0, 1).cpu())
    return torch.cat(out)


def head_guess_ranks(base_model, component, sequences, groups: int, seed: int = 0,
                     runtime: LeanLlama | None = None) -> torch.Tensor:
    """[N, D]: rank of the base model's greedy token among a draft head's guesses at each depth of paths along
    the held-out text (0 = top-1; OUTSIDE when the draft vocabulary lacks it; -1 where there is no target).
    `runtime`: the features and greedy tokens computed there, the teacher's engine (trainer/features.py)."""
    h, tensors = component.hyperparameters, component.tensors
    kind, depth = h["head_kind"], h["head_depth"]
    # the heads compute in float32 on the base's features, whatever dtype the base computes in (as in training)
    embed = base_model.get_input_embeddings().weight.detach().float()  # [V, H]
    vocab = tensors["draft_vocab"].long()
    vocab_index = inverse_index(vocab, embed.shape[0])
    heads = tuple(tensors[name].float() for name in TENSORS[kind])
    lm_head = base_model.get_output_embeddings()
    readout = lm_head.weight.detach()[vocab].float()  # [V', H] the LM head's rows of the draft vocabulary
    rng = random.Random(seed)
    out = []
    with torch.no_grad():
        for seq in tqdm(sequences, desc="calibrating", unit="sequence"):
            if runtime is None:
                features = base_model.get_decoder()(input_ids=seq.input_ids[None]).last_hidden_state[0]  # [T, H]
            else:
                features = read_prompt(runtime, seq.input_ids, runtime.new_cache(len(seq.input_ids)))  # [T, H]
            batch = head_batch([seq], [features], depth, vocab_index, [path_starts(seq, groups, rng)])
            logits = draft_logits(path_states(kind, heads, batch.start, batch.path_tokens, embed), readout)
            # [N, D] the base's greedy token after x_{t+j} (its own features, back in its dtype: exact)
            base_logits = (lm_head(batch.features.to(lm_head.weight.dtype)) if runtime is None
                           else runtime.logits(batch.features))
            greedy = vocab_index[base_logits.argmax(-1)]
            rank = (logits > logits.gather(-1, greedy.clamp_min(0)[..., None])).sum(-1)  # [N, D]
            rank = torch.where(greedy >= 0, rank, torch.full_like(rank, OUTSIDE))
            out.append(torch.where(batch.valid, rank, torch.full_like(rank, -1)))
    return torch.cat(out)


def head_trees(table: list[list[float]], sizes: list[int]) -> dict[str, dict]:
    """{size: {parents, depths, ranks, tau}}: the size - 1 most probable guess paths (prop. 5.6.1 without
    prompt tokens: every input token of a head tree is a node)."""
    trees = {}
    for size in sizes:
        parents, depths, ranks, probs = candidate_tree(table, len(table), size - 1)
        trees[str(size)] = {"parents": parents, "depths": depths, "ranks": ranks, "tau": 1.0 + sum(probs[1:]),
                            "size": len(parents)}
    return trees


def acceptance_table(ranks: torch.Tensor, max_rank: int) -> list[list[float]]:
    """p[d][r] = P(greedy token is guess r at distance d+1 | every nearer distance hit within max_rank)."""
    k = ranks.shape[1]
    table = []
    alive = torch.ones(len(ranks), dtype=torch.bool)
    for d in range(k):
        valid = alive & (ranks[:, d] >= 0)
        count = int(valid.sum())
        table.append([(int(((ranks[:, d] == r) & valid).sum()) / count) if count else 0.0 for r in range(max_rank)])
        alive = valid & (ranks[:, d] < max_rank)
    return table


def _online_held_out(base_name: str, online: dict, dtype: str | None, max_sequences: int):
    """(base, its dtype, held-out sequences, split, the engine) of train.online: the data stage's rows, the base on
    the runtime where its native kernels run, as the online teacher trained on it."""
    from ppdkit.runtime.forward.precision import resolve_dtype

    from .online_teacher import OnlineTeacher

    dtype = dtype or resolve_dtype(online["compute_dtype"])
    base = load_base_model(base_name, quantization="none", dtype=dtype)
    teacher = OnlineTeacher(base.model, online["top_k"], keep_bytes=0)
    split = "holdout"
    sequences = teacher.split(online["data_dir"], split)
    if not sequences:
        split = "train"
        sequences = teacher.split(online["data_dir"], split)
    return base, dtype, sequences[:max_sequences], split, teacher.runtime


def calibrate(base_name: str, component_dir: Path, teacher_dir: Path, sizes: list[int], max_rank: int,
              max_sequences: int, groups: int, micro_batch: int, dtype: str | None = None,
              online: dict | None = None) -> dict:
    """`dtype` None: the one the teacher computed in, the model the decoder verifies with (the targets are its
    greedy tokens). `online` (train.online: the data stage's directory, the teacher's compute_dtype and top_k): the
    held-out sequences of the data stage, in place of the teacher cache in `teacher_dir`."""
    runtime = None
    if online is not None:
        base, dtype, sequences, split, runtime = _online_held_out(base_name, online, dtype, max_sequences)
    else:
        cache = TeacherCache(teacher_dir)
        dtype = dtype or cache.float_dtype
        base = load_base_model(base_name, quantization="none", dtype=dtype)
        split = "holdout" if cache.shards("holdout") else "train"
        sequences = [s for s in cache.sequences(split) if len(s.positions) > 1][:max_sequences]
        if dtype == cache.float_dtype:
            runtime = teacher_runtime(base.model, cache)  # the teacher's engine
    component = read_component(component_dir, expect_fingerprint=base.fingerprint)
    if "early_weight" in component.tensors:
        raise ValueError(f"{component_dir} is an early-head component: it prunes the trees of another component and "
                         "has none of its own to calibrate; run its job with --stages data,teacher,train")
    if "draft_vocab" in component.tensors:  # draft heads over the features (feature-head, medusa)
        ranks = head_guess_ranks(base.model, component, sequences, groups, runtime=runtime)
        table = acceptance_table(ranks, max_rank)
        kind, trees = "heads", head_trees(table, sizes)
    else:
        ranks = guess_ranks(base.model, component, sequences, groups, micro_batch)
        table = acceptance_table(ranks, max_rank)
        n = component.hyperparameters["num_epts"]
        kind, trees = "ppd", {str(size): best_tree_for_size(table, size, n).to_json() for size in sizes}
    return {"kind": kind, "dtype": dtype, "split": split, "sequences": len(sequences), "insertions": len(ranks),
            "max_rank": max_rank, "acceptance": table, "trees": trees}
