"""A method's hyperparameters, declared once: a frozen dataclass with run-config keys.

Each method module declares::

    @dataclasses.dataclass(frozen=True)
    class Params(MethodParams):
        prefix = "fedpcd"                     # run-config keys: fedpcd-<field name>
        tau: float = hyper(0.02, low=0.0, doc="required progress τ per constraint",
                           grid=Grid((0.005, 0.01, 0.02), 0.0, 1.0))   # key fedpcd-tau, default 0.02, ≥ 0
        normalize: str = hyper("l2", choices=("l2", "none", "ema"))

The same declaration serves every reader: keyword construction (``FedPCD(tau=0.05)``,
checked in ``__post_init__``; :meth:`MethodParams.from_keywords` names the keyword in errors),
the run config (:meth:`MethodParams.from_run_config` reads ``fedpcd-tau``), the strategy class's
``__init__`` (which names each field with its default; tests/test_strategy_signatures.py keeps them
equal), a sweep's search space (``grid``:
``fedpcd_app.analysis.tuning``), and the generated pyproject.toml table, ``fedcore.defaults``
and README methods table (``scripts/generate.py``).

A field whose type is itself a ``MethodParams`` (Ditto's CRAFT aggregator settings) is read
with that class's own keys. Errors are one line: the key, the value and what is allowed
(:func:`fedcore.config.check_value`, shared with the app keys: a float field must be finite).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from fedcore.config import ConfigError, Grid, allowed_words, check_value, did_you_mean

_KINDS = {"float": float, "int": int, "bool": bool, "str": str}
# Per Params class: its (field, type) pairs and field name → run-config key. A class's fields
# and annotations do not change after its definition; resolving the annotations
# (typing.get_type_hints) on every read cost more than the read, several times per client message
# (docs/performance.md, rule 8).
_FIELDS: dict[type, list[tuple[dataclasses.Field, Any]]] = {}
_KEYS: dict[type, dict[str, str]] = {}


def key_for(prefix: str, name: str) -> str:
    """The run-config key of field ``name`` of a method whose keys start with ``prefix``:
    ``key_for("federage", "beta_lr")`` is ``federage-beta-lr`` (the one naming rule; a field may
    declare another key with ``hyper(key=...)``)."""
    return f"{prefix}-{name.replace('_', '-')}"


def hyper(default: Any, *, key: str | None = None, low: float | None = None, high: float | None = None,
          low_open: bool = False, high_open: bool = False, choices: tuple[str, ...] | None = None,
          doc: str = "", grid: Grid | None = None, reduces_to: Mapping[str, Any] | None = None,
          reduces_with: Mapping[str, Any] | None = None) -> Any:
    """A hyperparameter field: its default, its run-config key (default ``<prefix>-<name>``
    with ``_`` → ``-``), what values are allowed, what it means (``doc``: help(), pyproject's
    comment) and, for a tuned key, its search space (``grid``). ``reduces_to={"fedavg": 0.0}``
    declares that at this value the method *is* that method (with ``reduces_with``'s other keys
    at their values, e.g. FedAvgM's server lr 1): a sweep's tuner then tries the method at that
    value at every lr its baseline tries (``fedpcd_app.analysis.tuning``), so that tuning can
    never make a method trail its own special case."""
    return dataclasses.field(default=default, metadata={
        "key": key, "low": low, "high": high, "low_open": low_open, "high_open": high_open, "choices": choices,
        "doc": doc, "grid": grid, "reduces_to": dict(reduces_to or {}), "reduces_with": dict(reduces_with or {})})


def nested(cls: type) -> Any:
    """A field holding another method's Params (read with that method's keys)."""
    return dataclasses.field(default_factory=cls, metadata={"nested": True})


@dataclasses.dataclass(frozen=True)
class MethodParams:
    """Base of every method's ``Params`` (see the module docstring)."""

    prefix: ClassVar[str] = ""

    # -- declaration ------------------------------------------------------------------------
    @classmethod
    def _fields(cls) -> list[tuple[dataclasses.Field, Any]]:
        fields = _FIELDS.get(cls)
        if fields is None:
            hints = typing.get_type_hints(cls)
            fields = _FIELDS[cls] = [(f, hints[f.name]) for f in dataclasses.fields(cls)]
        return fields

    @classmethod
    def key_of(cls, name: str) -> str:
        names = _KEYS.get(cls)
        if names is None:
            names = _KEYS[cls] = {f.name: f.metadata.get("key") or key_for(cls.prefix, f.name)
                                  for f in dataclasses.fields(cls)}
        return names[name]

    @classmethod
    def run_config_keys(cls) -> dict[str, Any]:
        """Run-config key → default, nested Params included."""
        out: dict[str, Any] = {}
        for f, kind in cls._fields():
            if f.metadata.get("nested"):
                out.update(kind.run_config_keys())
            else:
                out[cls.key_of(f.name)] = f.default
        return out

    @classmethod
    def declarations(cls) -> list[tuple[str, Any, str, str]]:
        """(run-config key, default, doc, the allowed values in words) of every key, nested
        Params included: what the generated pyproject table and README say."""
        out: list[tuple[str, Any, str, str]] = []
        for f, kind in cls._fields():
            if f.metadata.get("nested"):
                out += kind.declarations()
            else:
                out.append((cls.key_of(f.name), f.default, f.metadata.get("doc", ""), cls.allowed(f.name)))
        return out

    @classmethod
    def grids(cls) -> dict[str, Grid]:
        """Run-config key → search space, for the fields declared with a ``grid``."""
        return {cls.key_of(f.name): f.metadata["grid"] for f, _ in cls._fields()
                if not f.metadata.get("nested") and f.metadata.get("grid") is not None}

    @classmethod
    def reductions(cls) -> list[tuple[str, Any, str, dict[str, Any]]]:
        """(run-config key, value, the method it reduces to, the other keys' values it needs) of
        every declared reduction (``hyper(reduces_to=...)``), in field order."""
        return [(cls.key_of(f.name), value, method, dict(f.metadata.get("reduces_with") or {}))
                for f, _ in cls._fields() if not f.metadata.get("nested")
                for method, value in (f.metadata.get("reduces_to") or {}).items()]

    @classmethod
    def allowed(cls, name: str) -> str:
        """What field ``name`` allows, in words (``finite, >= 0``)."""
        f, kind = next((f, k) for f, k in cls._fields() if f.name == name)
        meta = f.metadata
        return allowed_words(_kind(kind), meta.get("low"), meta.get("high"), bool(meta.get("low_open")),
                             bool(meta.get("high_open")), meta.get("choices"))

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_keywords(cls, kwargs: Mapping[str, Any], *, owner: str, known: Any = ()):
        """The values given as Python keywords to ``owner`` (``FedPCD(tau=0.05)``): an unknown
        keyword is a TypeError with the closest ones among ``known`` (the owner's whole
        signature) and the fields; a bad value a :class:`ConfigError` naming the keyword and
        its run-config key."""
        fields = {f.name: (f, kind) for f, kind in cls._fields()}
        unknown = sorted(set(kwargs) - set(fields))
        if unknown:
            close = "".join(did_you_mean(u, dict.fromkeys([*known, *fields])) for u in unknown)
            raise TypeError(f"{owner}() got unknown argument(s) {unknown}{close}; "
                            f"its hyperparameters are {sorted(fields) or 'none'}")
        for name, value in kwargs.items():
            f, kind = fields[name]
            if not f.metadata.get("nested"):
                cls._coerce(f, kind, value, subject=f"{owner}() keyword '{name}' (run-config key "
                                                    f"'{cls.key_of(name)}')")
        return cls(**kwargs)

    @classmethod
    def from_run_config(cls, raw: Mapping[str, Any]):
        """The method's values from a flat run config (a missing key takes its default)."""
        kwargs = {}
        for f, kind in cls._fields():
            if f.metadata.get("nested"):
                kwargs[f.name] = kind.from_run_config(raw)
            elif cls.key_of(f.name) in raw:
                kwargs[f.name] = raw[cls.key_of(f.name)]
        return cls(**kwargs)

    def to_run_config(self) -> dict[str, Any]:
        """Run-config key → value (nested Params included)."""
        out: dict[str, Any] = {}
        for f, _ in self._fields():
            value = getattr(self, f.name)
            if f.metadata.get("nested"):
                out.update(value.to_run_config())
            else:
                out[self.key_of(f.name)] = value
        return out

    def __post_init__(self) -> None:
        for f, kind in self._fields():
            if f.metadata.get("nested"):
                if not isinstance(getattr(self, f.name), kind):
                    raise ConfigError(f"{type(self).__qualname__}.{f.name} must be a {kind.__qualname__}")
                continue
            object.__setattr__(self, f.name, self._coerce(f, kind, getattr(self, f.name)))
        self.check()

    @classmethod
    def _coerce(cls, f: dataclasses.Field, kind: Any, value: Any, subject: str | None = None) -> Any:
        """Typed and range-checked by :func:`fedcore.config.check_value`, the one check of
        every key (a float must be finite: NaN passes no ``<`` test)."""
        meta = f.metadata
        return check_value(cls.key_of(f.name), value, _kind(kind), low=meta.get("low"), high=meta.get("high"),
                           low_open=bool(meta.get("low_open")), high_open=bool(meta.get("high_open")),
                           choices=meta.get("choices"), subject=subject)

    def check(self) -> None:
        """Checks across fields (one-line :class:`ConfigError`); none by default."""

    def check_run(self, rounds: int, clients_per_round: int) -> None:
        """Checks against what the run brings (one-line :class:`ConfigError`): a key that sizes
        a buffer or a selection bounded by the run's ``rounds`` or the ``clients_per_round`` it
        asks (FedFV's τ); none by default. The app calls it before the run."""


def _kind(annotation: Any) -> type:
    """bool, int, float or str for a field's resolved annotation (``object``: no coercion)."""
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return _KINDS.get(name, object)


@dataclasses.dataclass(frozen=True)
class NoParams(MethodParams):
    """A method without hyperparameters of its own."""


def sent_value(config: Mapping[str, Any], key: str) -> Any:
    """A client-side hyperparameter as the server sent it in the request config (its
    method's ``request``): clients declare no defaults, so a missing key is an error."""
    if key not in config:
        raise ConfigError(f"the server did not send '{key}' in the request config: the strategy's "
                          "method's request() (or a foreign server app) must send it")
    return config[key]
