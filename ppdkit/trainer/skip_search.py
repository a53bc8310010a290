"""Layer-skip search (Draft & Verify section 3.3): which attention and MLP sub-layers the draft
leaves out, chosen by Bayesian optimization of the measured time per verified token on a few development
prompts (8, as the paper does), run as Ray Tune trials.

Searcher: Optuna's TPE through Ray Tune's OptunaSearch, not the paper's `bayesian-optimization`. The space
is 2L binary choices (attention and MLP of each layer); bayesian-optimization's Gaussian process models a
continuous box, so every choice would be a float rounded to 0/1, flat steps its kernel fits poorly. TPE
samples categorical choices as they are, is seeded (a search repeats), and Ray Tune saves its state with the
experiment, so a search stopped mid-way resumes with what it learnt (`Tuner.restore`).

Trials run one at a time on the CPUs training would have (timings taken side by side on shared cores would
measure the neighbour), and the trial actor is reused, so the base model loads once per search.
Each trial's figures and the best so far go to the MLflow run as they arrive (`search.*`, step = trial).
"""

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ppdkit.runtime.forward.llama import SKIP_ATTENTION, SKIP_MLP

log = logging.getLogger(__name__)

METRIC = "ms_per_token"  # what the search minimises: wall time per token the whole model verified


def skip_map_of(config: dict, layers: int) -> tuple[int, ...]:
    """A trial's config {"attention_3": 1, "mlp_3": 0, ...} as a skip map (per layer 0..3)."""
    return tuple(SKIP_ATTENTION * int(config[f"attention_{i}"]) + SKIP_MLP * int(config[f"mlp_{i}"])
                 for i in range(layers))


def config_of(skip: tuple[int, ...]) -> dict:
    """The inverse of skip_map_of."""
    out = {}
    for i, s in enumerate(skip):
        out[f"attention_{i}"], out[f"mlp_{i}"] = int(bool(s & SKIP_ATTENTION)), int(bool(s & SKIP_MLP))
    return out


def starting_maps(layers: int) -> list[tuple[int, ...]]:
    """Maps the search evaluates before its own proposals: whole layers skipped every 2nd, 3rd and 4th layer,
    the first and last two kept (the paper's searched maps for LLaMA-2 keep the ends and skip across the
    middle). A prior, not a constraint: TPE moves away from them when they time badly."""
    inner = range(2, layers - 2)
    maps = [tuple(3 if i in inner and i % stride == 0 else 0 for i in range(layers)) for stride in (2, 3, 4)]
    return [m for i, m in enumerate(maps) if any(m) and m not in maps[:i]]


def sublayer_ranking(trials: list[dict], layers: int) -> list[str]:
    """Every sub-layer ("attention_3", "mlp_3", ...), the one most worth skipping first: ranked by the mean time per
    token of the trials that skipped it minus that of the trials that kept it (a sub-layer never tried both ways
    ranks last). The aggressive-skip fine-tune (D&V paper appendix F) skips the top of this list."""
    def effect(name: str) -> float:
        part, layer = name.split("_")
        bit = SKIP_ATTENTION if part == "attention" else SKIP_MLP
        skipped = [t[METRIC] for t in trials if t["skip"][int(layer)] & bit]
        kept = [t[METRIC] for t in trials if not t["skip"][int(layer)] & bit]
        return sum(skipped) / len(skipped) - sum(kept) / len(kept) if skipped and kept else float("inf")

    names = [f"{part}_{i}" for i in range(layers) for part in ("attention", "mlp")]
    return sorted(names, key=effect)  # stable: ties keep layer order


def _trial(config: dict, objective: Callable[[tuple[int, ...]], dict], layers: int) -> None:
    from ray import tune

    skip = skip_map_of(config, layers)
    figures = objective(skip)
    tune.report({**figures, "skipped_sublayers": sum(bin(s).count("1") for s in skip)})


def _trial_logger(tracker_ref, total: int):
    """A Ray Tune callback (in the driver): every finished trial's figures into the MLflow run, and a bar."""
    from ray.tune import Callback

    class TrialLogger(Callback):
        def __init__(self):
            self.bar = None

        def __getstate__(self):  # Tune saves its callbacks with the experiment; a bar is not for saving
            return {"bar": None}

        def on_trial_result(self, iteration, trials, trial, result, **info):
            from tqdm import tqdm

            earlier = [t.last_result for t in trials if t is not trial and t.last_result and METRIC in t.last_result]
            finished = [*earlier, result]  # a resumed search counts the trials of its earlier runs
            if self.bar is None:
                self.bar = tqdm(total=total, initial=len(earlier), desc="layer-skip search", unit="trial")
            self.bar.update(1)
            best = min(r[METRIC] for r in finished)
            self.bar.set_postfix_str(f"best {best:.2f} ms/token")
            tracker_ref.open(best_effort=True).log_metrics(
                {"search.ms_per_token": result[METRIC], "search.best_ms_per_token": best,
                 "search.tokens_per_step": result.get("tokens_per_step", 0.0),
                 "search.skipped_sublayers": result["skipped_sublayers"]}, step=len(finished))

        def on_experiment_end(self, trials, **info):
            if self.bar is not None:
                self.bar.close()

    return TrialLogger()


