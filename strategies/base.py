"""The contract every method follows, and the Flower ``Strategy`` they all are.

A method module holds, in this order:

* ``Params`` — a frozen dataclass of its hyperparameters (:mod:`fedcore.params`), declared
  once: keyword construction, the run config and pyproject.toml all read it;
* ``State`` — a dataclass of what survives a round (checkpointed as it is, by
  :mod:`fedcore.state`; no per-method save/load code), and ``init_state``;
* pure functions on flat torch tensors, importable without Flower, that do the maths;
* a thin :class:`FairStrategy` subclass that unpacks replies, calls them and packs the result.

A :class:`FairStrategy` is a complete ``flwr.serverapp.strategy.Strategy``::

    strategy = FedPCD(fraction_train=0.25, tau=0.02, history=10, seed=0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=3)

``configure_train`` samples nodes with a generator seeded by (seed, round) and sends each the
model, a ``config`` record (the round, the client learning rate, the client routine, the
method's client-side values) and any method records (SCAFFOLD's control variate).
``aggregate_train`` is :meth:`FairStrategy.check_train` (malformed and missing replies
dropped with a reason, never a crash) then the method's :meth:`FairStrategy.aggregate_valid`.
A method whose clients must do something special names the client routine in
``client_method``; ``client_app.methods`` documents the function a foreign ClientApp calls for it.

Results are returned, not stashed: a round's outcome is one declared object,
:attr:`FairStrategy.last_train` (:class:`RoundOutcome`: valid, dropped, defence), an
evaluation's is :attr:`FairStrategy.last_eval_outcome` (:class:`EvaluationOutcome`).

Defences wrap a strategy instead of being flags, as Flower's
``DifferentialPrivacyServerSideFixedClipping(strategy, ...)`` does:
``UpdateClip(CentralDP(FedAvg(...), dp), c)`` (:mod:`strategies.wrappers`,
:mod:`strategies.privacy`); a wrapper is itself a strategy, transforms the valid replies
before the inner :meth:`aggregate_valid` and reports into ``last_train.defence``.

Reading a round's updates: ``batch = self.round_updates(valid)`` (:meth:`FairStrategy.round_updates`)
gives ``batch.deltas`` Δ_i = θ_t − θ_i (m, d), ``batch.weights`` p_i, ``batch.theta`` θ_t, the
losses and metrics. The documented kernels beside it — FedPCD's ``write_rows`` and CRAFT's
``deltas`` — write Δ_i straight into buffers they keep across rounds (:meth:`write_deltas`,
:meth:`theta_buffer`) because an (m, d) copy per round is what their benchmarks measure.

The hooks, all declared here with a default (a method overrides only what it needs):

* :meth:`aggregate_valid` (required) — the method's step on the valid replies → (arrays, metrics);
* :meth:`check_reply` — why a train reply's metrics are unusable for the method (FedeRage's β);
* :meth:`init_state` / :meth:`restore_state` — the State at round 0 / rebuilt from a checkpoint;
* :meth:`on_restored` — after a checkpoint's state was assigned (SCAFFOLD);
* :meth:`client_config`, :meth:`round_config`, :meth:`round_records`, :meth:`client_records` —
  what the requests carry;
* :meth:`evaluation_arrays` — the model evaluation scores (AFL's average of iterates);
* :meth:`on_dropped`, :meth:`on_node_changed` — a client gave no usable reply / moved node.

This app's ServerApp (``fedpcd_app``) drives the same objects. It sets :attr:`select`
(its seeded sampler over partition ids, mapped to nodes) and :attr:`run_config` (sent with
every request as the ``run-config`` record), and calls :meth:`aggregate_valid` itself for
the one aggregate reply of a secure-aggregation round.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedcore import flat, keys
from fedcore.config import ConfigError
from fedcore.params import MethodParams, NoParams
from fedcore.replies import (
    NEAR_BOUND_WARN_ROUNDS,
    Dropped,
    ReplyLimits,
    ReplyTrust,
    check_eval_reply,
    check_loss_values,
    check_num_steps,
    steps_asked,
    validate_train_replies,
)
from fedcore.seeding import derive_seed
from fedcore.state import Fields, rebuild
from strategies.signatures import describe_hyperparameters, strategy_signature

log = logging.getLogger("fedpcd")


@dataclasses.dataclass
class ReplyBatch:
    """The round's replies as tensors: what most methods start from."""

    partition_ids: list[int]
    num_examples: torch.Tensor  # (m,) float64
    loss_before: torch.Tensor  # (m,) float64: F_i, the global model's loss on client i
    train_loss: torch.Tensor  # (m,) float64
    num_steps: torch.Tensor  # (m,) float64
    local: torch.Tensor  # (m, d) local models θ_i; Δ_i when ``theta`` is set (round_updates)
    metrics: list[dict]  # each reply's raw metrics
    theta: torch.Tensor | None = None  # θ_t when the rows are updates Δ_i = θ_t − θ_i

    @property
    def fedavg_weights(self) -> torch.Tensor:
        """p_i = n_i / Σ n_j (float64)."""
        return self.num_examples / self.num_examples.sum()

    weights = fedavg_weights

    @property
    def deltas(self) -> torch.Tensor:
        """(m, d) float32 updates Δ_i = θ_t − θ_i (a batch from :meth:`FairStrategy.round_updates`)."""
        if self.theta is None:
            raise ValueError("this batch holds local models θ_i: read the round with round_updates() for Δ_i")
        return self.local


