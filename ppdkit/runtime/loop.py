"""The decode loop every method runs: read the prompt, then draft, verify and accept until the answer ends.

A method is its drafter (runtime/drafter.py): `ar`'s proposes the root alone, ANPD's a chain from the text's
n-grams, EAGLE-3's a tree grown from its draft's confidence. The loop and the verification are the same for all.
"""

import time
from collections.abc import Callable

import torch

from .acceptance import Sampling, pick
from .drafter import Drafter, verify


def decode(drafter: Drafter, ids: torch.Tensor, emit: Callable[..., bool], sampling: Sampling,
           generator: torch.Generator | None) -> list[int]:
    """Read the prompt ids [P], then one step after another until emit(step's tokens, rows=the rows it fed the
    model) returns True. -> the tree nodes each step's early pruning dropped (none without pruning)."""
    pruned: list[int] = []
    root = pick(drafter.prefill(ids), sampling, generator)
    done = emit([root])
    while not done:
        started = time.perf_counter()
        proposal = drafter.propose(root)
        verifying = time.perf_counter()
        verified = verify(drafter.model, drafter.cache, proposal, sampling, generator, drafter.capture,
                          drafter.early)
        verified.seconds = {"draft": verifying - started, "verify": time.perf_counter() - verifying}
        drafter.accept(proposal, verified)
        if drafter.early is not None:  # what pruning dropped, for GenerateResult.pruned_rows
            pruned.append(verified.pruned)
        root = verified.next_token
        done = emit(verified.accepted + [root], rows=proposal.rows)
        del proposal, verified  # this step's logits and states go before the next step allocates its own
    return pruned
