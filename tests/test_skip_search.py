"""The layer-skip search (ppdkit/trainer/skip_search.py) on a real local Ray Tune with Optuna's TPE: with a known cost it
finds the optimum in a few trials, a failed trial is resumed without redoing the finished ones, and
`train.method: layer-skip` goes through `ppdkit run` to a registered component that decodes losslessly."""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from ray import cloudpickle
from test_pipeline import search_spec_file, sequence_spec_file, spec_file  # noqa: F401 (the tiny job's specs, fixtures)

from ppdkit.cli.main import main
from ppdkit.registry.tracking import TrackerRef
from ppdkit.trainer.skip_finetune_run import aggressive_skip_map
from ppdkit.trainer.skip_search import (SearchError, SearchSettings, config_of, search_skip_maps, skip_map_of,
                                        starting_maps, sublayer_ranking)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the costs below run in Ray Tune's trial actors

TARGET = (1, 2, 0, 3)  # layer 0 skips its attention, 1 its MLP, 2 nothing, 3 both


@dataclass(frozen=True)
class KnownCost:
    """A cost with one optimum: 1 ms plus 1 per sub-layer choice that differs from TARGET. Each call is
    written to `calls`; with `fail_at`, the call of that number fails once (its marker file remembers)."""

    calls: str
    fail_at: int = 0

    def __call__(self, skip):
        with open(self.calls, "a") as f:
            f.write(json.dumps(list(skip)) + "\n")
        calls = Path(self.calls).read_text().count("\n")
        marker = Path(self.calls + ".failed")
        if calls == self.fail_at and not marker.exists():
            marker.touch()
            raise RuntimeError("an injected trial failure")
        wrong = sum(bin(a ^ b).count("1") for a, b in zip(skip, TARGET))
        return {"ms_per_token": 1.0 + wrong, "tokens_per_step": 2.0}


def test_maps_and_trial_configs_convert_both_ways():
    assert skip_map_of(config_of(TARGET), 4) == TARGET
    for m in starting_maps(30):
        assert m[:2] == (0, 0) and m[-2:] == (0, 0) and set(m) == {0, 3}
    assert starting_maps(4) == []  # nothing between the kept ends


def test_the_search_finds_a_known_optimum_in_a_few_trials(ray_local, tmp_path):
    trials = search_skip_maps(KnownCost(str(tmp_path / "calls")), SearchSettings(layers=4, trials=48, seed=0),
                              tmp_path, TrackerRef())
    assert len(trials) == 48  # of 256 maps: random picks would find the one best in 1 of 5 searches
    best = min(trials, key=lambda t: t["ms_per_token"])
    assert best["skip"] == TARGET and best["ms_per_token"] == 1.0
    assert best["skipped_sublayers"] == 4
    ranking = sublayer_ranking(trials, 4)  # what TARGET skips is what the trials found faster without
    assert set(ranking[:4]) == {"attention_0", "mlp_1", "attention_3", "mlp_3"}, ranking


def test_a_failed_trial_is_resumed_and_finished_trials_are_kept(ray_local, tmp_path):
    cost = KnownCost(str(tmp_path / "calls"), fail_at=3)
    settings = SearchSettings(layers=4, trials=6, seed=1, max_failures=0)
    with pytest.raises(SearchError, match="rerun the same command"):
        search_skip_maps(cost, settings, tmp_path, TrackerRef())
    first = (tmp_path / "calls").read_text().splitlines()
    trials = search_skip_maps(cost, settings, tmp_path, TrackerRef())  # the rerun resumes
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(trials) == 6 and len(calls) == 7  # 6 trials + the failed attempt; none finished twice
    assert calls[2] in calls[len(first):]  # the failed map itself was tried again
    assert first == calls[:len(first)]


