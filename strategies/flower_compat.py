"""Flower's names on the strategies that share a name with Flower's: a drop-in for ``flwr.serverapp.strategy``.

A class that shares a name with one of Flower's (FedAvg, FedProx, FedAvgM, FedAdam, FedYogi,
FedAdagrad, FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan, and QFFL for QFedAvg) declares
``flower_counterpart`` (Flower's class) and ``flower_names`` (Flower's keyword → its own: a
``Params`` field or a common argument such as ``lr``). Then:

* **keywords** — Flower's name is accepted beside the class's own, with Flower's meaning
  (``FedAvgM(server_momentum=0.5)`` is ``FedAvgM(momentum=0.5)``); the same value given both
  ways is a one-line TypeError (:class:`FlowerKeywords`); positional arguments bind as Flower's
  ``__init__`` binds them (``QFFL(0.1, 0.2)`` is ``client_learning_rate=0.1, q=0.2``);
* **attributes** — each of Flower's names, and each ``Params`` field, is an attribute
  (:class:`ParamAttribute`): reading it gives the value in use, setting it after construction
  replaces the frozen ``params`` (checked as at construction: a bad value is a ConfigError) and
  the class's :meth:`~strategies.base.FairStrategy.params_changed` re-syncs what it built from them.

Flower's own keywords common to every strategy (``min_available_nodes``, ``weighted_by_key``, ...)
are :class:`~strategies.base.FairStrategy` arguments of every class. :func:`client_metrics` is
Flower's aggregation of the clients' own metrics (``train_metrics_aggr_fn`` /
``evaluate_metrics_aggr_fn``), which ``aggregate_train`` and ``aggregate_evaluate`` return beside
the method's own.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from abc import ABCMeta
from collections.abc import Iterable
from typing import Any

from flwr.app import Message, MetricRecord, RecordDict

log = logging.getLogger("fedpcd")


class FlowerKeywords(ABCMeta):
    """The strategies' metaclass: a call sees the keywords as given, before any default applies,
    so Flower's names are translated (and one given both ways refused) before ``__init__`` runs."""

    def __call__(cls, *args: Any, **kwargs: Any):
        counterpart = getattr(cls, "flower_counterpart", None)
        if args:
            if counterpart is None:
                raise TypeError(f"{cls.__name__}() takes keyword arguments only")
            bound = inspect.signature(counterpart.__init__).bind_partial(None, *args)
            given = [name for name in list(bound.arguments)[1:] if name in kwargs]
            if given:
                raise TypeError(f"{cls.__name__}() got {given[0]!r} both by position and by keyword")
            kwargs = {**dict(list(bound.arguments.items())[1:]), **kwargs}
        kwargs = translate(cls, kwargs)
        return super().__call__(**kwargs)


def translate(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with Flower's names (``cls.flower_names``) replaced by the class's own; the same
    value given both ways is a TypeError."""
    out = dict(kwargs)
    for flower, own in getattr(cls, "flower_names", {}).items():
        if flower == own or flower not in out:
            continue
        if own in out:
            raise TypeError(f"{cls.__name__}() got both {flower!r} (Flower's name) and {own!r} (its own) for the "
                            f"same value: give one of them")
        out[own] = out.pop(flower)
    return out


class ParamAttribute:
    """An attribute named as Flower names it (or as the ``Params`` field) whose value is the
    strategy's ``own``: a field of its frozen ``params`` (setting it replaces ``params``, checked by
    ``Params.__post_init__``) or a plain attribute (``lr``, checked as the constructor checks it).
    Either way the strategy's ``params_changed()`` then re-syncs what it built from them."""

    def __init__(self, own: str) -> None:
        self.own = own

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def _is_field(self, obj: Any) -> bool:
        return any(f.name == self.own for f in dataclasses.fields(type(obj).Params))

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.params, self.own) if self._is_field(obj) else getattr(obj, self.own)

    def __set__(self, obj: Any, value: Any) -> None:
        if self._is_field(obj):
            obj.params = dataclasses.replace(obj.params, **{self.own: value})
        else:
            obj.set_common(self.own, value)
        obj.params_changed()


def install_attributes(cls: type) -> None:
    """Flower's names and the Params fields as attributes of ``cls`` (a class that declares its own
    ``flower_names``); a name some class of ``cls`` already defines is left as it is."""
    names = dict(getattr(cls, "flower_names", {}))
    names.update({f.name: f.name for f in dataclasses.fields(cls.Params) if f.name not in names})
    for name, own in names.items():
        taken = any(name in klass.__dict__ and not isinstance(klass.__dict__[name], ParamAttribute)
                    for klass in cls.__mro__)
        if not taken:
            attr = ParamAttribute(own)
            attr.__set_name__(cls, name)
            setattr(cls, name, attr)


def flower_view(reply: Message, metric_keys: Iterable[str] | None) -> RecordDict:
    """The reply's content with its MetricRecord as the client sent it (``metric_keys``: the keys it
    had before the round's validation read aliases into it), for Flower's metric aggregation."""
    content = reply.content
    if metric_keys is None:
        return content
    wanted = set(metric_keys)
    out = RecordDict()
    for name, record in content.items():
        out[name] = MetricRecord({k: v for k, v in record.items() if k in wanted}) \
            if isinstance(record, MetricRecord) else record
    return out


def client_metrics(strategy: Any, replies: list[Message], fn, what: str,
                   sent: dict[int, tuple[str, ...]] | None = None) -> MetricRecord | None:
    """Flower's aggregate of the clients' own metrics: ``fn(contents, strategy.weighted_by_key)``
    over ``replies`` (Flower's ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``; by default
    the ``weighted_by_key``-weighted mean of every metric, that key left out). None without
    replies; a function that fails is logged (one warning) and gives None: the round stands."""
    if not replies:
        return None
    contents = [flower_view(r, None if sent is None else sent.get(id(r))) for r in replies]
    try:
        return fn(contents, strategy.weighted_by_key)
    except Exception as exc:  # noqa: BLE001 - a metrics function cannot fail the round
        log.warning("%s: the clients' metrics were not aggregated (%s(..., %r) raised %s: %s)", what,
                    getattr(fn, "__name__", fn), strategy.weighted_by_key, type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "")
        return None


def metric_keys(replies: Iterable[Message]) -> dict[int, tuple[str, ...]]:
    """id(reply) → the metric keys each reply carries now (before the round reads aliases into them)."""
    out = {}
    for r in replies:
        if not r.has_error():
            for record in r.content.values():
                if isinstance(record, MetricRecord):
                    out[id(r)] = tuple(record.keys())
                    break
    return out


def merged(client: MetricRecord | None, own: MetricRecord | None) -> MetricRecord | None:
    """The clients' aggregated metrics with the method's own beside them (the method's win a clash)."""
    if client is None:
        return own
    return MetricRecord({**dict(client), **dict(own or {})})
