"""The contract every method follows, and the Flower ``Strategy`` they all are.

A method module holds, in this order:

* ``Params`` — a frozen dataclass of its hyperparameters (:mod:`fedcore.params`), declared
  once: keyword construction, the run config and pyproject.toml all read it;
* ``State`` — a dataclass of what survives a round (checkpointed as it is, by
  :mod:`fedcore.state`; no per-method save/load code), and ``init_state``;
* pure functions on flat torch tensors, importable without Flower, that do the maths;
* a thin :class:`FairStrategy` subclass whose :meth:`~FairStrategy.aggregate_valid` reads the
  updates (``batch = self.read_updates(replies)``, :mod:`strategies.updates`), calls them and
  returns an :class:`~strategies.rounds.Aggregated` (new arrays, metrics, late drops).

A :class:`FairStrategy` is a complete ``flwr.serverapp.strategy.Strategy``::

    strategy = FedPCD(fraction_train=0.25, tau=0.02, history=10, seed=0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=3)

The strategy samples nothing and stashes nothing itself: the requests are built by
:mod:`strategies.requests` (the nodes from the app's sampler, or for Flower's own loop a draw
seeded by (seed, round)), a round's replies are validated by :func:`strategies.rounds.check_round`
(malformed, out-of-bounds and missing replies dropped with a reason, never a crash), and the
outcome is returned: :meth:`FairStrategy.train_outcome` gives the whole
:class:`~strategies.rounds.RoundOutcome` (valid, dropped, defence reports, arrays, metrics),
Flower's ``aggregate_train`` its arrays and metrics; :meth:`FairStrategy.evaluate_outcome` and
``aggregate_evaluate`` likewise for evaluation. What the app must give (its sampler, the run
config sent with every request, the bounds on the clients' numbers) is a
:class:`~strategies.requests.RunContext` passed to the calls; between ``configure_train`` and
``aggregate_train`` the strategy keeps only the round's protocol state (θ_t, who was asked).

Defences wrap a strategy instead of being flags, as Flower's
``DifferentialPrivacyServerSideFixedClipping(strategy, ...)`` does:
``UpdateClip(CentralDP(FedAvg(...), dp), c)`` (:mod:`strategies.wrappers`,
:mod:`strategies.privacy`); a wrapper is itself a strategy, transforms the valid replies
before the inner :meth:`aggregate_valid` and returns its report in ``Aggregated.defence``.

The class flags and hooks, each with the methods that use it: CONTRIBUTING.md, "Adding a method".
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedcore import flat, keys
from fedcore.config import ConfigError
from fedcore.params import MethodParams, NoParams
from fedcore.state import Fields, rebuild
from strategies import flower_compat, requests, rounds
from strategies.flower_compat import FlowerKeywords
from strategies.health import DropStreak
from strategies.requests import RunContext
from strategies.rounds import Aggregated, EvaluationOutcome, RoundOutcome
from strategies.signatures import describe_hyperparameters, strategy_signature
from strategies.updates import ReplyBatch, read_updates

log = logging.getLogger("fedpcd")


def server_step_scale(server_lr: float, client_lr: float) -> float:
    """η_g/η_l: the one meaning of ``server-lr``. A method's direction is in the clients'
    update space (Σ p_i Δ_i for FedAvg) and the step is θ_t − (η_g/η_l)·direction;
    ``server-lr`` = 0 means η_g = η_l, i.e. the plain aggregate of the local models."""
    return (server_lr or client_lr) / client_lr


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``server-device`` → a torch device: ``auto`` (or None) is the first CUDA device when
    torch sees one, else the CPU; ``cuda`` without a visible GPU is a one-line ConfigError.
    A CUDA device gets its index ("cuda" → "cuda:0"), as tensors report theirs."""
    name = str(device or "auto")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"run-config key 'server-device' = {name!r} is not one of auto, cpu, cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run-config key 'server-device' = {name!r} but torch sees no CUDA device here: "
                          "use server-device='auto' (the GPU when there is one) or 'cpu'")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def method_params(cls: type[FairStrategy], params: MethodParams | None, hyper: dict[str, Any]) -> MethodParams:
    """The method's ``Params``: ``params`` as given, or built from the keyword hyperparameters."""
    name = cls.__name__
    if params is None:
        params = cls.Params.from_keywords(hyper, owner=name, known=cls.__signature__.parameters)
    elif hyper:
        raise TypeError(f"{name}(): give either params= or keyword hyperparameters")
    if not isinstance(params, cls.Params):
        raise TypeError(f"{name}(): params must be a {cls.Params.__qualname__}")
    return params


