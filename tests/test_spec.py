import json

import pytest

from conftest import REPO
from ppdkit.cli.main import main
from ppdkit.jobs.spec import SpecError, apply_overrides, flatten, load_spec, spec_from_dict

CONFIGS = REPO / "ppdkit" / "jobs" / "configs"


@pytest.mark.parametrize("name", ["demo.yaml", "smollm2-ppd.yaml", "smollm2-layer-skip.yaml",
                                  "smollm2-skip-finetune.yaml"])
def test_committed_specs_load(name):
    spec = load_spec(CONFIGS / name)
    assert spec.base_model.name == "smollm2-135m"
    # a search reads no teacher cache, and the skip draft trains on the very weights it drafts with: their specs
    # keep the decoder's float32 model
    assert spec.base_model.quantization == ("none" if spec.train.method in ("layer-skip", "skip-finetune") else "nf4")


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_sets_only_keys_its_training_method_takes(path):
    from ppdkit.trainer.config import CLASS_OF_METHOD

    spec = load_spec(path)  # a key of another method would fail here
    assert type(spec.train) is CLASS_OF_METHOD[spec.train.method]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipes_init_from_is_a_committed_component(path):
    # the recipes' commands run from the repository's root: a component folder that moved (models/components ->
    # ppdkit/models/components) left the continual recipe pointing at nothing
    init_from = getattr(load_spec(path).train, "init_from", None)
    if init_from is None or init_from.startswith("models:/"):
        return
    assert (REPO / init_from / "component.json").is_file(), f"{path.name}: train.init_from={init_from} is no component"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_sizes_its_draft_as_the_component_it_starts_from(path):
    # a continual run must start from the committed draft's shape: adopting a draft of another vocabulary left the
    # recipe asking for the old one, which warm start refuses
    train = load_spec(path).train
    init_from = getattr(train, "init_from", None)
    if init_from is None or init_from.startswith("models:/"):
        return
    shape = json.loads((REPO / init_from / "component.json").read_text())["hyperparameters"]
    for key in ("draft_vocab", "head_depth"):
        if key in shape and hasattr(train, key):
            assert getattr(train, key) == shape[key], f"{path.name}: train.{key} is not {init_from}'s {shape[key]}"


def test_the_train_section_is_its_methods_class_and_takes_its_keys_only():
    from ppdkit.trainer.config import (Eagle3Config, LayerSkipConfig, PromptHeadConfig, PromptTokenConfig, TrainConfig,
                                       WeightTrainingConfig)

    assert type(spec_from_dict({"name": "x"}).train) is PromptTokenConfig  # no method named: ept
    assert type(spec_from_dict({"name": "x", "train": {"lr": 0.5}}).train) is PromptTokenConfig
    head = spec_from_dict({"name": "x", "train": {"method": "ept-head", "head_start_step": 3}}).train
    assert type(head) is PromptHeadConfig and head.head_start_step == 3
    search = spec_from_dict({"name": "x", "train": {"method": "layer-skip", "search_trials": 3}}).train
    assert type(search) is LayerSkipConfig and not isinstance(search, WeightTrainingConfig)
    # built directly, the base class gives the method's class, as the spec does
    assert type(TrainConfig(method="eagle3", head_depth=2)) is Eagle3Config and type(TrainConfig()) is PromptTokenConfig
    with pytest.raises(SpecError) as err:
        spec_from_dict({"name": "x", "train": {"method": "layer-skip", "init_from": "c", "search_trials": 0}})
    message = str(err.value)
    assert ("'train.init_from' does not apply to train.method layer-skip: it is a key of ept, ept-head, feature-head, "
            "medusa, eagle3, early-head, skip-finetune. layer-skip takes: cpus_per_worker,") in message
    assert "'train.search_trials' = 0 is out of range: allowed 1 <= train.search_trials" in message
    with pytest.raises(SpecError, match="'train.method' = 'eagle' is not a training method; allowed: 'ept', 'ept-head'"):
        spec_from_dict({"name": "x", "train": {"method": "eagle"}})


def test_misspelled_key_is_named_with_the_allowed_ones(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\ndata:\n  limt: 10\n")
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert "data.limt" in message
    assert "limit" in message and "max_length" in message and "source" in message


def test_unknown_top_level_section():
    with pytest.raises(SpecError, match=r"unknown key 'trian'.*base_model.*data"):
        spec_from_dict({"name": "x", "trian": {}})


def test_overrides_are_typed_and_checked(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\n")
    spec = load_spec(path, ["data.limit=7", "base_model.quantization=none", "data.source=mt-bench", "data.limit=8"])
    assert (spec.data.limit, spec.base_model.quantization, spec.data.source) == (8, "none", "mt-bench")
    with pytest.raises(SpecError, match="data.limit"):
        load_spec(path, ["data.limit=many"])
    with pytest.raises(SpecError, match="base_model.quantization"):
        load_spec(path, ["base_model.quantization=int3"])
    with pytest.raises(SpecError, match="key=value"):
        load_spec(path, ["data.limit"])
    with pytest.raises(SpecError, match="data.shardz"):
        load_spec(path, ["data.shardz=2"])


def test_override_cannot_descend_into_a_value():
    with pytest.raises(SpecError, match="'name' is a value"):
        apply_overrides({"name": "x"}, ["name.first=y"])


def test_flatten_gives_mlflow_params():
    params = flatten(spec_from_dict({"name": "x"}))
    assert params["data.limit"] == 512
    assert params["base_model.name"] == "smollm2-135m"


def test_cli_reports_a_bad_key_and_exits_2(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nbase_model:\n  nme: tiny-llama\n")
    assert main(["run", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "base_model.nme" in err and "quantization" in err


def test_a_missing_spec_named_like_a_shipped_recipe_names_it():
    # the recipes moved from jobs/configs to ppdkit/jobs/configs: older commands name the first
    with pytest.raises(SpecError, match=r"job spec jobs/configs/demo.yaml does not exist; the recipe of that name "
                                        r"ships with ppdkit: .*ppdkit/jobs/configs/demo.yaml"):
        load_spec("jobs/configs/demo.yaml")
    with pytest.raises(SpecError, match=r"job spec nothing.yaml does not exist$"):
        load_spec("nothing.yaml")
