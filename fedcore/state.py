"""Strategy state as a plain tree, and back: one generic checkpoint path for every method.

A method's ``State`` is a dataclass (fields marked ``transient()`` — scratch buffers — are
not saved and come back as their defaults) (nested dataclasses, tensors, numpy arrays, scalars,
strings, None, lists, tuples, sets and dicts of these). :func:`to_tree` turns it into
dicts, lists, tensors and scalars only, which ``torch.load(weights_only=True)`` reads
back. No method writes its own save/load code.

A tree stores a dataclass's *fields*, never its class: reading a checkpoint imports nothing
and instantiates nothing a file names. :func:`from_tree` gives each dataclass back as
:class:`Fields` (or as the class it is told, ``from_tree(tree, State)``); the strategy that
owns the state rebuilds its own ``State`` from them with :func:`rebuild`, which reads the
nested classes off the ``State``'s field annotations. A tree of the earlier format (a
``"class": "module:qualname"`` per dataclass) is refused in one line (:data:`EARLIER_FORMAT`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import numpy as np
import torch

_TAG = "__state__"
_FIELDS = "fields"  # a dataclass: its fields only
_EARLIER = "dataclass"  # the earlier format's dataclass node (fields and a class path): no longer read
EARLIER_FORMAT = ("the strategy state is in the earlier checkpoint format (a class path per dataclass), which this "
                  "version no longer loads: start the run again, or resume it with the version that wrote it")


def transient(default: Any = None) -> Any:
    """A dataclass field that is scratch space, not state (left out of checkpoints)."""
    return dataclasses.field(default=default, repr=False, compare=False, metadata={"transient": True})


class Fields(dict):
    """A saved dataclass's fields, not yet rebuilt (the owner calls :func:`rebuild`). Read-only
    attribute access (``fields.last_round``) is there for inspection."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"the saved state has no field '{name}' (fields: {sorted(self)})") from None


def to_tree(obj: Any) -> Any:
    """A tree of dicts, lists, tensors and scalars holding ``obj`` (tensors are copied)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {_TAG: _FIELDS, "fields": {f.name: to_tree(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                          if not f.metadata.get("transient")}}
    if isinstance(obj, Fields):  # read back and saved again without being rebuilt
        return {_TAG: _FIELDS, "fields": {k: to_tree(v) for k, v in obj.items()}}
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


def from_tree(tree: Any, into: Any = None) -> Any:
    """Inverse of :func:`to_tree`. Dataclasses come back as :class:`Fields`, or rebuilt when
    ``into`` says what the tree holds (a dataclass, or an annotation such as ``State | None``)."""
    value = _plain(tree)
    return value if into is None else _typed(value, into)


def _plain(tree: Any) -> Any:
    if isinstance(tree, list):
        return [_plain(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    kind = tree.get(_TAG)
    if kind == _EARLIER:
        raise ValueError(EARLIER_FORMAT)
    if kind == _FIELDS:
        return Fields({name: _plain(v) for name, v in tree["fields"].items()})
    if kind == "ndarray":
        return tree["data"].numpy().copy()
    if kind == "dtype":
        return getattr(torch, tree["name"])
    if kind == "dict":
        return {_plain(k): _plain(v) for k, v in tree["items"]}
    if kind == "tuple":
        return tuple(_plain(v) for v in tree["items"])
    if kind == "set":
        return {_plain(v) for v in tree["items"]}
    return {k: _plain(v) for k, v in tree.items()}


def rebuild(cls: type, fields: Fields | dict) -> Any:
    """An instance of the dataclass ``cls`` from its saved fields; nested dataclasses (also inside
    lists, tuples, sets, dicts and ``X | None``) are rebuilt from ``cls``'s field annotations. A
    field annotated ``Any`` stays :class:`Fields` for its owner to rebuild. Fields the class no
    longer has are a one-line ValueError naming them."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"rebuild() needs a dataclass, got {cls!r}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ValueError(f"the saved state has fields {unknown} that {cls.__qualname__} does not have "
                         f"(its fields: {sorted(known)}): it was written by another version of the method")
    hints = typing.get_type_hints(cls)
    values = {name: _typed(v, hints.get(name, Any)) for name, v in fields.items()}
    obj = cls(**{k: v for k, v in values.items() if known[k].init})
    for k, v in values.items():  # fields outside __init__ (init=False) are set after
        if not known[k].init:
            object.__setattr__(obj, k, v)
    return obj


def _typed(value: Any, hint: Any) -> Any:
    """``value`` (from :func:`_plain`) with the dataclasses ``hint`` names rebuilt."""
    if hint is Any or value is None:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if isinstance(value, Fields):
            classes = [a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)]
            if len(classes) == 1:
                return rebuild(classes[0], value)
            return value
        containers = [a for a in args if typing.get_origin(a) in (list, tuple, set, frozenset, dict)]
        return _typed(value, containers[0]) if len(containers) == 1 else value
    if isinstance(value, Fields):
        return rebuild(hint, value) if isinstance(hint, type) and dataclasses.is_dataclass(hint) else value
    if origin is list and isinstance(value, list) and args:
        return [_typed(v, args[0]) for v in value]
    if origin in (set, frozenset) and isinstance(value, set) and args:
        return {_typed(v, args[0]) for v in value}
    if origin is tuple and isinstance(value, tuple) and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(v, args[0]) for v in value)
        if len(args) == len(value):
            return tuple(_typed(v, a) for v, a in zip(value, args, strict=True))
        return value
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return {_typed(k, args[0]): _typed(v, args[1]) for k, v in value.items()}
    return value