@dataclasses.dataclass
class RoundOutcome:
    """What :meth:`FairStrategy.aggregate_train` made of one round's replies, kept as
    :attr:`FairStrategy.last_train` (the app reads it after each round; nothing else is stashed).

    ``valid`` the replies the method aggregated (sorted by client), ``dropped`` the others
    with their reasons (no reply included), ``defence`` the round's defence reports:
    ``update_norms`` (the validation's median norm and largest ratio, max-update-ratio), then
    those of the wrappers that transformed the valid replies (``update_clip``: :class:`strategies.wrappers.UpdateClip`,
    ``privacy``: :class:`strategies.privacy.CentralDP`), in the order they ran."""

    valid: list[Message] = dataclasses.field(default_factory=list)
    dropped: list[Dropped] = dataclasses.field(default_factory=list)
    defence: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class EvaluationOutcome:
    """What :meth:`FairStrategy.aggregate_evaluate` made of one evaluation's replies, kept as
    :attr:`FairStrategy.last_eval_outcome`: ``scores`` client → {accuracy, loss, num-test};
    ``unscored`` client → why its reply was not used (:func:`fedcore.replies.check_eval_reply`)."""

    scores: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    unscored: dict[int, str] = dataclasses.field(default_factory=dict)


def reply_metrics(replies: Iterable[Message]) -> list[dict]:
    return [dict(msg.content[keys.METRICS]) for msg in replies]


def metric_column(metrics: list[dict], key: str, default: float = 0.0) -> torch.Tensor:
    return torch.tensor([float(m.get(key, default)) for m in metrics], dtype=torch.float64)


def unpack_replies(replies: Iterable[Message], dtype=torch.float32) -> ReplyBatch:
    """Validated train replies → tensors (one (m, d) matrix of local models)."""
    replies = list(replies)
    metrics = reply_metrics(replies)
    local = flat.records_to_matrix([msg.content[keys.ARRAYS] for msg in replies], dtype=dtype)
    return ReplyBatch(
        partition_ids=[client_of(msg) for msg in replies],  # partition-id is optional: else the node id
        num_examples=metric_column(metrics, keys.NUM_EXAMPLES),
        loss_before=metric_column(metrics, keys.LOSS_BEFORE, math.nan),  # NaN unless asked for
        train_loss=metric_column(metrics, keys.TRAIN_LOSS),
        num_steps=metric_column(metrics, keys.NUM_STEPS),
        local=local,
        metrics=metrics,
    )


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


Selector = Callable[[int, Grid], dict[int, "int | None"]]


