"""Nested state (dicts, lists, tensors, plain values) saved as safetensors + JSON: never pickle.

Optimizer, scheduler and module state dicts are trees of tensors and plain values; the tensors go to
`<prefix>.safetensors` under generated names, the structure to `<prefix>.json`. Integer dict keys
(torch optimizers use them) survive the round trip.
"""

import json
import os
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def _encode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = node.detach().cpu().contiguous().clone()
        return {"__tensor__": name}
    if isinstance(node, dict):
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in node.items()]}
    if isinstance(node, (list, tuple)):
        return {"__list__" if isinstance(node, list) else "__tuple__": [_encode(v, tensors) for v in node]}
    if isinstance(node, Enum):
        return _encode(node.value, tensors)
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    raise TypeError(f"cannot save a {type(node).__name__} without pickle; convert it to tensors or plain values")


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, dict):
        if "__tensor__" in node:
            return tensors[node["__tensor__"]]
        if "__dict__" in node:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in node["__dict__"]}
        if "__list__" in node:
            return [_decode(v, tensors) for v in node["__list__"]]
        if "__tuple__" in node:
            return tuple(_decode(v, tensors) for v in node["__tuple__"])
    return node


def save_state(tree: Any, prefix: Path) -> None:
    """Write `<prefix>.safetensors` and `<prefix>.json` (each atomically)."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(tree, tensors)
    prefix = Path(prefix)
    tmp = prefix.with_name(prefix.name + ".tmp.safetensors")
    save_file(tensors, str(tmp))
    os.replace(tmp, prefix.with_name(prefix.name + ".safetensors"))
    tmp = prefix.with_name(prefix.name + ".tmp.json")
    tmp.write_text(json.dumps(structure))
    os.replace(tmp, prefix.with_name(prefix.name + ".json"))


def load_state(prefix: Path) -> Any:
    prefix = Path(prefix)
    tensors = load_file(str(prefix.with_name(prefix.name + ".safetensors")))
    return _decode(json.loads(prefix.with_name(prefix.name + ".json").read_text()), tensors)