class SearchError(RuntimeError):
    pass


@dataclass(frozen=True)
class SearchSettings:
    layers: int
    trials: int
    seed: int = 0
    cpus: int = 1
    max_failures: int = 1  # retries of a failed trial before it counts as errored


def search_skip_maps(objective: Callable[[tuple[int, ...]], dict], settings: SearchSettings, out_dir: Path,
                     tracker_ref) -> list[dict]:
    """Run the search in OUT/tune, or resume the one stopped there; returns every finished trial, in the order
    they finished: {"skip": map, "ms_per_token": ..., ...}. `objective(skip)` runs in the trial actor and
    returns at least ms_per_token. Raises SearchError when trials failed (a rerun resumes)."""
    import optuna
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial otherwise
    # Tune's newer console output prints an experiment box and paths even at verbose=0; the older one is
    # silent there. Our bar and the MLflow run say what a user needs.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    trainable = tune.with_resources(tune.with_parameters(_trial, objective=objective, layers=settings.layers),
                                    {"cpu": settings.cpus})
    path = (out_dir / "tune").resolve()
    if tune.Tuner.can_restore(str(path)):
        log.info("layer-skip search: resuming the search in %s", path)
        tuner = tune.Tuner.restore(str(path), trainable, resume_errored=True)
    else:
        space = {f"{part}_{i}": tune.choice([0, 1]) for i in range(settings.layers) for part in ("attention", "mlp")}
        sampler = optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=min(10, max(1, settings.trials // 4)))
        searcher = OptunaSearch(points_to_evaluate=[config_of(m) for m in starting_maps(settings.layers)],
                                sampler=sampler)
        tuner = tune.Tuner(
            trainable, param_space=space,
            tune_config=tune.TuneConfig(search_alg=searcher, metric=METRIC, mode="min", num_samples=settings.trials,
                                        max_concurrent_trials=1, reuse_actors=True),
            run_config=tune.RunConfig(name="tune", storage_path=str(path.parent), verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=settings.max_failures),
                                      callbacks=[_trial_logger(tracker_ref, settings.trials)]))
    logging.getLogger("ray.tune").setLevel(logging.WARNING)  # "wrote the experiment state to ..." per fit
    grid = tuner.fit()
    if grid.errors:
        raise SearchError(f"{len(grid.errors)} layer-skip trial(s) failed, the first with: {grid.errors[0]}. "
                          f"Fix the cause and rerun the same command: the finished trials in {path} are kept")
    done = sorted((r.metrics for r in grid if r.metrics and METRIC in r.metrics), key=lambda m: m["timestamp"])
    return [{"skip": skip_map_of(m["config"], settings.layers), **{k: m[k] for k in (METRIC, "tokens_per_step",
                                                                                       "skipped_sublayers") if k in m}}
            for m in done]


@dataclass(frozen=True)
class DevSetTimer:
    """The search's objective: `skip` decoding of the development prompts under a skip map, timed (in the
    trial actor, which keeps the decoder between trials)."""

    base: str
    dtype: str
    prompts: tuple[str, ...]
    new_tokens: int
    threads: int

    def __call__(self, skip: tuple[int, ...]) -> dict:
        from ppdkit.runtime.drafters.draft_parts import LayerSkipParts

        decoder, ids = self.loaded()
        decoder.draft = LayerSkipParts(skip_map=skip)
        seconds = tokens = steps = 0
        for prompt in ids:
            started = time.perf_counter()
            result = decoder.generate(prompt, max_new_tokens=self.new_tokens, method="skip")
            seconds += time.perf_counter() - started
            tokens, steps = tokens + len(result.tokens), steps + result.steps
        return {METRIC: 1000 * seconds / tokens, "tokens_per_step": tokens / steps}

    def loaded(self):
        key = (self.base, self.dtype, self.prompts)
        if key not in _LOADED:
            import torch

            from ppdkit.runtime.decoder import Decoder

            torch.set_num_threads(self.threads)
            decoder = Decoder.from_base(self.base, dtype=self.dtype)
            ids = [decoder.encode_chat(p) for p in self.prompts]
            # first-call allocations and the kernels' load: not timed
            decoder.generate(ids[0][:16], max_new_tokens=4, method="ar")
            _LOADED.clear()
            _LOADED[key] = decoder, ids
        return _LOADED[key]


_LOADED: dict = {}  # per trial actor: the decoder and the encoded prompts
