"""`auto`: the fastest decoding method a decoder serves on this machine, chosen once by a short measured trial
and cached per machine, base model and component like the tree profile (runtime/trees/profile.py).

The trial decodes a few prompts of the kinds whose drafts differ most (prose, an explanation, code, a list)
with every method the decoder serves, interleaved so drift in machine speed hits them alike, and keeps the
one with the most tokens per second. Halfway, the methods clearly behind (under KEEP of the fastest) stop, so
the first decode on a machine spends its time on the close ones. A drafter must beat `ar` by MARGIN in the
trial to be chosen: a trial is short and timings here drift by several percent, and auto must never be slower
than plain decoding.
"""

import json
import logging
import time
from pathlib import Path

from tqdm import tqdm

from ppdkit.models.paths import cache_dir

from .trees.profile import machine_key, runtime_key

log = logging.getLogger(__name__)

AUTO = "auto"
# Prose, explanation, code and editing in equal parts: the drafters part ways most between prose (where few
# guesses land) and code or rewritten text (where the text repeats itself). 4 prompts of 64 tokens left choices
# within a machine's noise (docs/history.md); 8 of 96 cost more, but once per machine.
TRIAL_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works and when it is a poor choice.",
    "Compose a polite email asking a colleague to review a report by Friday.",
    "List ten tips for staying productive when working from home.",
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring and tests.",
    "Write a JavaScript class for a stack with push, pop, peek and size methods, and show how to use it.",
    "Rewrite this sentence three times, each more formal: 'the meeting got moved to next week because the "
    "numbers were not ready.'",
    "Fix the bug and explain it: def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
    "    return total / len(xs) + 1",
)
TRIAL_TOKENS = 96
MARGIN = 0.03
KEEP = 0.85  # halfway through the trial, a method under this share of the fastest's speed is timed no further


def candidates(decoder) -> list[str]:
    """Every method the decoder serves but auto itself."""
    return [m for m in decoder.methods() if m != AUTO]


def choose(speeds: dict[str, float], margin: float = MARGIN) -> str:
    """speeds: tokens per second by method, ar among them -> the fastest, unless it beats ar by less than margin."""
    best = max(speeds, key=speeds.get)
    return best if speeds[best] >= (1 + margin) * speeds["ar"] else "ar"


def measure(decoder, methods: list[str], prompts: tuple[str, ...] = TRIAL_PROMPTS,
            tokens: int = TRIAL_TOKENS) -> tuple[dict[str, float], dict[str, float]]:
    """Tokens per second of each method on the prompts, interleaved prompt by prompt (greedy), and the median seconds
    of its steps after the prompt's (drafting and verification: what trees/profile_check.py holds live steps to)."""
    seconds, made = dict.fromkeys(methods, 0.0), dict.fromkeys(methods, 0)
    steps: dict[str, list[float]] = {m: [] for m in methods}
    for method in methods:  # warm-up: first-call allocations are not measured
        decoder.generate(prompts[0], max_new_tokens=4, method=method)
    timed = list(methods)
    for i, prompt in enumerate(tqdm(prompts, desc=f"auto: timing {len(methods)} methods", unit="prompt",
                                    leave=False)):
        if i and i == len(prompts) // 2:  # halfway: the clearly slower ones are out (keeping their speed so far)
            timed = still_in(timed, {m: made[m] / seconds[m] for m in timed})
        for method in timed:
            started = time.perf_counter()
            result = decoder.generate(prompt, max_new_tokens=tokens, method=method)
            seconds[method] += time.perf_counter() - started
            made[method] += len(result.tokens)
            steps[method] += result.step_totals()
    return ({m: made[m] / seconds[m] for m in methods},
            {m: sorted(steps[m])[len(steps[m]) // 2] if steps[m] else 0.0 for m in methods})


def still_in(methods: list[str], speeds: dict[str, float], keep: float = KEEP) -> list[str]:
    """The methods worth the trial's second half: ar (every choice is held to it) and those within `keep` of the
    fastest so far; a method further behind does not close that gap in four more prompts of the same kinds."""
    best = max(speeds.values())
    return [m for m in methods if m == "ar" or speeds[m] >= keep * best]


def trial_path(decoder) -> Path:
    return cache_dir() / "profiles" / f"auto-{decoder.identity()}-{runtime_key(decoder.model)}.json"


def read_trial(decoder) -> dict | None:
    """The cached trial for this decoder here, if it timed the methods the decoder serves now (and their steps)."""
    path = trial_path(decoder)
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved if saved.get("methods") == candidates(decoder) and "step_seconds" in saved else None


def run_trial(decoder) -> dict:
    """Time the decoder's methods here and cache the choice: {"machine", "methods", "tokens_per_s", "step_seconds",
    "chosen"}."""
    methods = candidates(decoder)
    log.info("auto: timing %s on %d prompts to choose the fastest here (once per machine)", ", ".join(methods),
             len(TRIAL_PROMPTS))
    speeds, step_seconds = measure(decoder, methods)
    chosen = choose(speeds)
    log.info("auto: %s (tokens/s %s)", chosen, ", ".join(f"{m} {s:.1f}" for m, s in speeds.items()))
    trial = {"machine": machine_key(), "methods": methods, "tokens_per_s": speeds, "step_seconds": step_seconds,
             "chosen": chosen}
    path = trial_path(decoder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trial, indent=2))
    return trial


def drop_trial(decoder) -> None:
    """Forget the cached trial (runtime/trees/profile_check.py found it stale): the next auto decode times the methods
    again."""
    trial_path(decoder).unlink(missing_ok=True)
