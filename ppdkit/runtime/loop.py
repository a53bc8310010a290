"""The decode loop every method runs: read the prompt, then draft, verify and accept until the answer ends.

A method is its drafter (runtime/drafters/drafter.py): `ar`'s proposes the root alone, ANPD's a chain from the text's
n-grams, EAGLE-3's a tree grown from its draft's confidence. The loop and the verification are the same for all.
`steps` is the loop itself, a generator that hands out each step's proposal and takes its verification back, so
that one answer (`decode`) and many answers sharing each forward (runtime/batching/batch_engine.py) run the same loop.
"""

import time
from collections.abc import Callable, Generator

import torch

from .acceptance import Sampling, pick
from .drafters.drafter import Drafter, Proposal, Verified, verify


def steps(drafter: Drafter, ids: torch.Tensor, emit: Callable[..., bool], sampling: Sampling,
          generator: torch.Generator | None) -> Generator[Proposal, Verified, None]:
    """Read the prompt ids [P], then yield each step's proposal and take its verification back (its seconds
    {"verify": ...} filled in by whoever verified; the drafting's and the drafter's accept are added here), until
    emit(step's tokens, rows=the rows it fed the model, seconds=its seconds by part; the prompt's step:
    seconds={"prompt": ...}) returns True."""
    started = time.perf_counter()
    root = pick(drafter.prefill(ids), sampling, generator)
    done = emit([root], seconds={"prompt": time.perf_counter() - started})
    while not done:
        started = time.perf_counter()
        proposal = drafter.propose(root)
        drafted = time.perf_counter() - started
        verified = yield proposal
        verified.seconds.update({"draft": drafted, **{f"draft.{part}": s for part, s in proposal.parts.items()}})
        started = time.perf_counter()
        drafter.accept(proposal, verified)
        verified.seconds["accept"] = time.perf_counter() - started
        root = verified.next_token
        done = emit(verified.accepted + [root], rows=proposal.rows, seconds=verified.seconds)


def decode(drafter: Drafter, ids: torch.Tensor, emit: Callable[..., bool], sampling: Sampling,
           generator: torch.Generator | None) -> list[int]:
    """One answer: `steps` with each proposal verified alone. -> the tree nodes each step's early pruning dropped
    (none without pruning)."""
    pruned: list[int] = []
    loop = steps(drafter, ids, emit, sampling, generator)
    proposal = next(loop, None)
    while proposal is not None:
        started = time.perf_counter()
        verified = verify(drafter.model, drafter.cache, proposal, sampling, generator, drafter.capture,
                          drafter.early)
        verified.seconds = {"verify": time.perf_counter() - started}
        if drafter.early is not None:  # what pruning dropped, for GenerateResult.pruned_rows
            pruned.append(verified.pruned)
        del proposal  # this step's logits and states go before the next step allocates its own
        proposal = next_proposal(loop, verified)
    return pruned


def next_proposal(loop: Generator[Proposal, Verified, None], verified: Verified) -> Proposal | None:
    """The loop's next proposal after `verified`, or None once its answer has ended."""
    try:
        return loop.send(verified)
    except StopIteration:
        return None
