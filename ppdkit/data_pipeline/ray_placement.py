"""Where a stage's Ray actors and training workers go (the spec's `ray.placement`), and which node each one ran on.

`spread` puts a stage's actors and training ranks on different nodes where the cluster has room (Ray's SPREAD): a
lost node then takes only its share of them, and the rest go on while Ray restarts that share elsewhere. `pack`
fills one node first (Ray's default for actors, Ray Train's PACK): the ranks' all-reduce stays on one machine.
"""

from typing import Literal

Placement = Literal["spread", "pack"]


def actor_strategy(placement: Placement) -> str:
    """The `scheduling_strategy` of a stage's actors."""
    return "SPREAD" if placement == "spread" else "DEFAULT"


def training_strategy(placement: Placement) -> str:
    """Ray Train's `ScalingConfig.placement_strategy`: the strategy of the placement group of its workers."""
    return "SPREAD" if placement == "spread" else "PACK"


def this_node() -> dict:
    """The node this Ray worker runs on: its id (shortened as Ray's own logs shorten it) and whether it is the head."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    head = any(n["NodeID"] == node_id and "node:__internal_head__" in n.get("Resources", {}) for n in ray.nodes())
    return {"node": node_id[:8], "head": head}


def describe(node: dict) -> str:
    return f"node {node['node']} ({'head' if node['head'] else 'worker'})"


def largest_node_cpus() -> int:
    """The CPUs of the cluster's largest live node: the most one task can ask for (Ray places a task on one node, so
    the cluster's total would leave a task on two nodes of 1 CPU each waiting for ever)."""
    import ray

    return max((int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"]), default=1)
