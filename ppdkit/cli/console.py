"""What the commands print for people: text streamed as it is decoded, and after `ppdkit run` or `demo`
each stage's figures, where the MLflow run is, and (for the demo) one MT-Bench answer with its speed."""

from pathlib import Path


def text_streamer(tokenizer):
    """A `generate(stream=...)` callback printing only the new text (tokens can merge into characters)."""
    printed: list[int] = []

    def stream(tokens: list[int]) -> None:
        before = tokenizer.decode(printed, skip_special_tokens=True)
        printed.extend(tokens)
        print(tokenizer.decode(printed, skip_special_tokens=True)[len(before):], end="", flush=True)

    return stream


def show_sample(output: Path, spec, evaluate: dict) -> None:
    """Decode the first MT-Bench question with the trained component, streaming, and say how fast."""
    from ppdkit.runtime.decoder import Decoder

    from ppdkit.bench.decoding import load_prompts

    decoder = Decoder.from_pretrained(output / "calibrate" / "component")
    question = load_prompts("mt-bench", 1)[0]
    print(f"\nMT-Bench question 1: {question}\n")
    result = decoder.generate(question, max_new_tokens=spec.evaluate.max_new_tokens, method="ppd",
                              stream=text_streamer(decoder.tokenizer))
    print(f"\n\nppd: {len(result.tokens)} tokens in {result.seconds:.2f} s, {result.mean_accepted_per_step:.2f} "
          f"tokens per step (tree size {result.tree_size}); on {spec.evaluate.limit} {spec.evaluate.prompts} prompts "
          f"ppd ran at {evaluate.get('ppd_speedup', float('nan')):.2f}x and ar at "
          f"{evaluate.get('ar_speedup', float('nan')):.2f}x the tokens/s of transformers' greedy generate, "
          f"identical output on {100 * evaluate.get('ppd_identical_to_greedy', float('nan')):.0f}% of them")


def _data(data: dict) -> list[str]:
    lines = [f"{data['train_sequences']} train / {data['holdout_sequences']} held-out sequences, "
             f"{data['train_assistant_tokens']} assistant tokens to learn from"]
    if "check_nll" in data:
        lines.append(f"base model check: held-out loss {data['check_nll']:.3f} (perplexity "
                     f"{data['check_perplexity']:.1f}), top-1 {data['check_top1']:.3f} on {data['check_tokens']} tokens")
    return lines


def _teacher(teacher: dict) -> list[str]:
    speed = f", {teacher['positions_per_second']:.0f} positions/s" if teacher.get("positions_per_second") else ""
    return [f"{teacher['positions']} positions, top-{teacher['top_k']} keeps {teacher['mass_kept_mean']:.3f} of the mass "
            f"(p5 {teacher['mass_kept_p5']:.3f}), {teacher['bytes_per_position']:.0f} bytes/position = "
            f"{100 * teacher['fraction_of_full_vocab']:.2f}% of full fp16 logits{speed}"]


def _train(train: dict) -> list[str]:
    lines = []
    if "best_acc_top1_d1" in train:  # a trained draft: its held-out accuracy at the best step
        hits = [v for key, v in sorted(train.items()) if key.startswith("best_acc_top1_d")]
        losses = (f", loss {train['first_loss']:.3f} -> {train['final_loss']:.3f}"
                  if train.get("first_loss") is not None and train.get("final_loss") is not None else "")
        lines.append(f"{train['steps']} steps{losses}; best at step {train['best_step']}: held-out top-1 "
                     + ", ".join(f"{100 * v:.0f}%" for v in hits) + f" at distances 1..{len(hits)}")
    if "best_ms_per_token" in train:  # a layer-skip search
        lines.append(f"layer-skip search of {train['trials']} maps chose {train['skipped_attention']} attention and "
                     f"{train['skipped_mlp']} MLP sub-layers to skip: {train['skip_ms_per_token']:.2f} ms/token against "
                     f"ar's {train['ar_ms_per_token']:.2f} ({train['speedup_vs_ar']:.2f}x) on the development prompts")
    return lines


def _calibrate(calibrate: dict) -> list[str]:
    if not calibrate.get("calibrated", 1):
        return []
    hits = [v for key, v in sorted(calibrate.items()) if key.startswith("p_top1_d")]
    taus = sorted((int(key.removeprefix("tau_size")), v) for key, v in calibrate.items() if key.startswith("tau_size"))
    return ["top-1 guess right " + ", ".join(f"{100 * v:.0f}%" for v in hits) + f" at distances 1..{len(hits)}; "
            "expected tokens per step " + ", ".join(f"{v:.2f} (size {size})" for size, v in taus)]


