"""Where a method's time goes in a bench (`ppdkit bench`'s `breakdown` per method): the prompt's read, and per step
the drafting by part, the verification by rows, the drafter's accept, and the rest (the loop's own Python, the answer's
text). Read from the timings every step carries (GenerateResult.step_seconds), so each CPU's cost is read, not
guessed: on a 2-core Xeon without AMX a step of eagle3-corpus cost 1.85x an `ar` step, and whether that was the draft
or the rows was a guess until then."""

from collections import defaultdict

from ppdkit.runtime.answer_tokens import GenerateResult


def step_breakdown(runs: list[tuple[float, GenerateResult]]) -> dict:
    """runs: (the answer's wall seconds in the bench, its result) -> {"steps", "step_ms" (a step's mean wall time, the
    prompt's read aside), "prompt_ms" (per answer), "ms_per_step": {part: mean ms}, "verify_ms_by_rows": {rows:
    {"steps", "ms"}}}. Parts: draft (draft.grow, draft.chains, draft.choose where the drafter times them), verify,
    accept, rest."""
    steps = sum(len(result.step_seconds) for _, result in runs)
    prompt = sum(result.prompt_seconds for _, result in runs)
    parts: dict[str, float] = defaultdict(float)
    by_rows: dict[int, list[float]] = defaultdict(list)
    for _, result in runs:
        for rows, seconds in zip(result.rows_per_step, result.step_seconds):
            for part, value in seconds.items():
                parts[part] += value
            by_rows[rows].append(seconds["verify"])
    rest = sum(seconds for seconds, _ in runs) - prompt - parts["draft"] - parts["verify"] - parts["accept"]
    per_step = {part: 1000 * value / max(steps, 1) for part, value in sorted(parts.items())}
    per_step["rest"] = 1000 * rest / max(steps, 1)
    return {"steps": steps, "step_ms": (1000 * (sum(seconds for seconds, _ in runs) - prompt) / max(steps, 1)),
            "prompt_ms": 1000 * prompt / max(len(runs), 1), "ms_per_step": per_step,
            "verify_ms_by_rows": {str(rows): {"steps": len(times), "ms": 1000 * sum(times) / len(times)}
                                  for rows, times in sorted(by_rows.items())}}


def print_breakdown(results: list[dict]) -> None:
    """The report's breakdowns as a table: a step's ms and its parts, per method that has one."""
    rows = [r for r in results if "breakdown" in r]
    if not rows:
        return
    width = max(16, *(len(r["method"]) for r in rows))
    print(f"\nwhere a step's time goes (ms per step; the prompt's read per answer)\n{'method':<{width}} {'step':>6} "
          f"{'x ar':>5} {'draft':>6} {'grow':>6} {'chains':>6} {'choose':>6} {'verify':>6} {'accept':>6} {'rest':>5} "
          f"{'prompt':>7}")
    for r in rows:
        b, ms = r["breakdown"], r["breakdown"]["ms_per_step"]
        vs_ar = f"{b['step_vs_ar']:>5.2f}" if "step_vs_ar" in b else f"{'-':>5}"
        drafted = " ".join(f"{ms[part]:>6.2f}" if part in ms else f"{'-':>6}"
                           for part in ("draft.grow", "draft.chains", "draft.choose"))
        print(f"{r['method']:<{width}} {b['step_ms']:>6.2f} {vs_ar} {ms.get('draft', 0.0):>6.2f} {drafted} "
              f"{ms.get('verify', 0.0):>6.2f} {ms.get('accept', 0.0):>6.2f} {ms['rest']:>5.2f} {b['prompt_ms']:>7.1f}")
    print("verification by rows: rows: ms (steps)")
    for r in rows:
        by_rows = r["breakdown"]["verify_ms_by_rows"]
        print(f"    {r['method']:<{width}} "
              + ", ".join(f"{n}: {v['ms']:.2f} ({v['steps']})" for n, v in by_rows.items()))
