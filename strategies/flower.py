"""The one Flower adapter: :class:`FairStrategy` is a complete ``flwr.serverapp.strategy.Strategy``
around any :class:`~strategies.base.Method`::

    strategy = FedPCD(fraction_train=0.25, tau=0.02, history=10, seed=0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=3)

A round, whoever drives it (Flower's ``start``, or this app's round loop through
:meth:`FairStrategy.train_outcome` with its :class:`~strategies.requests.RunContext`):

1. ``configure_train`` samples (the app's selector, else a draw seeded by (seed, round)) and builds
   the requests (:mod:`strategies.requests`: the model, the round's config, the method's
   :meth:`~strategies.base.Method.request`); it keeps what they asked (:class:`~strategies.gate.Asked`);
2. ``aggregate_train`` hands the replies to the gate (:func:`strategies.gate.check_train`), reads
   the kept ones into a :class:`~strategies.base.Round`, lets the method drop what its state
   refuses (:meth:`~strategies.base.Method.check`), and calls ``method.aggregate(round, state)``;
   the state it returns is the strategy's from then on (:attr:`FairStrategy.state`, checkpointed
   whole). Nothing a reply holds makes it raise; an exception of the method's is returned in the
   round's outcome (the app records it) and raised by Flower's ``aggregate_train`` (Flower's loop
   then stops, as with Flower's own strategies);
3. the clients' own metrics are aggregated as Flower does (``train_metrics_aggr_fn``), over the
   replies the gate kept and the method used, and returned beside the method's; evaluation alike.

Every constructor number is checked once, here (:func:`check_common`) or by the method's
``Params``: NaN, ±inf or a value out of range is a one-line :class:`~fedcore.config.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedcore import flat, keys
from fedcore.config import ConfigError, check_value, did_you_mean
from fedcore.internals import aggregate_metricrecords
from fedcore.params import MethodParams
from fedcore.replies import Dropped
from strategies import gate, requests
from strategies.base import Method, Round, Setting, Step, resolve_device, restore_state, server_step_scale
from strategies.gate import Asked, EvaluationOutcome, RoundOutcome, Rules
from strategies.health import DropStreak
from strategies.requests import RunContext

log = logging.getLogger("fedpcd")


def check_common(owner: str, *, fraction_train: float, fraction_evaluate: float, min_train_nodes: int,
                 min_evaluate_nodes: int, min_available_nodes: int, node_wait_timeout: float | None, seed: int,
                 lr: float, lr_decay: float, server_lr: float, num_clients: int | None,
                 own_step: str | None = None) -> dict[str, Any]:
    """The common arguments typed and range-checked (a float must be finite): one-line
    :class:`~fedcore.config.ConfigError` naming the keyword, else their checked values."""

    def one(name, value, kind, **bounds):
        return check_value(name, value, kind, subject=f"{owner}() keyword '{name}'", **bounds)

    out = {
        "fraction_train": one("fraction_train", fraction_train, float, low=0.0, high=1.0, low_open=True),
        "fraction_evaluate": one("fraction_evaluate", fraction_evaluate, float, low=0.0, high=1.0),
        "min_train_nodes": one("min_train_nodes", min_train_nodes, int, low=0),
        "min_evaluate_nodes": one("min_evaluate_nodes", min_evaluate_nodes, int, low=0),
        "min_available_nodes": one("min_available_nodes", min_available_nodes, int, low=0),
        "node_wait_timeout": None if node_wait_timeout is None else one("node_wait_timeout", node_wait_timeout,
                                                                         float, low=0.0),
        "seed": one("seed", seed, int, low=0),
        "lr": one("lr", lr, float, low=0.0, low_open=True),
        "lr_decay": one("lr_decay", lr_decay, float, low=0.0, high=1.0, low_open=True),
        "server_lr": one("server_lr", server_lr, float, low=0.0),
        "num_clients": None if num_clients is None else one("num_clients", num_clients, int, low=1),
    }
    if own_step is not None and out["server_lr"] != 0.0:
        raise ConfigError(f"run-config key 'server-lr' = {server_lr} is not used by {owner}: {own_step}; "
                          "leave server-lr = 0")
    return out


def unknown_keywords(cls: type, unknown: Mapping[str, Any]) -> str:
    """The one line for keywords ``cls`` does not take: the closest of those it does take."""
    import inspect

    known = {p for klass in (cls, FairStrategy) for p in inspect.signature(klass.__init__).parameters}
    known -= {"self", "unknown", "common"}
    names = sorted(unknown)
    close = "".join(did_you_mean(u, sorted(known)) for u in names)
    fields = sorted(f.name for f in dataclasses.fields(cls.Params))
    return (f"{cls.__name__}() got unknown argument(s) {names}{close}; its hyperparameters are "
            f"{fields or 'none'}")


def method_params(cls: type[MethodParams], params: MethodParams | None, owner: str, **given: Any) -> MethodParams:
    """A method's ``Params``: ``params`` as given, else built from the keyword hyperparameters
    ``given`` (a bad value is a one-line ConfigError naming the keyword and its run-config key);
    ``params`` beside a keyword set away from its default is a TypeError."""
    if params is None:
        return cls.from_keywords(given, owner=owner)
    if not isinstance(params, cls):
        raise TypeError(f"{owner}(): params must be a {cls.__qualname__}")
    defaults = cls()
    changed = sorted(k for k, v in given.items() if v != getattr(defaults, k))
    if changed:
        raise TypeError(f"{owner}(): give either params= or keyword hyperparameters, not both ({', '.join(changed)})")
    return params


class FairStrategy(Strategy):
    """A Flower ``Strategy`` around one method (see the module docstring).

    A subclass names its method (``method_class``) and its hyperparameters (its ``__init__``
    keywords, which build the method's ``Params``); everything else is here.

    Parameters (keyword only)
    ----------
    fraction_train : float, default 1.0
        Fraction of the connected nodes sampled each round (at least ``min_train_nodes``).
    fraction_evaluate : float, default 1.0
        Fraction of nodes asked to evaluate each round (0 = no federated evaluation).
    min_train_nodes, min_evaluate_nodes, min_available_nodes : int, default 2
        Flower's: the least nodes a round of Flower's own loop (``start``) trains / evaluates with,
        and waits for (Flower's log line ``Waiting for nodes to connect`` every second). The
        app's own runs sample with their own rule (``registry.build`` passes 1).
    node_wait_timeout : float or None, default 3600.0
        Seconds that wait lasts before one ERROR line and :class:`strategies.requests.NodesUnavailable`
        (None: for ever, as Flower).
    seed : int, default 0
        Seeds the node sampling (one generator per round: a resumed run draws the same).
    lr : float, default 0.1
        The clients' learning rate η_l (sent as ``round-lr``; methods divide Δ_i by it).
    lr_decay : float, default 1.0
        η_l of round t is ``lr · lr_decay^(t−1)``.
    server_lr : float, default 0.0
        η_g; 0 = η_l (:func:`strategies.base.server_step_scale`).
    num_clients : int or None
        N, the federation's size (SCAFFOLD's 1/N, AFL's λ); None = the nodes connected.
    loss_before : bool, default False
        Ask every client for ``loss-before`` even when the method does not read it.
    device : str or torch.device, default "auto"
        Where the method's server maths runs (``server-device``: :func:`strategies.base.resolve_device`).
    model : torch.nn.Module or None
        The run's model, for a method that reads its structure (CRAFT's layer groups).
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's, with Flower's meaning and defaults (``"num-examples"``, ``"arrays"``,
        ``"config"``, Flower's weighted average).
    """

    method_class: ClassVar[type[Method]] = Method
    Params: ClassVar[type[MethodParams]] = MethodParams  # the method's (each subclass names it)
    # Aggregate a model holding a float64 array in float64, as Flower's numpy does (the classes named like Flower's)
    float64_models: ClassVar[bool] = False
    # The run-config values the app hands this class as keywords besides the common ones (registry.build)
    app_keywords: ClassVar[tuple[str, ...]] = ()
    client_momentum: float = 0.0  # the clients' SGD momentum, for a method whose maths needs it (FedNova)

    def __init__(self, params: MethodParams | None = None, *, fraction_train: float = 1.0,
                 fraction_evaluate: float = 1.0, min_train_nodes: int = 2, min_evaluate_nodes: int = 2,
                 min_available_nodes: int = 2, node_wait_timeout: float | None = 3600.0, seed: int = 0,
                 lr: float = 0.1, lr_decay: float = 1.0, server_lr: float = 0.0, num_clients: int | None = None,
                 loss_before: bool = False, device: str | torch.device = "auto", model: torch.nn.Module | None = None,
                 weighted_by_key: str = keys.NUM_EXAMPLES, arrayrecord_key: str = keys.ARRAYS,
                 configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 **unknown: Any) -> None:
        owner = type(self).__name__
        if unknown:  # a misspelt keyword: one line naming the closest ones (Python's own would name none)
            raise TypeError(unknown_keywords(type(self), unknown))
        common = check_common(owner, fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                              min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                              min_available_nodes=min_available_nodes, node_wait_timeout=node_wait_timeout, seed=seed,
                              lr=lr, lr_decay=lr_decay, server_lr=server_lr, num_clients=num_clients,
                              own_step=self.method_class.own_step)
        for name, value in common.items():
            setattr(self, name, value)
        self.min_evaluate_nodes = 0 if self.fraction_evaluate == 0.0 else self.min_evaluate_nodes
        self.loss_before = bool(loss_before)
        self.device = resolve_device(device)
        self.model = model
        for name, value in (("weighted_by_key", weighted_by_key), ("arrayrecord_key", arrayrecord_key),
                            ("configrecord_key", configrecord_key)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{owner}() keyword '{name}' must be a non-empty string, got {value!r}")
            setattr(self, name, value)
        self.train_metrics_aggr_fn = train_metrics_aggr_fn or aggregate_metricrecords
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn or aggregate_metricrecords
        self.method = self.build(params, self.setting())
        self.state = self.method.init()
        self.context = RunContext()  # Flower's own loop's (start()); the app passes its own to the calls
        # The round in progress, configure_* → aggregate_*: θ_t, its layout, who was asked
        self.current_arrays: ArrayRecord | None = None
        self.spec: flat.FlatSpec | None = None
        self.expected: dict[int, int | None] = {}
        self.expected_eval: dict[int, int | None] = {}
        self.sent_train: tuple[int, list[Message]] | None = None  # (round, its requests): whose answers replies are
        self.sent_eval: tuple[int, list[Message]] | None = None
        self.asked_config: dict[str, Any] = {}  # the train requests' config values (the steps a foreign app asked)
        self.num_nodes: int | None = None  # nodes connected when the round was sampled
        self.drop_streak = DropStreak()  # rounds in a row whose every reply was dropped for one reason

    def build(self, params: MethodParams | None, setting: Setting) -> Method:
        """The method, built from its ``Params`` and the run's :class:`~strategies.base.Setting` (a
        class whose method takes more, FedAvg's weighting, passes it here)."""
        return self.method_class(params, setting)

    def setting(self) -> Setting:
        """What the method may know of the run (:class:`~strategies.base.Setting`)."""
        per_round = None
        if self.num_clients is not None:
            per_round = min(self.num_clients,
                            max(self.min_train_nodes, int(round(self.fraction_train * self.num_clients))))
        return Setting(num_clients=self.num_clients, clients_per_round=per_round, device=self.device, model=self.model,
                       momentum=self.client_momentum)

    # -- the method and its state ------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.method.name or type(self).__name__

    @property
    def params(self) -> MethodParams:
        return self.method.params

    def set_params(self, **changes: Any) -> None:
        """Hyperparameters changed after construction (Flower's attributes of the classes named like
        Flower's): the method rebuilt with them (a bad value: ConfigError, nothing changed); the state stays."""
        self.method = self.build(dataclasses.replace(self.method.params, **changes), self.setting())

    def use(self, method: Method) -> None:
        """Run ``method`` from now on (the app wraps the defences around the built one), from its round-0 state."""
        self.method = method
        self.state = method.init()

    @property
    def state(self) -> Any:
        """The method's state: what the last round returned (the app checkpoints it whole).
        Assigning the :class:`fedcore.state.Fields` a checkpoint holds rebuilds it."""
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        self._state = restore_state(self.method, value)

    def restored(self) -> None:
        """After the app assigned :attr:`state` from a checkpoint."""
        self._state = self.method.restored(self._state)

    def node_changed(self, client: int) -> None:
        """Client ``client`` is now served by another node (its node-side state is gone)."""
        self._state = self.method.node_changed(self._state, client)

    def evaluation_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model evaluation scores (AFL: its averaged iterate)."""
        return self.method.evaluation_model(self._state, arrays)

    # -- the round's numbers -------------------------------------------------------------------------
    def round_lr(self, server_round: int) -> float:
        """η_l of a round."""
        return self.lr * self.lr_decay ** (server_round - 1)

    def step_scale(self, server_round: int) -> float:
        """η_g/η_l for this round."""
        return server_step_scale(self.server_lr, self.round_lr(server_round))

    @property
    def want_loss_before(self) -> bool:
        return self.loss_before or keys.LOSS_BEFORE in self.method.reads.metrics

    def set_model(self, arrays: ArrayRecord) -> None:
        """θ_t: what the round's replies are compared with (its spec fixed by the first model)."""
        self.current_arrays = arrays
        if self.spec is None:
            self.spec = flat.spec_of(arrays)

    @property
    def compute_dtype(self) -> torch.dtype:
        """float32, or float64 for a model holding a float64 array in a class that aggregates such a
        model as Flower's numpy does (:attr:`float64_models`)."""
        if self.float64_models and self.spec is not None and "float64" in self.spec.dtypes:
            return torch.float64
        return torch.float32

    def current_flat(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """θ_t as one flat vector."""
        if self.current_arrays is None:
            raise RuntimeError("configure_train() must run before aggregate_train(): it hands over θ_t")
        return flat.record_to_flat(self.current_arrays, dtype=dtype or self.compute_dtype)

    # -- Flower's Strategy, and the app's entry points -----------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                        context: RunContext | None = None) -> list[Message]:
        """The round's train requests to the context's selection, or to a seeded draw of the
        connected nodes (:func:`strategies.requests.sample_nodes`)."""
        context = context or self.context
        self.set_model(arrays)
        if context.select is not None:
            targets = context.select(server_round, grid)
            # N of a run that does not say (SCAFFOLD's 1/N, AFL's λ): the nodes connected now
            self.num_nodes = None if self.num_clients is not None else len(list(grid.get_node_ids()))
        else:
            targets = requests.sample_nodes(grid, self.fraction_train, max(1, self.min_train_nodes), self.seed,
                                            "flower-sample", server_round, min_available=self.min_available_nodes,
                                            timeout=self.node_wait_timeout, what="configure_train")
            self.num_nodes = targets.connected
        self.expected = dict(targets)
        msgs = requests.train_requests(self, server_round, arrays, config, targets, context)
        self.asked_config = dict(config or {})
        self.sent_train = (server_round, msgs)  # their ids, once a grid pushed them: requests_sent
        return msgs

    def rules(self, context: RunContext) -> Rules:
        """How the gate reads and bounds this strategy's replies (:class:`strategies.gate.Rules`)."""
        required = (keys.LOSS_BEFORE,) if self.want_loss_before else ()
        if context.run_config is not None:  # the app's own runs record every round's train loss
            required += (keys.TRAIN_LOSS,)
        return Rules(reads=self.method.reads, required=required, weight_key=self.weighted_by_key,
                     record_key=self.arrayrecord_key, fallbacks=self.metric_fallbacks(), limits=context.limits,
                     trust=context.trust, run_config=context.run_config, warned=context.warned)

    def metric_fallbacks(self) -> dict[str, tuple[str, str]]:
        """metric → (Flower's name read when a reply lacks it, why): none but QFedAvg's."""
        return {}

    def asked(self, server_round: int, kind: str = "train") -> Asked:
        """What this round's requests asked (:class:`strategies.gate.Asked`)."""
        if kind == "train":
            group, sent = requests_sent(self.sent_train, server_round, str(server_round))
            return Asked(server_round, dict(self.expected), group, sent, self.asked_config, self.num_nodes)
        group, sent = requests_sent(self.sent_eval, server_round, f"eval-{server_round}")
        return Asked(server_round, dict(self.expected_eval), group, sent)

    def read_round(self, server_round: int, replies: list, context: RunContext) -> Round:
        """Kept replies as the method's :class:`~strategies.base.Round`."""
        if self.current_arrays is None or self.spec is None:
            raise RuntimeError("configure_train() must run before aggregate_train(): it hands over θ_t")
        return gate.read_round(replies, self.asked(server_round), self.rules(context), self.current_arrays, self.spec,
                               dtype=self.compute_dtype, lr=self.round_lr(server_round),
                               step_scale=self.step_scale(server_round))

    def train_outcome(self, server_round: int, replies: Iterable[Message],
                      context: RunContext | None = None) -> RoundOutcome:
        """The whole round: the replies through the gate, then :meth:`aggregate_checked`. Nothing a
        reply holds raises; the method's exception is returned in ``error``."""
        context = context or self.context
        try:
            if self.current_arrays is None or self.spec is None:
                raise RuntimeError("configure_train() must run before aggregate_train(): it hands over θ_t")
            valid, dropped, defence = gate.check_train(replies, self.asked(server_round), self.rules(context),
                                                       self.current_arrays, self.spec)
            if valid:
                refused = self.method.check(self.read_round(server_round, valid, context), self._state)
                late = [Dropped(gate.client_of(valid[i]), int(valid[i].metadata.src_node_id), why)
                        for i, why in sorted(refused.items())]
                gate.log_dropped(server_round, late)
                valid, dropped = [r for i, r in enumerate(valid) if i not in refused], [*dropped, *late]
        except Exception as exc:  # noqa: BLE001 - the app records it (on-aggregation-error)
            return RoundOutcome(error=exc)
        return self.aggregate_checked(server_round, RoundOutcome(valid, dropped, defence), context)

    def aggregate_checked(self, server_round: int, outcome: RoundOutcome,
                          context: RunContext | None = None) -> RoundOutcome:
        """``outcome`` with the method's step on its valid replies (those the gate, or secure
        aggregation, kept) folded in; unchanged when none is valid (the model stays)."""
        context = context or self.context
        streak = context.streak if context.streak is not None else self.drop_streak
        stalled = streak.observe(self.name, server_round, len(outcome.valid), [d.reason for d in outcome.dropped])
        if stalled is not None:
            return dataclasses.replace(outcome, error=stalled)
        if not outcome.valid:
            log.warning("round %d: no valid reply; the model stays as it was", server_round)
            return outcome
        try:
            round_ = self.read_round(server_round, outcome.valid, context)
            step = self.method.aggregate(round_, self._state)
            arrays = self.model_record(step, round_)
            metrics = gate.finite_metrics(MetricRecord(step.metrics), f"{self.name} round {server_round}")
        except Exception as exc:  # noqa: BLE001 - the app records it (on-aggregation-error)
            return dataclasses.replace(outcome, error=exc)
        self._state = step.state
        late = [(outcome.valid[i], why) for i, why in sorted(step.dropped.items())]
        gone = {id(r) for r, _ in late}
        dropped = [Dropped(gate.client_of(r), int(r.metadata.src_node_id), why) for r, why in late]
        gate.log_dropped(server_round, dropped)
        valid = [r for r in outcome.valid if id(r) not in gone]
        chosen = None if step.selected is None else [outcome.valid[i] for i in step.selected]
        return dataclasses.replace(outcome, valid=valid, dropped=[*outcome.dropped, *dropped],
                                   defence={**outcome.defence, **step.defence}, arrays=arrays, metrics=metrics,
                                   metric_replies=chosen)

    def model_record(self, step: Step, round_: Round) -> ArrayRecord | None:
        """θ_{t+1} as an ArrayRecord in the model's names, shapes and dtypes."""
        if step.model is None:
            return None
        if isinstance(step.model, torch.Tensor):
            return round_.to_record(step.model)
        spec = round_.spec
        return ArrayRecord({k: Array(np.asarray(step.model[k], dtype=dt).reshape(s))
                            for k, s, dt in zip(spec.keys, spec.shapes, spec.dtypes)})

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's: :meth:`train_outcome`'s model, and its metrics beside the clients' own metrics
        aggregated as Flower does (``train_metrics_aggr_fn``) over the replies the method used;
        (None, metrics) when no reply was valid. The method's exception (or a run in which nothing
        trains: :class:`strategies.health.NoTrainingError`) is raised, as Flower's strategies raise theirs."""
        outcome = self.train_outcome(server_round, replies)
        if outcome.error is not None:
            raise outcome.error
        if outcome.arrays is None:  # no model (no valid reply, or a robust rule's skip): the method's metrics alone
            return None, outcome.metrics
        used = outcome.metric_replies if outcome.metric_replies is not None else outcome.client_replies
        client = gate.client_metrics(used, self.train_metrics_aggr_fn, self.weighted_by_key, "aggregate_train")
        return self.flower_arrays(outcome.arrays), merged(client, outcome.metrics)

    def flower_arrays(self, arrays: ArrayRecord | None) -> ArrayRecord | None:
        """The model ``aggregate_train`` returns to Flower's loop (the classes named like Flower's:
        in Flower's dtypes)."""
        return arrays

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                           context: RunContext | None = None) -> list[Message]:
        """Evaluate requests to every client the context selects, else to a seeded draw (none with
        ``fraction_evaluate`` 0); the model is :meth:`evaluation_arrays`'."""
        context = context or self.context
        if context.select is not None:
            targets = context.select(-server_round, grid)  # the app's selector: every client
        elif self.fraction_evaluate == 0.0:
            return []
        else:
            targets = requests.sample_nodes(grid, self.fraction_evaluate, self.min_evaluate_nodes, self.seed,
                                            "flower-evaluate", server_round, min_available=self.min_available_nodes,
                                            timeout=self.node_wait_timeout, what="configure_evaluate")
        self.expected_eval = dict(targets)
        msgs = requests.evaluate_requests(self, server_round, self.evaluation_arrays(arrays), config, targets, context)
        self.sent_eval = (server_round, msgs)
        return msgs

    def evaluate_outcome(self, server_round: int, replies: Iterable[Message],
                         context: RunContext | None = None) -> EvaluationOutcome:
        """Every evaluation reply scored, or unscored with its reason (:func:`strategies.gate.check_evaluate`)."""
        context = context or self.context
        try:
            return gate.check_evaluate(replies, self.asked(server_round, "evaluate"), self.rules(context))
        except Exception as exc:  # noqa: BLE001 - an evaluation's replies cannot fail the run
            log.warning("round %d: the evaluation replies could not be read (%s: %s)", server_round,
                        type(exc).__name__, exc)
            return EvaluationOutcome()

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower's: the clients' own metrics aggregated as Flower does (``evaluate_metrics_aggr_fn``,
        by default weighted by ``weighted_by_key``: custom metrics such as ``f1`` kept) over the
        replies the gate scored, with the test-size-weighted mean of the scores beside them
        (``accuracy``, ``loss``, ``num-scored``)."""
        outcome = self.evaluate_outcome(server_round, replies)
        client = gate.client_metrics(outcome.kept, self.evaluate_metrics_aggr_fn, self.weighted_by_key,
                                     "aggregate_evaluate")
        return merged(client, outcome.metrics)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any):
        """Flower's :meth:`Strategy.start`; ``result.arrays`` is the final model even when no round
        produced one (Flower leaves it empty then): the model stayed the initial one."""
        result = super().start(grid, initial_arrays, *args, **kwargs)
        if not len(result.arrays):
            result.arrays = initial_arrays
        return result

    def summary(self) -> None:
        log.info("%s: %s (fraction_train=%s, seed=%s, lr=%s, server_lr=%s)", type(self).__name__, self.params,
                 self.fraction_train, self.seed, self.lr, self.server_lr)


def requests_sent(sent: tuple[int, list[Message]] | None, server_round: int, group: str
                  ) -> tuple[str | None, dict[int, str] | None]:
    """(the round's group id, node → the id of the request sent to it) when ``sent`` (what
    ``configure_*`` kept: (round, requests)) is this round's; else (None, None): the requests are
    unknown (a caller that set ``expected`` by hand) and the replies' round is not checked. A
    request's id is known once a grid pushed it (empty before)."""
    if sent is None or sent[0] != server_round:
        return None, None
    return group, {int(m.metadata.dst_node_id): m.metadata.message_id for m in sent[1] if m.metadata.message_id}


def merged(client: MetricRecord | None, own: MetricRecord | None) -> MetricRecord | None:
    """The clients' aggregated metrics with the method's own beside them (the method's win a clash)."""
    if client is None:
        return own
    return MetricRecord({**dict(client), **dict(own or {})})


def flower_arguments(fraction_train: float, fraction_evaluate: float, min_train_nodes: int, min_evaluate_nodes: int,
                     min_available_nodes: int, weighted_by_key: str, arrayrecord_key: str, configrecord_key: str,
                     train_metrics_aggr_fn: Callable | None, evaluate_metrics_aggr_fn: Callable | None
                     ) -> dict[str, Any]:
    """Flower's ten arguments common to its strategies, as :class:`FairStrategy`'s keywords (the
    classes named like Flower's take them in Flower's order)."""
    return {"fraction_train": fraction_train, "fraction_evaluate": fraction_evaluate,
            "min_train_nodes": min_train_nodes, "min_evaluate_nodes": min_evaluate_nodes,
            "min_available_nodes": min_available_nodes, "weighted_by_key": weighted_by_key,
            "arrayrecord_key": arrayrecord_key, "configrecord_key": configrecord_key,
            "train_metrics_aggr_fn": train_metrics_aggr_fn, "evaluate_metrics_aggr_fn": evaluate_metrics_aggr_fn}


def given_once(owner: str, flower_name: str, flower_value: Any, own_name: str, own_value: Any, default: Any) -> Any:
    """A value a class named like Flower's takes under Flower's keyword and under its own (both None
    by default): the one given, else ``default``; both given is a one-line TypeError."""
    if flower_value is not None and own_value is not None:
        raise TypeError(f"{owner}() got both '{flower_name}' (Flower's name) and '{own_name}' (its own) for the same "
                        "value: give one of them")
    return flower_value if flower_value is not None else own_value if own_value is not None else default


def given_lr(common: dict[str, Any], lr: float | None) -> None:
    """The clients' ``lr`` given under a Flower name (``eta_l``, ``client_learning_rate``) handed on
    as the common keyword; nothing when none was given (FairStrategy's default then)."""
    if lr is not None:
        common["lr"] = lr


def params_property(field: str, doc: str) -> property:
    """A hyperparameter as an attribute (under Flower's name or the field's): reading gives the
    value in use; setting it rebuilds the method with it (:meth:`FairStrategy.set_params`: a bad
    value is a one-line ConfigError and changes nothing)."""
    return property(lambda self: getattr(self.params, field),
                    lambda self, value: self.set_params(**{field: value}), doc=doc)


def flower_dtypes(arrays: ArrayRecord | None, dtypes: Mapping[str, str]) -> ArrayRecord | None:
    """``arrays`` with the arrays named in ``dtypes`` cast to those dtypes (Flower's FedAdam and
    QFedAvg return a float32 model's arrays as float64)."""
    if arrays is None or not dtypes:
        return arrays
    return ArrayRecord({k: Array(a.numpy().astype(dtypes[k])) if k in dtypes else a for k, a in arrays.items()})