class FairStrategy(Strategy):
    """Base of every strategy here (see the module docstring).

    Parameters (keyword only; ``**hyper`` are the method's ``Params`` fields)
    ----------
    fraction_train : float, default 1.0
        Fraction of the connected nodes sampled each round (at least ``min_train_nodes``).
    fraction_evaluate : float, default 1.0
        Fraction of nodes asked to evaluate each round (0 = no federated evaluation).
    min_train_nodes : int, default 1
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
    params : the method's ``Params``, instead of ``**hyper``.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[MethodParams]] = NoParams
    State: ClassVar[type | None] = None  # a dataclass built with no arguments at round 0, if any
    client_method: ClassVar[str] = "sgd"
    personalized: ClassVar[bool] = False  # clients are scored with their personal models
    needs_individual_updates: ClassVar[bool] = True  # False: sums suffice (secure aggregation)
    secagg_weighting: ClassVar[str] = "num-examples"  # or "uniform": weights of a secure sum
    required_metrics: ClassVar[tuple[str, ...]] = ()  # reply metrics beyond the required ones
    required_records: ClassVar[tuple[str, ...]] = ()  # reply ArrayRecords, model-shaped
    loss_metrics: ClassVar[tuple[str, ...]] = ()  # reply losses the method weights by: bounded (check_numbers)
    reads_num_steps: ClassVar[bool] = False  # num-steps is read: a whole number in [1, the steps asked]
    app_arguments: ClassVar[tuple[str, ...]] = ()  # derived: the subclass's own __init__ keywords
    own_step: ClassVar[str | None] = None  # how the method steps when it does not use server-lr
    evaluated_iterate: ClassVar[str] = "last"  # what evaluation_arrays gives: "last" θ_t or "averaged" (AFL)
    resolve_device = staticmethod(resolve_device)  # for the app's config check

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

    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 1,
        seed: int = 0,
        lr: float = 0.1,
        lr_decay: float = 1.0,
        server_lr: float = 0.0,
        num_clients: int | None = None,
        loss_before: bool = False,
        device: str | torch.device = "auto",
        params: MethodParams | None = None,
        **hyper: Any,
    ) -> None:
        if params is None:
            names = {f.name for f in dataclasses.fields(self.Params)}
            unknown = sorted(set(hyper) - names)
            if unknown:
                raise TypeError(f"{type(self).__name__}() got unknown argument(s) {unknown}; "
                                f"its hyperparameters are {sorted(names) or 'none'}")
            params = self.Params(**hyper)
        elif hyper:
            raise TypeError(f"{type(self).__name__}(): give either params= or keyword hyperparameters")
        if not isinstance(params, self.Params):
            raise TypeError(f"{type(self).__name__}(): params must be a {self.Params.__qualname__}")
        if not 0.0 < fraction_train <= 1.0:
            raise ConfigError(f"fraction_train = {fraction_train} must be in (0, 1]")
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ConfigError(f"fraction_evaluate = {fraction_evaluate} must be in [0, 1]")
        if lr <= 0.0 or server_lr < 0.0:
            raise ConfigError(f"lr = {lr} must be > 0 and server_lr = {server_lr} >= 0")
        if self.own_step is not None and server_lr != 0.0:
            raise ConfigError(f"run-config key 'server-lr' = {server_lr} is not used by "
                              f"{self.name or type(self).__name__}: "
                              f"{self.own_step}; leave server-lr = 0")
        self.params = params
        self.fraction_train, self.fraction_evaluate = fraction_train, fraction_evaluate
        self.min_train_nodes, self.seed = min_train_nodes, seed
        self.lr, self.lr_decay, self.server_lr = lr, lr_decay, server_lr
        self.num_clients = num_clients
        self.loss_before = loss_before
        self.device = resolve_device(device)
        self.state = self.init_state()
        self.select: Selector | None = None  # set by an app with its own sampler
        self.run_config: Mapping[str, Any] | None = None  # sent as the run-config record
        self.current_arrays: ArrayRecord | None = None
        self.spec: flat.FlatSpec | None = None
        self.expected: dict[int, int | None] = {}  # node → partition id of this round's train requests
        self.expected_eval: dict[int, int | None] = {}  # the same for the evaluation requests
        self.last_train = RoundOutcome()  # the latest aggregate_train's outcome
        self.last_eval_outcome = EvaluationOutcome()  # the latest aggregate_evaluate's outcome
        # Bounds on the clients' numbers (fedcore.replies.ReplyLimits): the app sets the
        # partitions' sizes and the run config's max-num-examples / max-update-ratio.
        self.reply_limits = ReplyLimits()
        # What earlier rounds' accepted replies established (the trusted update scale and loss
        # medians): the size bounds a majority of one round cannot move; checkpointed by the app.
        self.reply_trust = ReplyTrust()
        self._theta_host: torch.Tensor | None = None  # θ_t, reused every round (theta_buffer)
        self._staging: torch.Tensor | None = None  # one host row (write_deltas, device ≠ CPU)

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
        """The method's State rebuilt from a checkpoint's saved fields: the class is the one this
        strategy keeps (nothing the file names is imported; :func:`fedcore.state.rebuild`)."""
        current = self.__dict__.get("_state")
        target = type(current) if current is not None else self.State
        if target is None:
            raise ValueError(f"{self.name or type(self).__name__} keeps no state, but the checkpoint holds "
                             f"fields {sorted(fields)}: it was written by another method")
        return rebuild(target, fields)

    def init_state(self) -> Any:
        """The method's State at round 0: ``State()`` (None: the method keeps nothing across
        rounds). A method whose round-0 state needs its params overrides this."""
        return None if self.State is None else self.State()

    def aggregate_valid(self, server_round: int,
                        replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate well-formed replies (sorted by partition id): the method's own step."""
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

    def check_numbers(self, server_round: int, replies: list[Message]) -> dict[int, str]:
        """{index: reason} of the replies whose numbers the method reads are out of bounds: each
        of :attr:`loss_metrics` (:func:`fedcore.replies.check_loss_values`: finite, ≥ 0, bounded
        against the round's and the trusted median), ``num-steps`` when :attr:`reads_num_steps`
        (a whole number in [1, the steps the run config asked for]), then :meth:`check_valid`."""
        out: dict[int, str] = {}
        metrics = [r.content[keys.METRICS] for r in replies]
        for key in self.loss_metrics:
            bad, _ = check_loss_values([m.get(key) for m in metrics], key, self.reply_trust)
            for i, why in bad.items():
                out.setdefault(i, why)
            self.reply_trust.observe_losses(key, [float(m[key]) for i, m in enumerate(metrics) if i not in bad])
        if self.reads_num_steps:
            for i, m in enumerate(metrics):
                why = check_num_steps(m.get(keys.NUM_STEPS), steps_asked(self.run_config, m[keys.NUM_EXAMPLES]))
                if why is not None:
                    out.setdefault(i, why)
        keep = [i for i in range(len(replies)) if i not in out]
        for j, why in self.check_valid(server_round, [replies[i] for i in keep]).items():
            out.setdefault(keep[j], why)
        return out

    def on_dropped(self, server_round: int, client: int | None) -> None:
        """A sampled client gave no usable reply (FedLF forgets its history row)."""

    def on_restored(self) -> None:
        """Called by the app after :attr:`state` was assigned from a checkpoint (SCAFFOLD marks
        every mirrored client as owed its c_i). Default: nothing."""

    def on_node_changed(self, client: int) -> None:
        """Client ``client`` is now served by another node (a restarted SuperNode rejoins under a
        new node id): whatever it kept in its node's ``context.state`` is gone (SCAFFOLD
        re-sends its c_i)."""

    # -- shared helpers ---------------------------------------------------------------------
    def round_lr(self, server_round: int) -> float:
        """η_l of a round."""
        return self.lr * self.lr_decay ** (server_round - 1)

    def step_scale(self, server_round: int) -> float:
        """η_g/η_l for this round (:func:`server_step_scale`)."""
        return server_step_scale(self.server_lr, self.round_lr(server_round))

    def current_flat(self, dtype=torch.float32) -> torch.Tensor:
        if self.current_arrays is None:
            raise RuntimeError("configure_train() must run before aggregate_train(): it hands over θ_t")
        return flat.record_to_flat(self.current_arrays, dtype=dtype)

    def theta_buffer(self) -> torch.Tensor:
        """θ_t as a float32 host vector written into a buffer kept across rounds (a fresh
        (d,) tensor per round costs its first-touch page faults: ~45 MB at ResNet-18)."""
        d = self.spec.dim
        if self._theta_host is None or self._theta_host.numel() != d:
            self._theta_host = torch.empty(d, dtype=torch.float32)
        return flat.record_to_flat(self.current_arrays, out=self._theta_host)

    def write_deltas(self, theta: torch.Tensor, records: list[ArrayRecord], rows: torch.Tensor) -> torch.Tensor:
        """Δ_i = θ_t − θ_i of each record into ``rows[i]``, straight from the reply bytes
        (:func:`fedcore.flat.records_to_deltas`, one pass); rows outside host memory
        (``server-device`` cuda) through :meth:`stage_deltas`."""
        if rows.device.type == "cpu":
            return flat.records_to_deltas(theta, records, out=rows)
        return self.stage_deltas(theta, records, rows)

    def stage_deltas(self, theta: torch.Tensor, records: list[ArrayRecord], rows: torch.Tensor) -> torch.Tensor:
        """:meth:`write_deltas` through one reused (pinned) host row per reply, copied to
        ``rows[i]`` on any device (tests run it on the CPU)."""
        d = theta.numel()
        if self._staging is None or self._staging.shape[1] != d:
            self._staging = torch.empty(1, d, dtype=theta.dtype, pin_memory=torch.cuda.is_available())
        for i, rec in enumerate(records):
            rows[i].copy_(flat.records_to_deltas(theta, [rec], out=self._staging)[0])
        return rows[: len(records)]

    def round_updates(self, replies: list[Message]) -> ReplyBatch:
        """The one way to read a round's updates: the valid replies as tensors, ``batch.deltas``
        the (m, d) float32 Δ_i = θ_t − θ_i (in client order), ``batch.weights`` p_i = n_i/Σn_j,
        ``batch.theta`` θ_t, plus the losses and raw metrics. Kernels that must not hold an
        (m, d) copy write the rows themselves (:meth:`write_deltas` into their own buffer)."""
        batch = unpack_replies(replies)
        batch.theta = self.current_flat()
        flat.model_deltas(batch.theta, batch.local)  # in place: no second (m, d) copy
        return batch

    def unpack_deltas(self, replies: list[Message]) -> tuple[torch.Tensor, ReplyBatch, torch.Tensor]:
        """(θ_t, batch, Δ) of :meth:`round_updates`, as a tuple (the older spelling)."""
        batch = self.round_updates(replies)
        return batch.theta, batch, batch.deltas

    def to_record(self, flat_vec: torch.Tensor) -> ArrayRecord:
        assert self.spec is not None
        return flat.flat_to_record(flat_vec, self.spec)

    @property
    def want_loss_before(self) -> bool:
        return self.loss_before or keys.LOSS_BEFORE in self.required_metrics

    def set_model(self, arrays: ArrayRecord) -> None:
        """θ_t: what the round's replies are compared with."""
        self.current_arrays = arrays
        if self.spec is None:
            self.spec = flat.spec_of(arrays)

    # -- Flower's Strategy --------------------------------------------------------------------
    def sample(self, server_round: int, grid: Grid) -> dict[int, int | None]:
        """node → client id (partition id, or None when unknown) of this round's clients."""
        if self.select is not None:
            return self.select(server_round, grid)
        nodes = sorted(int(n) for n in grid.get_node_ids())
        k = min(len(nodes), max(self.min_train_nodes, int(round(self.fraction_train * len(nodes)))))
        rng = random.Random(derive_seed(self.seed, "flower-sample", server_round))
        return {n: None for n in sorted(rng.sample(nodes, k))}

    def _config(self, server_round: int, config: ConfigRecord | Mapping[str, Any] | None) -> dict[str, Any]:
        return {
            **dict(config or {}),
            keys.SERVER_ROUND: server_round,
            keys.ROUND_LR: self.round_lr(server_round),
            keys.CLIENT_METHOD: self.client_method,
            keys.WANT_LOSS_BEFORE: self.want_loss_before,
            **self.client_config(),
        }

    def _run_config_record(self) -> ConfigRecord:
        """The run-config record, built once per run config and shared by every message (as
        Flower's own strategies share one RecordDict): ~140 keys validated once, not once per
        message (measured 0.14 s of a 100-client round). The engines hand each node a copy."""
        cached = getattr(self, "_run_record", None)
        if cached is None or cached[0] is not self.run_config:
            cached = (self.run_config, ConfigRecord(dict(self.run_config)))
            self._run_record = cached
        return cached[1]

    def _message(self, content: dict[str, Any], node: int, kind: str, group: str) -> Message:
        if self.run_config is not None:
            content[keys.RUN_CONFIG] = self._run_config_record()
        return Message(RecordDict(content), dst_node_id=node, message_type=kind, group_id=group)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        self.set_model(arrays)
        targets = self.sample(server_round, grid)
        base = {**self._config(server_round, config), **self.round_config(server_round)}
        records = self.round_records(server_round)
        msgs = []
        for node, client in targets.items():
            conf = base if client is None else {**base, keys.PARTITION_ID: client}
            content = {keys.ARRAYS: arrays, keys.CONFIG: ConfigRecord(conf), **records,
                       **self.client_records(client)}
            msgs.append(self._message(content, node, MessageType.TRAIN, str(server_round)))
        self.expected = dict(targets)
        return msgs

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """:meth:`check_train` (the outcome in :attr:`last_train`), then :meth:`aggregate_valid`
        on the valid replies; (None, None) when none was valid (the model stays)."""
        outcome = self.check_train(server_round, replies)
        if not outcome.valid:
            return None, None
        return self.aggregate_valid(server_round, outcome.valid)

    def check_train(self, server_round: int, replies: Iterable[Message]) -> RoundOutcome:
        """The round's replies split into valid (sorted by client) and dropped-with-reasons
        (a malformed reply and a missing one alike: logged, :meth:`on_dropped` called, never a
        crash); the result is also :attr:`last_train`, reset first: whatever happens below, the
        app never reads an earlier round's outcome as this round's."""
        self.last_train = RoundOutcome()
        replies = list(replies)
        self.read_aliases(replies, keys.TRAIN_ALIASES, "train")
        required = (*self.required_metrics, *((keys.LOSS_BEFORE,) if self.want_loss_before else ()))
        norms: dict = {}
        valid, dropped = validate_train_replies(replies, self.expected, self.spec, required, self.required_records,
                                                limits=self.reply_limits, theta=self.current_arrays,
                                                check=self.check_reply, stats=norms, trust=self.reply_trust)
        try:
            bad = self.check_numbers(server_round, valid)
        except Exception as exc:  # noqa: BLE001 - a reply's numbers can drop the replies, never the round
            why = f"reply numbers could not be checked ({type(exc).__name__}: {exc})".splitlines()[0]
            bad = dict.fromkeys(range(len(valid)), why)
        dropped += [Dropped(client_of(valid[i]), int(valid[i].metadata.src_node_id), why)
                    for i, why in sorted(bad.items())]
        valid = [r for i, r in enumerate(valid) if i not in bad]
        if norms.get("near_bound"):
            self.reply_trust.near_bound_rounds += 1
            n = self.reply_trust.near_bound_rounds
            if n >= NEAR_BOUND_WARN_ROUNDS:
                log.warning("round %d: %d accepted update(s) within 4x of the size bound (%d rounds so far): "
                            "poisoning under the bound looks like this (update_norms in rounds.jsonl)",
                            server_round, norms["near_bound"], n)
        if norms:
            norms["near_bound_rounds"] = self.reply_trust.near_bound_rounds
        # Replies arrive in whatever order the nodes finish: sort by client so that float
        # sums (and so every result) do not depend on arrival order.
        valid.sort(key=lambda r: client_of(r))
        answered = {int(r.metadata.src_node_id) for r in replies}
        dropped += [Dropped(pid, node, "no reply (timeout or lost)")
                    for node, pid in self.expected.items() if node not in answered]
        for d in dropped:
            log.warning("round %d: dropped reply of client %s: %s", server_round,
                        d.partition if d.partition is not None else d.node, d.reason)
            self.on_dropped(server_round, d.partition if d.partition is not None else d.node)
        # update_norms: the round's median update norm and largest norm / median (max-update-ratio)
        self.last_train = RoundOutcome(valid, dropped, {"update_norms": norms} if norms else {})
        if not valid:
            log.warning("round %d: no valid reply; the model stays as it was", server_round)
        return self.last_train

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> list[Message]:
        if self.fraction_evaluate == 0.0 and self.select is None:
            return []
        if self.select is not None:
            targets = self.select(-server_round, grid)  # the app's selector: every client
        else:
            nodes = sorted(int(n) for n in grid.get_node_ids())
            k = max(1, int(round(self.fraction_evaluate * len(nodes))))
            rng = random.Random(derive_seed(self.seed, "flower-evaluate", server_round))
            targets = {n: None for n in sorted(rng.sample(nodes, k))}
        arrays = self.evaluation_arrays(arrays)
        base = self._config(server_round, config)
        self.expected_eval = dict(targets)
        return [
            self._message({keys.ARRAYS: arrays, keys.CONFIG: ConfigRecord(
                base if client is None else {**base, keys.PARTITION_ID: client})},
                node, MessageType.EVALUATE, f"eval-{server_round}")
            for node, client in targets.items()
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Per-client scores into :attr:`last_eval_outcome`; their test-size-weighted mean."""
        scores: dict[int, dict[str, float]] = {}
        replies = list(replies)
        self.read_aliases(replies, keys.EVALUATE_ALIASES, "evaluate")
        unscored: dict[int, str] = {}
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            want = self.expected_eval.get(node)
            if want is None and not reply.has_error() and keys.METRICS in reply.content:
                pid = reply.content[keys.METRICS].get(keys.PARTITION_ID, node)
                want = int(pid) if isinstance(pid, (int, float)) and math.isfinite(pid) else node
            client = want if want is not None else node
            score, reason = check_eval_reply(reply, self.reply_limits.max_count(client, "test"),
                                             self.reply_limits.source(client, "test"))
            if reason is not None:  # the client stays unscored, with its reason
                log.warning("evaluation reply of client %s dropped: %s", client, reason)
                unscored[client] = reason
                continue
            scores[client] = score
        self.last_eval_outcome = EvaluationOutcome(scores, unscored)
        if not scores:
            return None
        n = np.array([s["num-test"] for s in scores.values()])
        return MetricRecord({
            "accuracy": float(np.dot(n, [s["accuracy"] for s in scores.values()]) / n.sum()),
            "loss": float(np.dot(n, [s["loss"] for s in scores.values()]) / n.sum()),
            "num-scored": len(scores),
        })

    def read_aliases(self, replies: list[Message], aliases: dict[str, str], kind: str) -> None:
        """Replies that name a metric as Flower's quickstart does (``train_loss``, ``eval_acc``, ...)
        are read under the expected key (:data:`fedcore.keys.TRAIN_ALIASES`), with one warning
        per name naming the key to send, instead of being dropped round after round."""
        warned = self.__dict__.setdefault("_aliases_warned", set())
        for reply in replies:
            if reply.has_error() or not isinstance(reply.content.get(keys.METRICS), MetricRecord):
                continue
            for alias, key in keys.read_aliases(reply.content[keys.METRICS], aliases):
                if alias not in warned:
                    warned.add(alias)
                    log.warning("%s reply metric '%s' (node %s) is read as '%s': send '%s' (fedcore.keys; README: "
                                "Using the strategies in your own Flower app)", kind, alias,
                                reply.metadata.src_node_id, key, key)

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


def client_of(reply: Message) -> int:
    """The client a reply speaks for: its partition id, else its node id."""
    m = reply.content[keys.METRICS]
    pid = m.get(keys.PARTITION_ID)
    return int(pid) if pid is not None else int(reply.metadata.src_node_id)
