"""Byzantine-robust aggregation: Flower's FedMedian, FedTrimmedAvg, Krum, MultiKrum and Bulyan.

Flower 1.42 ships all five in ``flwr.serverapp.strategy``; this module wraps them (as
:mod:`strategies.fedopt` wraps the server optimisers) instead of rewriting them: the wrapped
strategy aggregates the validated replies exactly as Flower does, on copies of their records
(Flower's median, trimmed mean and Bulyan empty the records they read). With θ_i the m local
models of a round and n_i their example counts:

* FedMedian (Yin et al., ICML 2018, arXiv:1803.01498): the coordinate-wise median of θ_i.
* FedTrimmedAvg (same paper): per coordinate, the mean after dropping the ⌊β·m⌋ lowest and
  ⌊β·m⌋ highest values.
* Krum (Blanchard et al., NeurIPS 2017, arXiv:1703.02757): the θ_i whose summed squared
  distance to its m − f − 2 nearest other models is smallest (f: assumed attackers).
* MultiKrum (same paper): the n_i-weighted mean of the k models with the lowest such scores.
* Bulyan (El Mhamdi et al., ICML 2018, arXiv:1802.07927): MultiKrum selects m − 2f models;
  per coordinate, the mean of the m − 4f of them closest to their median.

**f against the clients a round brings.** Krum and MultiKrum need m > 2f + 2 replies when
f > 0 (each score sums the m − f − 2 nearest neighbours of a model), Bulyan m ≥ 4f + 3; MultiKrum's k at
most the clients a round asks. A run whose rounds ask fewer clients (``fraction-train`` ×
``num-clients``, known when ``num_clients`` is given) is refused before it starts, in one line
(:meth:`FlowerRobust.check_clients`); a round left with fewer valid replies (drops) keeps the
model, reports ``<method>-skipped`` = 1 and logs a warning (:meth:`FlowerRobust.aggregate_valid`).

None of them weights by data size except MultiKrum's final mean. With ``server-lr`` η_g set
the step is θ_t − (η_g/η_l)·(θ_t − aggregate), as for FedAvg; 0 (the default) takes the
aggregate as it is. Krum, MultiKrum and Bulyan report the partitions they selected
(``<method>-selected``); every method reports ``update-norm`` = ‖θ_t − aggregate‖.

"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import strategy as flower
from flwr.serverapp.strategy.multikrum import select_multikrum

from fedcore import flat, keys
from fedcore.config import ConfigError
from fedcore.params import MethodParams, NoParams, hyper
from strategies.base import FairStrategy
from strategies.registry import register
from strategies.rounds import Aggregated
from strategies.updates import client_of

log = logging.getLogger("fedpcd")


@dataclasses.dataclass(frozen=True)
class FedTrimmedAvgParams(MethodParams):
    prefix = "fedtrimmedavg"
    beta: float = hyper(0.2, low=0.0, high=0.5, high_open=True, doc="β, the fraction cut at each end (Flower's "
                                                                     "default)")


@dataclasses.dataclass(frozen=True)
class KrumParams(MethodParams):
    prefix = "krum"
    num_malicious: int = hyper(0, low=0, doc="f, the attackers assumed")


@dataclasses.dataclass(frozen=True)
class MultiKrumParams(KrumParams):
    prefix = "multikrum"
    num_select: int = hyper(0, low=0, doc="k, the models averaged; 0 = m − f (all but the assumed "
                                                  "attackers, El Mhamdi et al.'s choice); 1 is Krum")


@dataclasses.dataclass(frozen=True)
class BulyanParams(KrumParams):
    prefix = "bulyan"


def _copy(reply: Message, metric_keys: frozenset[str] | None = None) -> Message:
    """The reply with its own ArrayRecord objects (the Arrays themselves are shared, unmodified)
    and, with ``metric_keys``, a MetricRecord of those keys only."""
    content = RecordDict({name: ArrayRecord(dict(rec.items())) if isinstance(rec, ArrayRecord) else rec
                          for name, rec in reply.content.items()})
    if metric_keys is not None:
        content[keys.METRICS] = MetricRecord({k: v for k, v in reply.content[keys.METRICS].items()
                                              if k in metric_keys})
    return Message(content, metadata=reply.metadata)


def flower_copies(replies: list[Message]) -> list[Message]:
    """Copies of valid replies as Flower's own strategies accept them: Flower raises
    ``InconsistentMessageReplies`` unless every MetricRecord has the same keys, and a client may
    add metrics of its own (valid, but not a reason to fail the round): only the metric keys
    every reply has are kept."""
    common = frozenset.intersection(*(frozenset(r.content[keys.METRICS].keys()) for r in replies)) if replies \
        else frozenset()
    return [_copy(r, common) for r in replies]


def krum_min_replies(f: int) -> tuple[int, str]:
    """Krum's and MultiKrum's m > 2f + 2 (f = 0 assumes no attacker: any round, as Flower's Krum
    scores a model by its max(1, m − 2) nearest neighbours)."""
    return (2 * f + 3, "2f + 3") if f > 0 else (1, "1")


class FlowerRobust(FairStrategy):
    """A Flower robust-aggregation strategy behind the FairStrategy contract (see the module doc).

    Subclasses name the Flower class and the arguments it is built with (:meth:`flower_arguments`).
    """

    weighting = "robust"  # a robust statistic picks what counts

    flower_class: ClassVar[type]
    reports_selection: ClassVar[bool] = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._chosen: list[RecordDict] = []
        self.params_changed()

    def params_changed(self) -> None:
        """The wrapped Flower strategy, built from the current ``params`` (again when one is set)."""
        self.inner = self.flower_class(train_metrics_aggr_fn=self._keep_chosen, **self.flower_arguments())
        self.check_clients()

    def min_replies(self) -> tuple[int, str]:
        """(the fewest replies a round needs, the rule as a formula): 1 unless f says more."""
        return 1, "1"

    def clients_per_round(self) -> int | None:
        """The clients a round asks (None when ``num_clients`` is unknown)."""
        if self.num_clients is None:
            return None
        return min(self.num_clients, max(self.min_train_nodes, int(round(self.fraction_train * self.num_clients))))

    def check_clients(self) -> None:
        """A one-line ConfigError when no round can ever bring :meth:`min_replies` replies."""
        need, rule = self.min_replies()
        per_round = self.clients_per_round()
        if per_round is None or per_round >= need:
            return
        key = f"{self.Params.prefix}-num-malicious"
        f = self.params.num_malicious
        raise ConfigError(
            f"run-config key '{key}' = {f} needs at least {rule} = {need} replies per round, but fraction-train "
            f"x num-clients gives {per_round}: "
            + ("lower it or raise fraction-train" if self.num_clients >= need else
               f"a federation of {self.num_clients} clients is too small for {self.name or type(self).__name__}; "
               f"use num-clients >= {need} or another robust method (e.g. method='fedmedian')"))

    def flower_arguments(self) -> dict[str, Any]:
        """The wrapped strategy's arguments: f (Flower's ``num_malicious_nodes``) where declared."""
        f = getattr(self.params, "num_malicious", None)
        return {} if f is None else {"num_malicious_nodes": f}

    def before_round(self, num_replies: int) -> None:
        """Per-round settings of the wrapped strategy (MultiKrum's k = m − f)."""

    def _keep_chosen(self, contents, weighted_by_key):
        """Flower hands its metrics function the replies it aggregated: remember them."""
        del weighted_by_key
        self._chosen = list(contents)
        return MetricRecord()

    def aggregate_valid(self, server_round, replies):
        need, rule = self.min_replies()
        if len(replies) < need:  # drops left too few: the model stays, said in the round and the log
            log.warning("round %d: %s needs %s = %d valid replies, the round has %d: the model stays",
                        server_round, self.name, rule, need, len(replies))
            return Aggregated(None, MetricRecord({f"{self.name}-skipped": 1}))
        copies = flower_copies(replies)
        self.before_round(len(copies))
        self.inner.weighted_by_key = self.weighted_by_key
        new_arrays, _ = self.inner.aggregate_train(server_round, copies)
        if new_arrays is None:  # Flower declined the round (it logs why)
            return Aggregated(None, MetricRecord({f"{self.name}-skipped": 1}))
        theta = self.current_flat()
        # Flower's arithmetic is in the arrays' own dtype (float64 for a float64 model) or wider
        direction = theta - flat.record_to_flat(new_arrays, dtype=theta.dtype)
        metrics: dict[str, Any] = {"update-norm": float(direction.norm())}
        chosen = None
        if self.reports_selection:  # Flower aggregates the selected replies' metrics: so here too
            index = {id(c.content): i for i, c in enumerate(copies)}
            chosen = [replies[index[id(c)]] for c in self._chosen]
            metrics[f"{self.name}-selected"] = sorted(client_of(r) for r in chosen)
        return Aggregated(self.to_record(theta - self.step_scale(server_round) * direction), MetricRecord(metrics),
                          metric_replies=chosen)


@register("fedmedian")
class FedMedian(FlowerRobust):
    """Coordinate-wise median of the local models (Yin et al., 2018)."""

    Params = NoParams
    flower_class = flower_counterpart = flower.FedMedian


@register("fedtrimmedavg")
class FedTrimmedAvg(FlowerRobust):
    """Coordinate-wise mean after dropping the ``beta`` fraction of largest and smallest values."""

    Params = FedTrimmedAvgParams
    flower_class = flower_counterpart = flower.FedTrimmedAvg

    def flower_arguments(self):
        return {"beta": self.params.beta}


@register("krum")
class Krum(FlowerRobust):
    """The one local model closest to its n − f − 2 nearest neighbours (Blanchard et al., 2017)."""

    Params = KrumParams
    flower_class = flower_counterpart = flower.Krum
    flower_names = {"num_malicious_nodes": "num_malicious"}
    reports_selection = True

    def min_replies(self):
        return krum_min_replies(self.params.num_malicious)


@register("multikrum")
class MultiKrum(FlowerRobust):
    """The mean of the m models with the best Krum scores."""

    Params = MultiKrumParams
    flower_class = flower_counterpart = flower.MultiKrum
    flower_names = {"num_malicious_nodes": "num_malicious", "num_nodes_to_select": "num_select"}
    reports_selection = True
    weights_replies = True  # the mean of the selected models is weighted (Flower's weighted_by_key)

    def min_replies(self):
        return krum_min_replies(self.params.num_malicious)

    def check_clients(self):
        super().check_clients()
        k, per_round = self.params.num_select, self.clients_per_round()
        if per_round is not None and k > per_round:
            raise ConfigError(f"run-config key 'multikrum-num-select' = {k} exceeds the {per_round} clients a round "
                              "asks (fraction-train x num-clients): use at most that, or 0 (m - f)")

    def before_round(self, num_replies):
        p = self.params
        self.inner.num_nodes_to_select = p.num_select or max(1, num_replies - p.num_malicious)


@register("bulyan")
class Bulyan(FlowerRobust):
    """Multi-Krum selection, then a coordinate-wise trimmed mean (El Mhamdi et al., 2018)."""

    Params = BulyanParams
    flower_class = flower_counterpart = flower.Bulyan
    flower_names = {"num_malicious_nodes": "num_malicious"}
    reports_selection = True

    def before_round(self, num_replies):
        self.inner.selection_rule = self.selection_rule  # as set now (an attribute, as Flower's)

    def __init__(self, *, selection_rule: Callable[[list[RecordDict], int, int], list[RecordDict]] | None = None,
                 **kwargs: Any) -> None:
        # Flower's: the rule that selects the m − 2f replies (MultiKrum's by default)
        self.selection_rule = selection_rule or select_multikrum
        super().__init__(**kwargs)

    def min_replies(self):
        return 4 * self.params.num_malicious + 3, "4f + 3"
