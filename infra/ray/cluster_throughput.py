"""Teacher and training throughput by cluster shape, in one run on one machine: one node of 2 CPUs against two nodes
of 1 CPU each (a head and a worker node, infra/ray), the same job on both, and what the traffic between nodes costs.

    .venv/bin/python infra/ray/cluster_throughput.py --out docs/measurements/cluster-throughput-epyc.json

Each shape runs the teacher stage (two actors of 1 CPU) and training (two DeepSpeed ranks of 1 CPU, gloo) of the demo
job (ppdkit/jobs/configs/demo.yaml, `key=value` overrides after the options) on the data stage's output, made once;
the stages' own figures are read back: the teacher's positions per second, training's supervised positions per
second over its steps, and the all-reduce of the trainable gradients each training attempt times where its ranks
are. The object store's part: a teacher job's worth of bytes got by a task on the driver's node and on the other
node. Both shapes share the same cores, so what differs between them is what crossing nodes costs.
"""

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from local_cluster import LocalCluster  # noqa: E402

SHAPES = {"one node, 2 CPUs": (2, []), "two nodes, 1 CPU each": (1, [1])}  # head CPUs, worker nodes' CPUs
OBJECT_BYTES = 64 * 2**20
REPEATS = 5


def object_transfer_seconds(nodes: list[dict]) -> dict[str, float]:
    """Median seconds for a task to get a fresh OBJECT_BYTES object the driver put, on each node (head, worker)."""
    import numpy as np
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def touch(array) -> int:
        return int(array[-1])

    out = {}
    for node in nodes:
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ray.get(touch.options(scheduling_strategy=strategy).remote(np.zeros(8, np.uint8)))  # a worker there, warm
        seconds = []
        for i in range(REPEATS):
            ref = ray.put(np.full(OBJECT_BYTES, i, np.uint8))  # fresh: never already on the other node
            started = time.perf_counter()
            ray.get(touch.options(scheduling_strategy=strategy).remote(ref))
            seconds.append(time.perf_counter() - started)
        out["head" if "node:__internal_head__" in node["Resources"] else "worker"] = sorted(seconds)[REPEATS // 2]
    return out


def measure_shape(name: str, head_cpus: int, worker_cpus: list[int], spec, data_dir: Path, work: Path) -> dict:
    import ray

    from ppdkit.data_pipeline.data_stage import run_data_stage
    from ppdkit.data_pipeline.teacher_stage import run_teacher_stage
    from ppdkit.registry.tracking import TrackerRef
    from ppdkit.trainer.launch import run_training

    root = work / name.replace(" ", "-").replace(",", "")
    with LocalCluster(root / "state", head_cpus=head_cpus) as cluster:
        for i, cpus in enumerate(worker_cpus):
            cluster.add_worker(f"w{i + 1}", cpus)
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        try:
            if not data_dir.is_dir():  # once, in the first shape (one process joins one Ray: no embedded one before)
                run_data_stage(spec.base_model, spec.data, data_dir)
            logging.info("%s: teacher", name)
            teacher = run_teacher_stage(spec.base_model, spec.data, spec.teacher, data_dir, root / "teacher",
                                        placement=spec.ray.placement)
            logging.info("%s: training", name)
            train = run_training(spec.base_model, spec.train, root / "teacher", root / "train", TrackerRef(),
                                 placement=spec.ray.placement)
            attempt = json.loads((root / "train" / "placement.json").read_text())[-1]
            alive = [n for n in ray.nodes() if n["Alive"]]
            transfer = object_transfer_seconds(alive) if len(alive) > 1 else None
        finally:
            ray.shutdown()
    return {"shape": name, "nodes": 1 + len(worker_cpus), "cpus": [head_cpus, *worker_cpus],
            "teacher": {"positions": teacher["positions"], "positions_per_s": teacher["positions_per_second"],
                        "shards_by_node": teacher["shards_by_node"], "startup_s": teacher["worker_startup_seconds"]},
            "train": {"steps": train["steps"], "trained_positions": train["trained_positions"],
                      "positions_per_s": train["positions_per_second"], "allreduce": attempt["allreduce"],
                      "ranks_on_head": sum(r["head"] for r in attempt["ranks"])},
            "object_store_s": transfer}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the report (JSON)")
    parser.add_argument("overrides", nargs="*", help="demo.yaml overrides, key=value")
    args = parser.parse_args(argv)
    # the heads of start-local-head.sh run without token authentication: this driver must agree (docs/clusters.md)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    from ppdkit.bench.decoding import machine_info
    from ppdkit.jobs.ray_session import keep_local_ray_on_loopback
    from ppdkit.jobs.spec import load_spec

    spec_file = HERE.parents[1] / "ppdkit" / "jobs" / "configs" / "demo.yaml"
    overrides = ["teacher.workers=2", "teacher.cpus_per_worker=1", "train.num_workers=2", "train.cpus_per_worker=1",
                 "train.eval_every=1000", *args.overrides]  # evaluations would count in training's time
    spec = load_spec(spec_file, overrides)
    with tempfile.TemporaryDirectory(prefix="ppdkit-cluster-") as tmp:
        work = Path(tmp)
        keep_local_ray_on_loopback()
        shapes = [measure_shape(name, head, workers, spec, work / "data", work)
                  for name, (head, workers) in SHAPES.items()]
    report = {"kind": "cluster-throughput", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(), "command": "python infra/ray/cluster_throughput.py --out " + str(args.out)
              + "".join(f" {o}" for o in args.overrides), "spec": "ppdkit/jobs/configs/demo.yaml",
              "overrides": overrides, "base_model": spec.base_model.name, "quantization": spec.base_model.quantization,
              "object_bytes": OBJECT_BYTES, "repeats": REPEATS, "shapes": shapes}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for shape in shapes:
        logging.info("%s: teacher %.0f positions/s, training %.1f positions/s, all-reduce %s", shape["shape"],
                     shape["teacher"]["positions_per_s"], shape["train"]["positions_per_s"],
                     shape["train"]["allreduce"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
