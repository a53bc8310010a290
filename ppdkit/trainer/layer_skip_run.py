"""The train stage of `train.method: layer-skip`: search the skip map on development prompts (skip_search.py),
check the chosen map against plain decoding in one interleaved run, and export the component: the skip map
and the searched figures, no weights. Decoders load it for `--method skip`.
"""

import json
import logging
import shutil
from pathlib import Path

from ppdkit.data_pipeline.ray_placement import largest_node_cpus
from ppdkit.models.artifact import write_component
from ppdkit.models.config import BaseModelConfig
from ppdkit.models.paths import write_json_atomic
from ppdkit.runtime.forward.llama import SKIP_ATTENTION, SKIP_MLP

from .checkpoint import replace_dir
from .config import LayerSkipConfig
from .plots import plot_search, plot_skip_map
from .skip_search import METRIC, DevSetTimer, SearchSettings, search_skip_maps, sublayer_ranking

log = logging.getLogger(__name__)


def development_prompts(data_dir: Path, count: int) -> tuple[str, ...]:
    """The first user turns of the data stage's held-out conversations (then of training ones, if the
    hold-out has fewer than `count`): prompts the search may tune on without touching a benchmark's."""
    from datasets import load_from_disk

    prompts: list[str] = []
    for split in ("holdout", "train"):
        for messages in load_from_disk(str(data_dir / split))["messages"]:
            first = next((m["content"] for m in json.loads(messages) if m["role"] == "user"), None)
            if first and len(prompts) < count:
                prompts.append(first)
    if not prompts:
        raise ValueError(f"the data stage in {data_dir} holds no conversation with a user turn to search on")
    return tuple(prompts)


def compare_with_ar(timer: DevSetTimer, skip: tuple[int, ...]) -> dict:
    """The chosen map against plain decoding on the same prompts, interleaved (drift hits both alike); every
    output must be plain decoding's."""
    import time

    from ppdkit.runtime.drafters.draft_parts import LayerSkipParts

    decoder, prompts = timer.loaded()
    decoder.draft = LayerSkipParts(skip_map=skip)  # ar ignores it
    decoder.generate(prompts[0][:16], max_new_tokens=4, method="skip")  # this process's first skip step: not timed
    seconds, tokens, same = {"ar": 0.0, "skip": 0.0}, {"ar": 0, "skip": 0}, 0
    for ids in prompts:
        out = {}
        for method in ("ar", "skip"):
            started = time.perf_counter()
            out[method] = decoder.generate(ids, max_new_tokens=timer.new_tokens, method=method).tokens
            seconds[method] += time.perf_counter() - started
            tokens[method] += len(out[method])
        same += out["ar"] == out["skip"]
    ar_ms, skip_ms = (1000 * seconds[m] / tokens[m] for m in ("ar", "skip"))
    return {"ar_ms_per_token": ar_ms, "skip_ms_per_token": skip_ms, "speedup_vs_ar": ar_ms / skip_ms,
            "identical_to_ar": same / len(prompts), "fingerprint": decoder.fingerprint}


def run_search(base: BaseModelConfig, cfg: LayerSkipConfig, data_dir: Path, out_dir: Path, tracker_ref) -> dict:
    """Search (resuming a stopped search), compare, export OUT/component and OUT/plots; returns the figures."""
    import ray
    from transformers import AutoConfig

    from ppdkit.models.catalog import materialize

    out_dir.mkdir(parents=True, exist_ok=True)
    layers = AutoConfig.from_pretrained(materialize(base.name)).num_hidden_layers
    # a trial gets what training would, the CPUs it is timed on, as far as one node holds them (a trial is one task)
    cpus = min(cfg.num_workers * cfg.cpus_per_worker, largest_node_cpus())
    timer = DevSetTimer(base.name, base.dtype, development_prompts(data_dir, cfg.search_prompts),
                        cfg.search_new_tokens, cpus)
    log.info("layer-skip search: %d trials over %d sub-layers on %d development prompts, %d new tokens each",
             cfg.search_trials, 2 * layers, len(timer.prompts), timer.new_tokens)
    trials = search_skip_maps(timer, SearchSettings(layers, cfg.search_trials, cfg.seed, cpus, cfg.max_failures),
                              out_dir, tracker_ref)
    best = min(trials, key=lambda t: t[METRIC])
    check = ray.get(ray.remote(compare_with_ar).options(num_cpus=cpus).remote(timer, best["skip"]))
    log.info("layer-skip: chosen map %.2f ms/token against ar's %.2f (x%.2f), %.2f tokens per step",
             check["skip_ms_per_token"], check["ar_ms_per_token"], check["speedup_vs_ar"], best["tokens_per_step"])
    skip = list(best["skip"])
    figures = {"trials": len(trials), f"best_{METRIC}": best[METRIC], "best_tokens_per_step": best["tokens_per_step"],
               "skipped_attention": sum(bool(s & SKIP_ATTENTION) for s in skip),
               "skipped_mlp": sum(bool(s & SKIP_MLP) for s in skip),
               **{k: v for k, v in check.items() if k != "fingerprint"}}
    hyper = {"skip_map": skip, "layers": layers, "development_prompts": len(timer.prompts),
             "new_tokens": timer.new_tokens}
    tmp = out_dir / "component.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # an export a crash interrupted
    write_component(tmp, "layer-skip", hyper, base.name, check["fingerprint"],
                    {"mlflow_run_id": tracker_ref.run_id, "trials": len(trials)}, {},
                    extras={"search": {**figures, "ranking": sublayer_ranking(trials, layers),
                                       "trials": [{**t, "skip": list(t["skip"])} for t in trials]}})
    replace_dir(tmp, out_dir / "component")
    plots = out_dir / "plots"
    plots.mkdir(exist_ok=True)
    plot_search([t[METRIC] for t in trials], check["ar_ms_per_token"], plots / "search.png")
    plot_skip_map(best["skip"], plots / "skip_map.png")
    result = {**figures, "component": str(out_dir / "component")}
    write_json_atomic(out_dir / "result.json", result)
    return result