def _evaluate(evaluate: dict) -> list[str]:
    baselines = ("hf_greedy", "hf_pld", "ar")
    measured = sorted((key.removesuffix("_tokens_per_s") for key in evaluate if key.endswith("_tokens_per_s")),
                      key=lambda m: (baselines.index(m) if m in baselines else len(baselines), m))
    ar = evaluate.get("ar_tokens_per_s")
    return [", ".join(f"{m} {evaluate[f'{m}_tokens_per_s']:.1f} tok/s ({evaluate[f'{m}_speedup']:.2f}x greedy"
                      + (f", {evaluate[f'{m}_tokens_per_s'] / ar:.2f}x ar" if ar and m not in baselines else "")
                      + ")" for m in measured)] + [why for m in measured if m not in baselines
                                                 if (why := _unpaid(m, evaluate, ar))]


def _unpaid(method: str, evaluate: dict, ar: float | None) -> str:
    """In plain words, why a draft did not pay in the evaluate stage, or "" where it did."""
    if evaluate.get(f"{method}_why"):
        return f"{method} ran as {evaluate[f'{method}_ran']}: {evaluate[f'{method}_why']}"
    if not ar or evaluate[f"{method}_tokens_per_s"] >= ar:
        return ""
    per_step, rows = evaluate.get(f"{method}_accepted_per_step"), evaluate.get(f"{method}_rows_per_step")
    if not per_step or not rows:
        return ""
    return (f"{method} does not pay here: it kept {per_step:.2f} tokens a step for {rows:.1f} input rows, and a step "
            f"of that many rows costs more than {per_step:.2f} one-token steps on this CPU (more training raises the "
            "first; a CPU with idle compute, AMX or a GPU, lowers the second)")


def _register(register: dict) -> list[str]:
    return [f"{register['uri']}, aliased challenger"] if register.get("registered") else []


# each stage's figures in words, from its summary.json: the end of its "done" line, and the run summary
STAGE_FIGURES = {"data": _data, "teacher": _teacher, "train": _train, "calibrate": _calibrate,
                 "evaluate": _evaluate, "register": _register}


def key_figure(stage: str, summary: dict) -> str:
    """The one line that says what `stage` made (its first figure line), or "" when it has none."""
    try:
        lines = STAGE_FIGURES[stage](summary) if stage in STAGE_FIGURES else []
    except (KeyError, TypeError, ValueError):  # a summary of another shape (an older version's): no figure
        return ""
    return lines[0] if lines else ""


def print_run_summary(spec, output: Path, results: dict, tracker) -> None:
    print(f"\njob {spec.name}: stages {', '.join(results) or '(none)'} complete in {output}")
    for stage, summary in results.items():
        lines = STAGE_FIGURES[stage](summary) if stage in STAGE_FIGURES and stage != "register" else []
        for i, line in enumerate(lines):  # a stage's further lines say what they are
            print(f"  {stage}: {line}" if i == 0 else f"  {line}")
    if tracker.run_id:
        print(f"  MLflow run {tracker.run_id} at {tracker.uri}")
        experiment = tracker.client.get_run(tracker.run_id).info.experiment_id
        print(f"  list runs: MLFLOW_TRACKING_URI={tracker.uri} mlflow runs list --experiment-id {experiment}")
        from ppdkit.registry.runs_view import runs_view_url
        from ppdkit.registry.tracking import default_tracking_uri, is_server

        if is_server(tracker.uri):  # a tracking server is its own UI
            ui, start = tracker.uri.rstrip("/"), ""
        else:  # a local store: `ppdkit ui` serves it on 127.0.0.1:5000
            ui = "http://127.0.0.1:5000"
            start = "ppdkit ui" + ("" if tracker.uri == default_tracking_uri() else f" --tracking-uri {tracker.uri}")
            start += ", then "
        print(f"  compare:   {start}{runs_view_url(ui, experiment)}")  # the runs table with ppdkit's key columns
        print(f"  browse:    {start}{ui}/#/experiments/{experiment}/runs/{tracker.run_id}?workflowType=machine_learning")