def check_common(cls: type[FairStrategy], fraction_train: float, fraction_evaluate: float, lr: float,
                 server_lr: float) -> None:
    """One-line errors for the common arguments out of range (``server_lr`` with a method that steps its own way)."""
    if not 0.0 < fraction_train <= 1.0:
        raise ConfigError(f"fraction_train = {fraction_train} must be in (0, 1]")
    if not 0.0 <= fraction_evaluate <= 1.0:
        raise ConfigError(f"fraction_evaluate = {fraction_evaluate} must be in [0, 1]")
    if lr <= 0.0 or server_lr < 0.0:
        raise ConfigError(f"lr = {lr} must be > 0 and server_lr = {server_lr} >= 0")
    if cls.own_step is not None and server_lr != 0.0:
        raise ConfigError(f"run-config key 'server-lr' = {server_lr} is not used by {cls.name or cls.__name__}: "
                          f"{cls.own_step}; leave server-lr = 0")


def _handed_over(strategy: FairStrategy) -> ArrayRecord:
    """θ_t, which ``configure_train`` hands over to the round's aggregation."""
    if strategy.current_arrays is None:
        raise RuntimeError("configure_train() must run before aggregate_train(): it hands over θ_t")
    return strategy.current_arrays


class FairStrategy(Strategy, metaclass=FlowerKeywords):
    """Base of every strategy here (see the module docstring).

    Parameters (keyword only; ``**hyper`` are the method's ``Params`` fields)
    ----------
    fraction_train : float, default 1.0
        Fraction of the connected nodes sampled each round (at least ``min_train_nodes``).
    fraction_evaluate : float, default 1.0
        Fraction of nodes asked to evaluate each round (0 = no federated evaluation).
    min_train_nodes : int, default 2
        Flower's: at least this many nodes train each round of Flower's own loop
        (``strategy.start``); the app's own runs sample with their own rule (``registry.build``
        passes 1: ``clients-per-round``).
    min_evaluate_nodes : int, default 2
        Flower's: at least this many nodes evaluate (0 when ``fraction_evaluate`` is 0).
    min_available_nodes : int, default 2
        Flower's: Flower's own loop waits until this many nodes are connected before it samples
        (Flower's log line ``Waiting for nodes to connect: ...`` every second).
    node_wait_timeout : float or None, default 3600.0
        Seconds that wait lasts before the strategy gives up with one ERROR line and raises
        :class:`strategies.requests.NodesUnavailable` (no round is recorded); None waits for
        ever, as Flower's own strategies do. 3600 s is Flower's ``start(timeout=...)`` default
        for the replies.
    seed : int, default 0
        Seeds the node sampling (one generator per round: a resumed run draws the same).
    lr : float, default 0.1
        The clients' learning rate η_l (sent as ``round-lr``; methods divide Δ_i by it).
    lr_decay : float, default 1.0
        η_l of round t is ``lr · lr_decay^(t−1)``.
    server_lr : float, default 0.0
        η_g; 0 = η_l (see :func:`server_step_scale`).
    num_clients : int or None
        N, the federation's size (SCAFFOLD's 1/N); None = the number of connected nodes.
    loss_before : bool, default False
        Ask every client for ``loss-before`` even when the method does not use it.
    device : str or torch.device, default "auto"
        Where the method's server maths runs (``server-device``; :func:`resolve_device`).
        Methods that keep large tensors (FedPCD's cache, CRAFT's update matrix) put them
        there; the others ignore it.
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        Flower's, with Flower's meaning and defaults (``"num-examples"``, ``"arrays"``,
        ``"config"``, Flower's weighted average): the record names of the requests, the metric
        the FedAvg family weights by, and how ``aggregate_train`` / ``aggregate_evaluate``
        aggregate the clients' own metrics (returned beside the method's: :mod:`strategies.flower_compat`).
    params : the method's ``Params``, instead of ``**hyper``.

    A class sharing a name with one of Flower's (FedAvg, FedProx, FedAvgM, FedAdam, ...) also takes
    Flower's names of its hyperparameters (``flower_names``: ``server_momentum`` for ``momentum``,
    ...) and has them as attributes: setting one after construction takes effect (it replaces the
    frozen ``params``, checked as at construction).
    """

    # The class flags (CONTRIBUTING.md lists the methods that set each).
    name: ClassVar[str] = ""  # set by @register
    Params: ClassVar[type[MethodParams]] = NoParams
    State: ClassVar[type | None] = None  # a dataclass built with no arguments at round 0, if any
    client_method: ClassVar[str] = keys.SGD  # the client routine the requests name
    personalized: ClassVar[bool] = False  # clients are scored with their personal models
    needs_individual_updates: ClassVar[bool] = True  # False: sums suffice (secure aggregation)
    secagg_weighting: ClassVar[str] = "num-examples"  # or "uniform": weights of a secure sum
    required_metrics: ClassVar[tuple[str, ...]] = ()  # reply metrics beyond the required ones
    required_records: ClassVar[tuple[str, ...]] = ()  # reply ArrayRecords, model-shaped
    loss_metrics: ClassVar[tuple[str, ...]] = ()  # reply losses the method weights by: bounded (rounds.number_problems)
    reads_num_steps: ClassVar[bool] = False  # num-steps is read: a whole number in [1, the steps asked]
    own_step: ClassVar[str | None] = None  # how the method steps when it does not use server-lr
    evaluated_iterate: ClassVar[str] = "last"  # what evaluation_arrays gives: "last" θ_t or "averaged" (AFL)
    app_arguments: ClassVar[tuple[str, ...]] = ()  # derived: the subclass's own __init__ keywords
    # Flower's like-named class, and its keyword names → this class's own (strategies.flower_compat)
    flower_counterpart: ClassVar[type | None] = None
    flower_names: ClassVar[dict[str, str]] = {}
    weights_replies: ClassVar[bool] = False  # weights its replies by Flower's weighted_by_key (the FedAvg family)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every method's class gets an explicit keyword-only signature (its ``Params`` fields,
        its own ``__init__`` arguments and the common ones), which ``inspect.signature``, help()
        and IDEs that introspect read instead of ``(**kwargs)``; and its docstring lists the
        hyperparameters with their run-config keys."""
        super().__init_subclass__(**kwargs)
        cls.__signature__ = strategy_signature(cls, FairStrategy)
        # The app-side arguments (CRAFT's model, FedNova's momentum) are the keywords a
        # subclass's own __init__ adds: read from the code, not declared a second time.
        common = set(inspect.signature(FairStrategy.__init__).parameters)
        cls.app_arguments = tuple(p for p in cls.__signature__.parameters
                                  if p not in common and not any(p == f.name for f in dataclasses.fields(cls.Params)))
        cls.__doc__ = f"{(cls.__doc__ or '').rstrip()}\n\n{describe_hyperparameters(cls.Params)}"
        if "flower_names" in cls.__dict__ or "flower_counterpart" in cls.__dict__:
            flower_compat.install_attributes(cls)

    def __init__(self, *, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, node_wait_timeout: float | None = 3600.0,
                 seed: int = 0, lr: float = 0.1, lr_decay: float = 1.0, server_lr: float = 0.0,
                 num_clients: int | None = None, loss_before: bool = False, device: str | torch.device = "auto",
                 weighted_by_key: str = keys.NUM_EXAMPLES, arrayrecord_key: str = keys.ARRAYS,
                 configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 params: MethodParams | None = None, **hyper: Any) -> None:
        self.params = method_params(type(self), params, hyper)
        check_common(type(self), fraction_train, fraction_evaluate, lr, server_lr)
        self.fraction_train, self.fraction_evaluate = fraction_train, fraction_evaluate
        self.min_train_nodes, self.seed = min_train_nodes, seed
        # Flower's (flwr.serverapp.strategy.FedAvg): the same names, meanings and defaults
        self.min_evaluate_nodes = 0 if fraction_evaluate == 0.0 else min_evaluate_nodes
        self.min_available_nodes, self.node_wait_timeout = min_available_nodes, node_wait_timeout
        self.weighted_by_key, self.arrayrecord_key, self.configrecord_key = weighted_by_key, arrayrecord_key, \
            configrecord_key
        self.train_metrics_aggr_fn = train_metrics_aggr_fn or aggregate_metricrecords
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn or aggregate_metricrecords
        self.lr, self.lr_decay, self.server_lr = lr, lr_decay, server_lr
        self.num_clients, self.loss_before = num_clients, loss_before
        self.device = resolve_device(device)
        self.state = self.init_state()
        self.context = RunContext()  # Flower's own loop's (start()); the app passes its own to the calls
        # The round in progress, configure_* → aggregate_*: θ_t, its layout, node → partition id asked
        self.current_arrays: ArrayRecord | None = None
        self.spec: flat.FlatSpec | None = None
        self.expected: dict[int, int | None] = {}
        self.expected_eval: dict[int, int | None] = {}
        # rounds in a row whose every reply was dropped for one reason (strategies.health)
        self.drop_streak = DropStreak()
        self.sent_train = self.sent_eval = None  # (round, its requests): whose answers the replies must be

    # -- the method's part ------------------------------------------------------------------
    @property
    def state(self) -> Any:
        """The method's State (what survives a round; the app checkpoints it). Assigning the
        :class:`fedcore.state.Fields` a checkpoint holds rebuilds it (:meth:`restore_state`)."""
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        self._state = self.restore_state(value) if isinstance(value, Fields) else value

    def restore_state(self, fields: Fields) -> Any:
        """The State rebuilt from a checkpoint's fields, as the class this strategy keeps (state.rebuild)."""
        current = self.__dict__.get("_state")
        target = type(current) if current is not None else self.State
        if target is None:
            raise ValueError(f"{self.name or type(self).__name__} keeps no state, but the checkpoint holds "
                             f"fields {sorted(fields)}: it was written by another method")
        return rebuild(target, fields)

    def init_state(self) -> Any:
        """``State()`` at round 0 (None: nothing kept); a method whose round-0 state needs its params overrides it."""
        return None if self.State is None else self.State()

    def aggregate_valid(self, server_round: int, replies: list[Message]) -> Aggregated:
        """The method's own step on the valid replies (sorted by client): read them with
        :meth:`read_updates`, return the new model and metrics (:class:`Aggregated`)."""
        raise NotImplementedError

    def client_config(self) -> dict[str, Any]:
        """Values every request carries for the client routine (FedProx's μ, ...)."""
        return {}

    def round_config(self, server_round: int) -> dict[str, Any]:
        """Per-round values besides the model (FedeRage's β̂)."""
        return {}

    def round_records(self, server_round: int) -> dict[str, ArrayRecord]:
        """ArrayRecords every request of the round carries (SCAFFOLD's c)."""
        return {}

    def client_records(self, client: int | None) -> dict[str, ArrayRecord]:
        """ArrayRecords for one client only (SCAFFOLD's c_i after a resume)."""
        return {}

    def evaluation_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model that evaluation scores (AFL: the running average of iterates)."""
        return arrays

    def check_reply(self, metrics: dict) -> str | None:
        """Why a train reply's metrics are unusable for this method (None: usable); such a
        reply is dropped with this reason before :meth:`aggregate_valid` (FedeRage: β in its box)."""
        return None

    def check_valid(self, server_round: int, replies: list[Message]) -> dict[int, str]:
        """{index: reason} of the well-formed replies whose method records are out of bounds
        (SCAFFOLD's Δc_i against its own update); they are dropped with the reason. Default: none."""
        return {}

    def on_restored(self) -> None:
        """After the app assigned :attr:`state` from a checkpoint (SCAFFOLD: each mirrored c_i is owed)."""

    def on_node_changed(self, client: int) -> None:
        """Client ``client`` is now served by another node (a restarted SuperNode rejoins under a new
        node id): what it kept in its node's ``context.state`` is gone (SCAFFOLD re-sends its c_i)."""

    def params_changed(self) -> None:
        """After one of Flower's attributes (or a Params field) was set on the built strategy
        (:class:`strategies.flower_compat.ParamAttribute`): rebuild what was built from ``params``
        (the wrapped Flower strategy of the server optimisers and robust rules). Default: nothing."""

    def set_common(self, name: str, value: Any) -> None:
        """A common argument set through one of Flower's names (``eta_l``, ``client_learning_rate``:
        ``lr``), checked as the constructor checks it."""
        if name == "lr":
            check_common(type(self), self.fraction_train, self.fraction_evaluate, value, self.server_lr)
        setattr(self, name, value)

    # -- shared helpers ---------------------------------------------------------------------
    def round_lr(self, server_round: int) -> float:
        """η_l of a round."""
        return self.lr * self.lr_decay ** (server_round - 1)

    def step_scale(self, server_round: int) -> float:
        """η_g/η_l for this round (:func:`server_step_scale`)."""
        return server_step_scale(self.server_lr, self.round_lr(server_round))

    @property
    def weight_metrics(self) -> tuple[str, ...]:
        """Flower's ``weighted_by_key`` when the method weights its replies by it and it is not
        ``num-examples`` (required of every reply then, beside ``num-examples``)."""
        return (self.weighted_by_key,) if self.weights_replies and self.weighted_by_key != keys.NUM_EXAMPLES else ()

    def reply_weights(self, batch: ReplyBatch) -> torch.Tensor:
        """(m,) float64 weights of the replies: ``num-examples``, or Flower's ``weighted_by_key``."""
        if self.weighted_by_key == keys.NUM_EXAMPLES:
            return batch.num_examples
        return torch.tensor([float(m[self.weighted_by_key]) for m in batch.metrics], dtype=torch.float64)

    @property
    def want_loss_before(self) -> bool:
        return self.loss_before or keys.LOSS_BEFORE in self.required_metrics

    def set_model(self, arrays: ArrayRecord) -> None:
        """θ_t: what the round's replies are compared with."""
        self.current_arrays = arrays
        if self.spec is None:
            self.spec = flat.spec_of(arrays)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the server's arithmetic: float32, and for the classes that share a name with
        one of Flower's float64 when the model holds a float64 array (a float64 model aggregated in
        float64, as Flower's numpy does)."""
        if self.flower_counterpart is not None and self.spec is not None and "float64" in self.spec.dtypes:
            return torch.float64
        return torch.float32

    def current_flat(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """θ_t as one flat vector (in :attr:`compute_dtype` unless ``dtype`` is given)."""
        return flat.record_to_flat(_handed_over(self), dtype=dtype or self.compute_dtype)

    def read_updates(self, replies: list[Message], **into: Any) -> ReplyBatch:
        """The one way to read a round's updates (:func:`strategies.updates.read_updates` against
        θ_t): ``batch.deltas`` Δ_i, ``batch.models`` θ_i, ``batch.weighted_models(w)``, the losses;
        ``out=``/``writer=`` for a kernel that writes Δ_i into rows it keeps. Read in
        :attr:`compute_dtype` (float32 rows of a kernel's own stay float32)."""
        if "writer" not in into and "out" not in into:
            into.setdefault("dtype", self.compute_dtype)
        into.setdefault("spec", self.spec)
        return read_updates(replies, _handed_over(self), **into)

    def to_record(self, flat_vec: torch.Tensor) -> ArrayRecord:
        assert self.spec is not None
        return flat.record_from_flat(flat_vec, self.spec)  # flat.flat_to_record's record, the spec's layout kept

    # -- Flower's Strategy, and the app's entry points ------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                        context: RunContext | None = None) -> list[Message]:
        """The round's train requests (:func:`strategies.requests.train_requests`) to the
        context's selection, or to a seeded draw of the connected nodes."""
        context = context or self.context
        self.set_model(arrays)
        targets = (context.select(server_round, grid) if context.select is not None else requests.sample_nodes(
            grid, self.fraction_train, max(1, self.min_train_nodes), self.seed, "flower-sample", server_round,
            min_available=self.min_available_nodes, timeout=self.node_wait_timeout, what="configure_train"))
        self.expected = dict(targets)
        msgs = requests.train_requests(self, server_round, arrays, config, targets, context)
        self.sent_train = (server_round, msgs)  # their ids, once a grid pushed them: rounds.requests_sent
        return msgs

    def train_outcome(self, server_round: int, replies: Iterable[Message],
                      context: RunContext | None = None) -> RoundOutcome:
        """The whole round: the replies validated (:func:`strategies.rounds.check_round`), then
        :meth:`aggregate_checked`. An exception is returned in ``error``, never raised."""
        try:
            outcome = rounds.check_round(self, server_round, replies, context or self.context)
        except Exception as exc:  # noqa: BLE001 - the app records it (on-aggregation-error)
            return RoundOutcome(error=exc)
        return self.aggregate_checked(server_round, outcome)

    def aggregate_checked(self, server_round: int, outcome: RoundOutcome) -> RoundOutcome:
        """``outcome`` with the method's step on its valid replies (those validation, or secure
        aggregation, accepted) folded in; unchanged when none is valid (the model stays)."""
        stalled = self.drop_streak.observe(self.name or type(self).__name__, server_round, len(outcome.valid),
                                           [d.reason for d in outcome.dropped])
        if stalled is not None:
            return dataclasses.replace(outcome, error=stalled)
        if not outcome.valid:
            log.warning("round %d: no valid reply; the model stays as it was", server_round)
            return outcome
        try:
            step = self.aggregate_valid(server_round, outcome.valid)
        except Exception as exc:  # noqa: BLE001 - the app records it (on-aggregation-error)
            return dataclasses.replace(outcome, error=exc)
        return outcome.with_step(server_round, step)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's: :meth:`train_outcome`'s arrays, and its metrics beside the clients' own metrics
        aggregated as Flower does (``train_metrics_aggr_fn``, over the replies the method used:
        :attr:`RoundOutcome.metric_replies`); (None, None) when no reply was valid."""
        replies = list(replies)
        sent = flower_compat.metric_keys(replies)
        outcome = self.train_outcome(server_round, replies)
        if outcome.error is not None:
            raise outcome.error
        if outcome.arrays is None:  # no model: the method's metrics alone (Bulyan's skip), as before
            return None, outcome.metrics
        used = outcome.metric_replies if outcome.metric_replies is not None else outcome.client_replies
        client = flower_compat.client_metrics(self, used, self.train_metrics_aggr_fn, "aggregate_train", sent)
        return outcome.arrays, flower_compat.merged(client, outcome.metrics)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                           context: RunContext | None = None) -> list[Message]:
        """Evaluate requests to every client the context selects, else to a seeded draw
        (none with ``fraction_evaluate`` 0); the model is :meth:`evaluation_arrays`'."""
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
        """Every evaluation reply scored, or unscored with its reason (:func:`strategies.rounds.score_evaluation`)."""
        return rounds.score_evaluation(self.expected_eval, replies, context or self.context,
                                       server_round=server_round, sent=self.sent_eval)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower's: the clients' metrics aggregated as Flower does (``evaluate_metrics_aggr_fn``, by
        default weighted by ``weighted_by_key``: custom metrics such as ``f1`` kept) over the replies
        that carry ``weighted_by_key``, with the test-size-weighted mean of the scores beside them
        (``accuracy``, ``loss``, ``num-scored``)."""
        replies = list(replies)
        sent = flower_compat.metric_keys(replies)
        carrying = [r for r in replies if not r.has_error() and self.weighted_by_key in
                    next((rec for rec in r.content.values() if isinstance(rec, MetricRecord)), {})]
        client = flower_compat.client_metrics(self, carrying, self.evaluate_metrics_aggr_fn, "aggregate_evaluate",
                                              sent)
        return flower_compat.merged(client, self.evaluate_outcome(server_round, replies).metrics)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any):
        """Flower's :meth:`Strategy.start`; ``result.arrays`` is the final model even when no
        round produced one (Flower leaves it empty then): the model stayed the initial one."""
        result = super().start(grid, initial_arrays, *args, **kwargs)
        if not len(result.arrays):
            result.arrays = initial_arrays
        return result

    def summary(self) -> None:
        log.info("%s: %s (fraction_train=%s, seed=%s, lr=%s, server_lr=%s)", type(self).__name__,
                 self.params, self.fraction_train, self.seed, self.lr, self.server_lr)
