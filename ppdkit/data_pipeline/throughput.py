"""The teacher stage's live figures: what the shards finished so far in this attempt did."""

import time
from dataclasses import dataclass, field


@dataclass
class Throughput:
    """What the shards finished so far in this attempt did: the live figures a user watches (tqdm, MLflow)."""

    started: float = field(default_factory=time.time)
    shards: int = 0
    positions: int = 0
    generated: int = 0
    by_worker: dict[int, list[float]] = field(default_factory=dict)  # pid -> [generated tokens, seconds generating]
    by_node: dict[str, int] = field(default_factory=dict)  # node id -> shards it computed (ray_placement.this_node)

    def add(self, record: dict) -> None:
        self.shards += 1
        self.positions += record["positions"]
        self.generated += record["generated_tokens"]
        mine = self.by_worker.setdefault(record["timing"]["worker"], [0, 0.0])
        mine[0] += record["generated_tokens"]
        mine[1] += record["timing"]["generate_seconds"]
        node = record["timing"]["node"]
        self.by_node[node] = self.by_node.get(node, 0) + 1

    def figures(self, remaining_shards: int) -> dict[str, float]:
        seconds = max(time.time() - self.started, 1e-9)
        out = {"shards_done": self.shards, "shards_left": remaining_shards, "positions_per_s": self.positions / seconds,
               "eta_s": remaining_shards * seconds / max(self.shards, 1)}
        if self.generated:
            out["generated_tokens"] = self.generated
            out["generated_tokens_per_s"] = self.generated / seconds
            for i, (tokens, busy) in enumerate(self.by_worker.values()):  # each worker while it was generating
                out[f"worker_{i}_generated_tokens_per_s"] = tokens / max(busy, 1e-9)
        return out

    def summary(self, computed: bool) -> dict:
        """The attempt's throughput for the stage's summary (rates None when every shard was already there)."""
        figures = self.figures(0) if computed else {}
        return {"compute_seconds": round(time.time() - self.started, 2),
                "positions_per_second": figures.get("positions_per_s"),
                "generated_tokens_per_second": figures.get("generated_tokens_per_s"),
                "generated_tokens_per_second_by_worker":
                    [v for k, v in figures.items() if k.startswith("worker_")] or None,
                "shards_by_node": dict(sorted(self.by_node.items()))}
