"""`auto`: the fastest decoding method a decoder serves on this machine, chosen once by a short measured trial
and cached per machine, base model and component like the tree profile (runtime/profile.py).

The trial decodes a few prompts of the kinds whose drafts differ most (prose, an explanation, code, a list)
with every method the decoder serves, interleaved so drift in machine speed hits them alike, and keeps the
one with the most tokens per second. A drafter must beat `ar` by MARGIN in the trial to be chosen: a trial is
short and timings here drift by several percent, and auto must never be slower than plain decoding.
"""

import json
import logging
import time

from tqdm import tqdm

from ppdkit.models.paths import cache_dir

from .profile import machine_key, runtime_key

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


def candidates(decoder) -> list[str]:
    """Every method the decoder serves but auto itself."""
    return [m for m in decoder.methods() if m != AUTO]


def choose(speeds: dict[str, float], margin: float = MARGIN) -> str:
    """speeds: tokens per second by method, ar among them -> the fastest, unless it beats ar by less than margin."""
    best = max(speeds, key=speeds.get)
    return best if speeds[best] >= (1 + margin) * speeds["ar"] else "ar"


def measure(decoder, methods: list[str], prompts: tuple[str, ...] = TRIAL_PROMPTS,
            tokens: int = TRIAL_TOKENS) -> dict[str, float]:
    """Tokens per second of each method on the prompts, interleaved prompt by prompt (greedy)."""
    seconds, made = dict.fromkeys(methods, 0.0), dict.fromkeys(methods, 0)
    for method in methods:  # warm-up: first-call allocations are not measured
        decoder.generate(prompts[0], max_new_tokens=4, method=method)
    for prompt in tqdm(prompts, desc=f"auto: timing {len(methods)} methods", unit="prompt", leave=False):
        for method in methods:
            started = time.perf_counter()
            made[method] += len(decoder.generate(prompt, max_new_tokens=tokens, method=method).tokens)
            seconds[method] += time.perf_counter() - started
    return {m: made[m] / seconds[m] for m in methods}


def fastest_method(decoder, refresh: bool = False) -> str:
    """The method auto runs for this decoder here: measured once, then read from the cache."""
    methods = candidates(decoder)
    if methods == ["ar"]:
        return "ar"
    path = cache_dir() / "profiles" / f"auto-{decoder.identity()}-{runtime_key(decoder.model)}.json"
    if path.is_file() and not refresh:
        saved = json.loads(path.read_text())
        if saved.get("methods") == methods:
            return saved["chosen"]
    log.info("auto: timing %s on %d prompts to choose the fastest here (once per machine)", ", ".join(methods),
             len(TRIAL_PROMPTS))
    speeds = measure(decoder, methods)
    chosen = choose(speeds)
    log.info("auto: %s (tokens/s %s)", chosen, ", ".join(f"{m} {s:.1f}" for m, s in speeds.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine_key(), "methods": methods, "tokens_per_s": speeds,
                                "chosen": chosen}, indent=2))
    return chosen