def test_layer_skip_and_its_fine_tune_run_through_the_pipeline_and_decode_from_the_registry(
        ray_local, tracking_uri, search_spec_file, sequence_spec_file, tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(search_spec_file), "--output", str(out), "train.method=layer-skip", "train.search_trials=6",
                 "train.search_prompts=2", "train.search_new_tokens=8", "evaluate.limit=2"]) == 0
    assert not (out / "teacher").exists()  # a search reads no teacher cache
    result = json.loads((out / "train" / "summary.json").read_text())
    assert result["trials"] == 6 and result["identical_to_ar"] == 1.0 and result["ar_ms_per_token"] > 0
    for name in ("search.png", "skip_map.png"):
        assert (out / "train" / "plots" / name).stat().st_size > 1000
    component = json.loads((out / "calibrate" / "component" / "component.json").read_text())
    assert component["method"] == "layer-skip" and component["weights"] == []
    search = json.loads((out / "calibrate" / "component" / "search.json").read_text())
    assert len(search["trials"]) == 6 and sorted(search["ranking"]) == sorted(f"{p}_{i}" for i in (0, 1)
                                                                               for p in ("attention", "mlp"))
    assert len(component["hyperparameters"]["skip_map"]) == 2
    client = MlflowClient(tracking_uri)
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    history = client.get_metric_history(run_id, "search.best_ms_per_token")
    assert [m.step for m in history] == list(range(1, 7))
    assert all(a.value >= b.value for a, b in zip(history, history[1:]))  # the best so far never worsens
    bench = json.loads((out / "evaluate" / "bench.json").read_text())
    assert {r["method"] for r in bench["results"]} == {"hf-greedy", "ar", "skip", "auto"}
    assert all(r["identical_to_greedy"] == 1.0 for r in bench["results"])
    version = client.get_model_version_by_alias("ppdkit-tiny-llama", "challenger")
    assert version.tags["method"] == "layer-skip" and "skip_speedup" in version.tags and "tau" not in version.tags
    from ppdkit.runtime.decoder import Decoder

    decoder = Decoder.from_pretrained("models:/ppdkit-tiny-llama@challenger")
    assert decoder.draft.skip_map == tuple(component["hyperparameters"]["skip_map"]) and "skip" in decoder.methods()
    for prompt in ([5, 6, 7, 8], [9, 3, 9, 3, 9, 3]):
        assert decoder.generate(prompt, max_new_tokens=12, method="skip").tokens == decoder.generate(prompt,
                                max_new_tokens=12, method="ar").tokens

    # the aggressive skip on top of the search, from its registered version: half the sub-layers, norms fine-tuned
    tuned = tmp_path / "tuned"
    assert main(["run", str(sequence_spec_file), "--output", str(tuned), "train.method=skip-finetune",
                 "train.skip_from=models:/ppdkit-tiny-llama@challenger", "train.skip_ratio=0.5",
                 "train.draft_vocab=64", "evaluate.limit=2"]) == 0
    summary = json.loads((tuned / "train" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["trained_positions"] > 0 and 0 <= summary["best_acc_top1_d1"] <= 1
    component = json.loads((tuned / "calibrate" / "component" / "component.json").read_text())
    assert component["method"] == "skip-finetune" and sorted(component["weights"]) == [
        "draft_vocab", "skip_ln1", "skip_ln2", "skip_norm"]
    ranking = search["ranking"]
    assert component["hyperparameters"]["skip_map"] == list(aggressive_skip_map(ranking, 2, 0.5))
    bench = json.loads((tuned / "evaluate" / "bench.json").read_text())
    assert {r["method"] for r in bench["results"]} == {"hf-greedy", "ar", "skip", "skip-ft", "auto"}
    assert all(r["identical_to_greedy"] == 1.0 for r in bench["results"])
    version = client.get_model_version_by_alias("ppdkit-tiny-llama", "challenger")
    assert version.tags["method"] == "skip-finetune" and "skip_ft_speedup" in version.tags
    decoder = Decoder.from_pretrained("models:/ppdkit-tiny-llama@challenger")
    assert decoder.draft.fine_tuned is not None and "skip-ft" in decoder.methods()
    for prompt in ([5, 6, 7, 8], [9, 3, 9, 3, 9, 3]):
        assert decoder.generate(prompt, max_new_tokens=12, method="skip-ft").tokens == decoder.generate(prompt,
                                max_new_tokens=12, method="ar").tokens
    # the registered version is an MLflow pyfunc model too, decoding with the same component
    import mlflow
    import pandas as pd

    model = mlflow.pyfunc.load_model("models:/ppdkit-tiny-llama@challenger")
    answers = model.predict(pd.DataFrame({"prompt": ["Hello there", "Write code"]}),
                            params={"max_tokens": 10, "method": "skip-ft"})
    assert answers["text"].tolist() == [decoder.generate(p, max_new_tokens=10,
                                                         method="ar").text for p in ("Hello there", "Write code")]
    assert set(answers["method"]) == {"skip-ft"}


def test_skip_finetune_needs_a_layer_skip_component(tracking_uri, spec_file, sequence_spec_file, tmp_path, capsys):
    assert main(["run", str(sequence_spec_file), "--output", str(tmp_path / "a"), "train.method=skip-finetune"]) != 0
    assert "set train.skip_from" in capsys.readouterr().err
    assert main(["run", str(sequence_spec_file), "--output", str(tmp_path / "b"), "train.method=skip-finetune",
                 f"train.skip_from={tmp_path / 'nowhere'}"]) != 0
    err = capsys.readouterr().err
    assert "no component there" in err and not (tmp_path / "b" / "data").exists()  # refused before any stage
    assert main(["run", str(spec_file), "--output", str(tmp_path / "c"), "train.skip_ratio=0.3"]) != 0
    assert "'train.skip_ratio' does not apply to train.method ept: it is a key of skip-finetune" in capsys.readouterr().err
