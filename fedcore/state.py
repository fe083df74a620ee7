"""Strategy state as a plain tree, and back: one generic checkpoint path for every method.

A method's ``State`` is a dataclass (fields marked ``transient()`` — scratch buffers — are
not saved and come back as their defaults) (nested dataclasses, tensors, numpy arrays, scalars,
strings, None, lists, tuples, sets and dicts of these). :func:`to_tree` turns it into
dicts, lists, tensors and scalars only, which ``torch.load(weights_only=True)`` reads
back; :func:`from_tree` rebuilds the objects. No method writes its own save/load code.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import torch

_TAG = "__state__"
# Only classes of this project are rebuilt from a checkpoint.
_ALLOWED_MODULES = ("strategies.", "fedcore.", "fedpcd_app.", "client_app.", "tests.")


def transient(default: Any = None) -> Any:
    """A dataclass field that is scratch space, not state (left out of checkpoints)."""
    return dataclasses.field(default=default, repr=False, compare=False, metadata={"transient": True})


def to_tree(obj: Any) -> Any:
    """A tree of dicts, lists, tensors and scalars holding ``obj`` (tensors are copied)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {_TAG: "dataclass", "class": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: to_tree(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                           if not f.metadata.get("transient")}}
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, np.ndarray):
        return {_TAG: "ndarray", "data": torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.dtype):
        return {_TAG: "dtype", "name": str(obj).removeprefix("torch.")}
    if isinstance(obj, dict):
        return {_TAG: "dict", "items": [[to_tree(k), to_tree(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {_TAG: "tuple", "items": [to_tree(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {_TAG: "set", "items": [to_tree(v) for v in sorted(obj)]}
    if isinstance(obj, list):
        return [to_tree(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__qualname__}: state must be dataclasses, tensors, "
                    "arrays, scalars and containers of these")


def _class(path: str) -> type:
    module, _, qualname = path.partition(":")
    if not module.startswith(_ALLOWED_MODULES):
        raise ValueError(f"checkpoint names a class outside this project: {path}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def from_tree(tree: Any) -> Any:
    """Inverse of :func:`to_tree`."""
    if isinstance(tree, list):
        return [from_tree(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    kind = tree.get(_TAG)
    if kind == "dataclass":
        cls = _class(tree["class"])
        values = {name: from_tree(v) for name, v in tree["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        obj = cls(**{k: v for k, v in values.items() if k in init})
        for k, v in values.items():  # fields outside __init__ (init=False) are set after
            if k not in init:
                object.__setattr__(obj, k, v)
        return obj
    if kind == "ndarray":
        return tree["data"].numpy().copy()
    if kind == "dtype":
        return getattr(torch, tree["name"])
    if kind == "dict":
        return {from_tree(k): from_tree(v) for k, v in tree["items"]}
    if kind == "tuple":
        return tuple(from_tree(v) for v in tree["items"])
    if kind == "set":
        return {from_tree(v) for v in tree["items"]}
    return {k: from_tree(v) for k, v in tree.items()}
