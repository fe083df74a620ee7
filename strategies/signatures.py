"""Explicit keyword-only signatures for the strategy classes (``FairStrategy.__init_subclass__``).

``inspect.signature(FedPCD)`` and help() read ``__signature__``: the method's ``Params`` fields
(defaults and types from the declaration), then the ``__init__`` arguments of the class and its
bases. Generated, so it cannot drift from the declarations (tests/test_strategy_signatures.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from collections.abc import Callable

from fedcore.params import MethodParams


def _own_keywords(init: Callable) -> list[inspect.Parameter]:
    """The named keyword arguments of one ``__init__`` (``**kwargs`` and ``self`` left out)."""
    sig = inspect.signature(init, eval_str=True)
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]


def hyperparameters(params_cls: type[MethodParams]) -> list[inspect.Parameter]:
    """One keyword-only parameter per field of a method's ``Params``: its default and type."""
    out = []
    for f, kind in params_cls._fields():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind))
    return out


def strategy_signature(cls: type, base: type) -> inspect.Signature:
    """``(*, <Params fields>, <the class's own __init__ arguments>, <base's>, params=None)``: the
    ``__init__`` arguments of every class from ``cls`` up to ``base`` (FairStrategy).

    A Params field named like an argument of an ``__init__`` would never reach the Params (the
    ``__init__`` takes it first): that is a TypeError when the class is defined."""
    own: list[inspect.Parameter] = []
    for klass in cls.__mro__:
        if "__init__" in klass.__dict__:
            own += [p for p in _own_keywords(klass.__dict__["__init__"]) if p.name not in {q.name for q in own}]
        if klass is base:
            break
    hyper = hyperparameters(cls.Params)
    clash = sorted({p.name for p in hyper} & {p.name for p in own})
    if clash:
        raise TypeError(f"{cls.__qualname__}.Params field(s) {clash} are also __init__ arguments: rename them")
    common = [p for p in own if p.name != "params"]
    params = inspect.Parameter("params", inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=cls.Params | None)
    return inspect.Signature([*hyper, *common, params])


def describe_hyperparameters(params_cls: type[MethodParams]) -> str:
    """The docstring section help() shows, generated from the ``Params`` declaration: each
    hyperparameter, its type and default, run-config key and allowed values, what it means
    and, for a tuned one, its search space."""
    lines = ["Hyperparameters (keyword arguments; the run-config key and the allowed values in brackets)",
             "----------"]
    for f, kind in params_cls._fields():
        name = getattr(kind, "__name__", str(kind))
        if f.metadata.get("nested"):
            lines.append(f"{f.name} : {kind.__module__}.{name}, default {name}()  "
                         f"[{', '.join(kind.run_config_keys())}]")
            continue
        bracket = ", ".join(filter(None, [params_cls.key_of(f.name), params_cls.allowed(f.name)]))
        lines.append(f"{f.name} : {name}, default {f.default!r}  [{bracket}]")
        if f.metadata.get("doc"):
            lines += textwrap.wrap(f.metadata["doc"], 96, initial_indent="    ", subsequent_indent="    ")
        if (grid := f.metadata.get("grid")) is not None:
            values = ", ".join(map(str, grid.values))
            lines.append(f"    tuned over {values} (extended within [{grid.low}, {grid.high}])")
    if len(lines) == 2:
        lines.append("none")
    return "\n".join(lines)
