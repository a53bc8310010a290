"""Component integrity: every file listed with its sha256 and size, checked on load; damage is refused."""

import json
import logging
import shutil

import pytest
import torch

from conftest import REPO
from ppdkit.models.artifact import ArtifactError, add_files, read_component, write_component, write_ngrams
from ppdkit.runtime.decoder import Decoder

COMMITTED = REPO / "ppdkit" / "models" / "components" / "smollm2-135m-ppd"


@pytest.fixture
def component(tmp_path):
    directory = tmp_path / "component"
    write_component(directory, "ept", {"num_prompt_tokens": 2}, "tiny", "sha256:" + "ab" * 32, {"step": 1},
                    {"prompt_embeddings": torch.randn(2, 1, 8)})
    add_files(directory, json_files={"trees": {"tau": 1.5}})
    write_ngrams(directory, {"keys_1": torch.tensor([[3]], dtype=torch.int32)})
    return directory


def _overwrite(path, offset_from_end: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) - offset_from_end:len(raw) - offset_from_end + len(data)] = data
    path.write_bytes(bytes(raw))


def test_every_file_is_listed_with_its_checksum_and_read_back(component):
    meta = json.loads((component / "component.json").read_text())
    assert sorted(meta["files"]) == ["ngrams.safetensors", "trees.json", "weights.safetensors"]
    assert all(len(entry["sha256"]) == 64 and entry["size"] > 0 for entry in meta["files"].values())
    loaded = read_component(component)
    assert loaded.verified and loaded.extras == {"trees": {"tau": 1.5}} and loaded.ngrams["keys_1"].tolist() == [[3]]


def test_the_committed_component_lists_and_passes_its_checksums():
    loaded = read_component(COMMITTED)
    assert loaded.verified and "trees" in loaded.extras and loaded.ngrams is None  # ppd-corpus drafts from the corpus
    listed = json.loads((COMMITTED / "component.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in COMMITTED.iterdir() if p.suffix in (".json", ".safetensors")
                                    and p.name not in ("component.json", "history.json"))  # no file left unlisted


def test_ten_overwritten_bytes_are_refused_before_the_base_model_loads(tmp_path):
    """The reported case: ten bytes near the end of the committed weights (one embedding now holds NaN)."""
    damaged = tmp_path / "damaged"
    shutil.copytree(COMMITTED, damaged)
    _overwrite(damaged / "weights.safetensors", 40, b"\xff" * 10)
    with pytest.raises(ArtifactError, match=r"weights.safetensors does not match its sha256.*export the component again"):
        Decoder.from_pretrained(damaged)


@pytest.mark.parametrize("damage", ["truncated", "missing", "flipped-json", "flipped-ngrams"])
def test_damaged_or_missing_files_are_refused_naming_the_file(component, damage):
    name = {"truncated": "weights.safetensors", "missing": "trees.json", "flipped-json": "trees.json",
            "flipped-ngrams": "ngrams.safetensors"}[damage]
    path = component / name
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-7])
        expected = "has .* bytes, component.json lists"
    elif damage == "missing":
        path.unlink()
        expected = "is missing"
    else:
        _overwrite(path, 3, b"#")
        expected = "does not match its sha256"
    with pytest.raises(ArtifactError, match=f"{name} {expected}"):
        read_component(component)


def test_non_finite_weights_are_refused_even_with_matching_checksums(component):
    """A tampered file listed again with its new checksum still cannot bring NaN or inf in."""
    for bad in (float("nan"), float("inf")):
        weights = torch.randn(2, 1, 8)
        weights[1, 0, 3] = bad
        write_component(component, "ept", {}, "tiny", "sha256:" + "ab" * 32, {}, {"prompt_embeddings": weights})
        with pytest.raises(ArtifactError, match="'prompt_embeddings' holds 1 non-finite value"):
            read_component(component)


def test_unlisted_files_are_not_read_and_listed_names_stay_inside(component):
    (component / "extra.json").write_text("{not json")  # not listed: never read
    assert "extra" not in read_component(component).extras
    meta = json.loads((component / "component.json").read_text())
    meta["files"]["../outside.json"] = {"sha256": "0" * 64, "size": 1}
    (component / "component.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="not a file of the component"):
        read_component(component)


def test_malformed_component_json_is_a_clear_error(component):
    (component / "component.json").write_text('{"method": "ept", ')
    with pytest.raises(ArtifactError, match="component.json is not valid JSON"):
        read_component(component)


def test_a_component_without_checksums_loads_with_a_warning(component, caplog):
    meta = json.loads((component / "component.json").read_text())
    del meta["files"]
    (component / "component.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING):
        loaded = read_component(component)
    assert not loaded.verified and "lists no checksums" in caplog.text
    assert loaded.extras == {"trees": {"tau": 1.5}} and loaded.ngrams is not None
    add_files(component)  # listing it again makes it a checked component
    assert read_component(component).verified


def test_a_folder_that_is_not_a_component_names_the_committed_one_of_its_name(tmp_path):
    # the committed components moved from models/components to ppdkit/models/components: commands in older reports
    # name the first
    with pytest.raises(ArtifactError, match=r"no component.json\); the committed component of that name is "
                                            "ppdkit/models/components/smollm2-135m-eagle3"):
        read_component(tmp_path / "models" / "components" / "smollm2-135m-eagle3")
    with pytest.raises(ArtifactError, match=r"not a ppdkit component \(no component.json\)$"):
        read_component(tmp_path / "elsewhere")
