"""Hardware awareness (PPD thesis section 5.6.3): measure forward latency L(n) per tree size on this
machine, pick the size with the highest tau(n) / L(n), and remember it per machine and model."""

import json
import os
import platform
import time
from collections.abc import Callable

import torch

from ppdkit.models.paths import cache_dir

from ..forward.llama import LeanLlama


RUNTIME_REVISION = 11  # bumped when the forward's cost or its measuring changes: cached profiles are measured again


def machine_key() -> str:
    return f"{platform.node()}-{platform.machine()}-{os.cpu_count()}cpu-{torch.get_num_threads()}threads"


def runtime_key(model: LeanLlama) -> str:
    """This machine, the kernel path and weight dtype the model runs on (they change every timing: bfloat16 rows
    cost far less than float32 ones) and the runtime's revision: what a cached measurement (tree profile, auto's
    trial) holds for."""
    path_kind = ("native" if model.native is not None else "torch") + "-" + model.weight_format
    if model.kernel is not None:
        path_kind += f"-{model.kernel}"  # bfloat16 on AMX tiles or AVX512-BF16: rows cost very differently
    if model.device.type != "cpu":
        path_kind += f"-{model.device}"  # another device's timings hold there only
    return f"{machine_key()}-{path_kind}-r{RUNTIME_REVISION}"


def measure_latencies(model: LeanLlama, sizes: list[int], context: int = 256, rounds: int = 9) -> dict[int, float]:
    """size -> median seconds of one forward of `size` tree tokens over `context` cached tokens, the sizes taken in
    turns, `rounds` times. In turns because a shared VM has slow spells of a few hundred ms: measured one size after
    another, a spell lands on one size alone (on a 2-core EPYC, bfloat16: 4 rows 26.6 ms, 8 rows 25.7, 2 rows 15.5, one
    14.9), the grown trees' latency line starts from that (runtime/trees/grown_tree.latency_model) and they kept 4.1
    rows a step where trees of 8 paid more. In turns a spell touches a round of every size, and the median drops it."""
    device = model.device
    cache = model.new_cache(context + max(sizes) + 1)
    inputs = {size: (model.embed_ids(torch.randint(0, model.vocab_size, (size,), device=device)),  # [n, H]
                     torch.arange(context, context + size, device=device),  # [n]
                     torch.ones(size, context + size, dtype=torch.bool, device=device).tril(diagonal=context))
              for size in sizes}
    times: dict[int, list[float]] = {size: [] for size in sizes}
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for size in sizes:
                x, positions, mask = inputs[size]
                cache.length = context  # the cache's contents do not change the cost
                started = time.perf_counter()
                hidden = model.forward(x, positions, cache, mask)
                float(model.logits(hidden)[0, 0])  # read back: on a GPU the forward has then finished
                if round_:  # the first round warms caches and allocators
                    times[size].append(time.perf_counter() - started)
    return {size: sorted(t)[len(t) // 2] for size, t in times.items()}


def profile_trees(model: LeanLlama, taus: dict[int, float], fingerprint: str, refresh: bool = False,
                  context: int = 256, drafter: str = "ppd", draft_seconds: Callable[[int], float] | None = None) -> dict:
    """{"rows": [{size, tau, latency_ms, draft_ms, tokens_per_s}], "chosen": size}; cached per machine, model and
    drafter kind ("ppd" or "heads": one component of each may serve the same base model). `draft_seconds(size)`:
    what drafting a tree of that size costs before its forward (draft heads; PPD drafts inside the forward)."""
    name = f"{fingerprint.split(':')[-1][:16]}-{drafter}-{runtime_key(model)}.json"
    path = cache_dir() / "profiles" / name
    key = sorted(taus)
    if path.is_file() and not refresh:
        saved = json.loads(path.read_text())
        if saved.get("sizes") == key and saved.get("taus") == {str(s): taus[s] for s in key}:
            return saved
    rows = []
    context = max(1, min(context, model.max_positions - 1 - max(key)))  # a short window (Mistral's cap) fits too
    forward = measure_latencies(model, sorted({1, *key}), context)
    baseline = forward[1]
    for size in key:
        drafting = draft_seconds(size) if draft_seconds is not None else 0.0
        latency = forward[size] + drafting
        rows.append({"size": size, "tau": taus[size], "latency_ms": 1000 * latency, "draft_ms": 1000 * drafting,
                     "tokens_per_s": taus[size] / latency, "speedup_vs_one_token": taus[size] * baseline / latency})
    chosen = max(rows, key=lambda r: r["tokens_per_s"])["size"]
    result = {"machine": machine_key(), "context": context, "one_token_ms": 1000 * baseline, "sizes": key,
              "taus": {str(s): taus[s] for s in key}, "rows": rows, "chosen": chosen}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def best_speedup(profile: dict) -> float:
    """The most a calibrated tree of the profile is predicted to gain over one-token steps (tau x one row's forward /
    its step): below 1, no size pays on this machine."""
    return max(row["speedup_vs_one_token"] for row in profile["rows"])
