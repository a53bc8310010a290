"""Which rows are held out for evaluation: light (no Ray, no datasets), so the GPU lane splits as the recipes do."""

import hashlib
import random

# the continual recipe's held-out rows (jobs/configs/smollm2-eagle3-continual.yaml: data.holdout, data.seed), held out
# by id: the GPU lane's evaluation and the tree-values fit read these, rows no recipe run trained on
CONTINUAL_HOLDOUT, CONTINUAL_HOLDOUT_SEED = 0.02, 0


def split_holdout(conversations: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, holdout): a seeded shuffle; at least one held-out conversation when fraction > 0 and n >= 2."""
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    n_holdout = 0 if fraction == 0 or len(order) < 2 else max(1, round(fraction * len(order)))
    holdout = sorted(order[:n_holdout])
    train = sorted(order[n_holdout:])
    return [conversations[i] for i in train], [conversations[i] for i in holdout]


def split_holdout_by_id(rows: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, holdout) of rows with an `id`: a row is held out when its id's seeded hash falls below `fraction`, so a
    row held out once stays held out however the set grows (a corpus grows every session, and continual training
    judges each run on held-out rows no earlier run trained on); at least one held-out row when fraction > 0 and
    n >= 2 (the one with the lowest hash: a tiny set only)."""
    def share(row) -> float:
        digest = hashlib.sha256(f"{seed}:{row.id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2 ** 64

    shares = [share(r) for r in rows]
    held = {i for i, s in enumerate(shares) if s < fraction}
    if fraction > 0 and not held and len(rows) >= 2:
        held = {min(range(len(rows)), key=shares.__getitem__)}
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]
