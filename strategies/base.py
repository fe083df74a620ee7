"""The method contract: what an aggregation method is, and all it sees of a round.

A method is a pure aggregator, as optax writes a transformation and FedJAX an algorithm::

    method = FedPCDMethod(params, setting)     # hyperparameters, and what it may know of the run
    state = method.init()                      # what survives a round (a dataclass, or None)
    step = method.aggregate(round_, state)     # Step(model, state, metrics, dropped, ...)
    state = step.state                         # the next round starts from the state returned

It never sees a Flower ``Message``. ``round_`` is a :class:`Round`: what the gate
(:mod:`strategies.gate`) made of the round's replies after it kept only those that answer this
round's requests, once per node, from the client the server assigned, holding the model and
exactly the numbers and records the method declared in :attr:`Method.reads`, each finite and
within its documented range. Everything on Flower's side — sampling, requests, the gate,
Flower's keywords, metrics and ``start`` — is one class, :class:`strategies.flower.FairStrategy`;
a method adds nothing to it.

A method module holds, in this order: ``Params`` (a frozen :class:`fedcore.params.MethodParams`:
each hyperparameter's run-config key, range and meaning, declared once), ``State`` (a dataclass,
checkpointed as it is by :mod:`fedcore.state`), the maths as pure functions on flat tensors, the
:class:`Method` subclass that chains them, and its Flower class (a :class:`FairStrategy` subclass
whose ``__init__`` names the hyperparameters). The state a round returns may reuse the buffers of
the state it was given (FedPCD's history cache: a copy a round would double its memory): a state
handed to :meth:`Method.aggregate` belongs to that round, as a buffer donated to a jitted step.

The contract, in numbers: a :class:`Method` has 10 declarations (``name``, ``Params``,
``weighting``, ``client_method``, ``needs_individual_updates``, ``secagg_weighting``,
``personalized``, ``own_step``, ``evaluated_iterate``, and the instance's ``reads``) and 11
methods (``__init__``, :meth:`~Method.resolve_weighting`, :meth:`~Method.init`,
:meth:`~Method.aggregate`, :meth:`~Method.check`, :meth:`~Method.request`,
:meth:`~Method.client_records`, :meth:`~Method.evaluation_model`, :meth:`~Method.restore`,
:meth:`~Method.restored`, :meth:`~Method.node_changed`), most of which a method leaves as they
are (FedAvg's method writes ``aggregate`` alone).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedcore import flat, keys
from fedcore.config import ConfigError
from fedcore.params import MethodParams, NoParams
from fedcore.state import Fields, rebuild


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


@dataclasses.dataclass(frozen=True)
class Reads:
    """What a method reads of a train reply besides the model and ``num-examples``: the gate
    checks exactly these (and drops a reply that lacks one, or holds one out of its range).

    ``losses``: loss metrics it weights by (finite, ≥ 0, within a band around the round's median:
    :func:`fedcore.replies.check_loss_values`); ``num_steps``: it reads ``num-steps`` (a whole
    number in [1, the steps the request asked]); ``values``: other metrics it reads, each with its
    closed range (low, high, what the range is called: FedeRage's β in its box); ``records``:
    model-shaped ArrayRecords beside the model (SCAFFOLD's Δc_i)."""

    losses: tuple[str, ...] = ()
    num_steps: bool = False
    values: Mapping[str, tuple[float, float, str]] = dataclasses.field(default_factory=dict)
    records: tuple[str, ...] = ()

    @property
    def metrics(self) -> tuple[str, ...]:
        """Every metric read, in a fixed order (losses, num-steps, the values)."""
        return (*self.losses, *((keys.NUM_STEPS,) if self.num_steps else ()), *self.values)

    def value_problem(self, metrics: Mapping[str, Any]) -> str | None:
        """Why one reply's declared ``values`` are out of their ranges (None when they are in)."""
        for key, (low, high, what) in self.values.items():
            v = metrics.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return f"metric '{key}' is not a finite number ({v!r})"
            if not low <= v <= high:
                return f"metric '{key}' = {v:g} is outside {what} = [{low:g}, {high:g}]"
        return None


@dataclasses.dataclass(frozen=True)
class Setting:
    """What a method may know of the run it serves, fixed when it is built.

    ``num_clients`` N, the federation's size (None: a foreign app's; then each round's
    :attr:`Round.num_nodes` is the nodes connected when it was sampled); ``clients_per_round``
    (None when N is unknown); ``device`` where its server maths runs; ``model`` the run's freshly
    built model (CRAFT's layer groups; None in a foreign app that passes none); ``momentum`` the
    clients' SGD momentum (FedNova's a_i)."""

    num_clients: int | None = None
    clients_per_round: int | None = None
    device: torch.device = torch.device("cpu")
    model: torch.nn.Module | None = None
    momentum: float = 0.0


def metric_column(metrics: list[Mapping[str, Any]], key: str, default: float = 0.0) -> torch.Tensor:
    return torch.tensor([float(m.get(key, default)) for m in metrics], dtype=torch.float64)


@dataclasses.dataclass
class Round:
    """A round as a method sees it: the gate's checked replies as data, and how to read them.

    Numbers per reply, in client order (sorted by client, so that no result depends on the
    order replies arrived in): ``clients`` (the partition id, else the node id), ``num_examples``,
    ``weights`` (Flower's ``weighted_by_key`` metric: ``num_examples`` unless a foreign app named
    another), ``values`` (each metric the method declared in :attr:`Method.reads`, as float64),
    ``records`` (each declared record). The models: ``models`` as sent (ArrayRecords: bytes, read
    only when asked for) and θ_t, with readers that never build more than the method asks:

    * :attr:`deltas` — the (m, d) updates Δ_i = θ_t − θ_i (most methods);
    * :attr:`model_matrix` — the (m, d) local models θ_i;
    * :meth:`weighted_models` — Σ_i w_i θ_i streamed from the bytes, no (m, d) matrix (FedAvg);
    * :meth:`write_updates` — Δ_i written straight into rows a kernel keeps (FedPCD, CRAFT).

    Floats are in :attr:`dtype`: float32, float64 for a model that holds a float64 array and a
    method that aggregates such a model in float64 (the classes named like Flower's)."""

    number: int  # the server round
    lr: float  # η_l, the clients' learning rate this round
    step_scale: float  # η_g/η_l (server_step_scale)
    clients: list[int]
    num_examples: torch.Tensor  # (m,) float64
    weights: torch.Tensor  # (m,) float64
    values: dict[str, torch.Tensor]  # declared metric → (m,) float64
    records: dict[str, list[ArrayRecord]]  # declared record → its m records
    models: list[ArrayRecord]
    current: ArrayRecord  # θ_t as sent
    spec: flat.FlatSpec
    dtype: torch.dtype = torch.float32
    num_nodes: int | None = None  # the nodes connected when the round was sampled (N of a foreign app)
    _deltas: torch.Tensor | None = dataclasses.field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.clients)

    @functools.cached_property
    def theta(self) -> torch.Tensor:
        """θ_t as one (d,) vector in :attr:`dtype` (read through the spec's layout)."""
        return flat.record_to_flat_views(flat.record_views(self.current, flat.spec_layout(self.spec)),
                                         dtype=self.dtype)

    def theta_as(self, dtype: torch.dtype) -> torch.Tensor:
        """θ_t as a fresh (d,) vector in ``dtype`` (float64 for a method that keeps an average of models)."""
        return flat.record_to_flat(self.current, dtype=dtype)

    @property
    def fedavg_weights(self) -> torch.Tensor:
        """p_i = n_i / Σ n_j (float64)."""
        return self.num_examples / self.num_examples.sum()

    def value(self, key: str) -> torch.Tensor:
        """One declared metric, (m,) float64 (``loss-before``, ``num-steps``, ...)."""
        return self.values[key]

    @property
    def deltas(self) -> torch.Tensor:
        """(m, d) updates Δ_i = θ_t − θ_i in :attr:`dtype`, read on first use (in place over the
        stacked local models: one (m, d) matrix)."""
        if self._deltas is None:
            self._deltas = flat.model_deltas(self.theta, flat.records_to_matrix(self.models, dtype=self.dtype))
        return self._deltas

    @property
    def model_matrix(self) -> torch.Tensor:
        """(m, d) local models θ_i in :attr:`dtype` (a fresh matrix at each use)."""
        return flat.records_to_matrix(self.models, dtype=self.dtype)

    def weighted_models(self, weights: torch.Tensor) -> torch.Tensor:
        """Σ_i w_i θ_i ((d,), :attr:`dtype`) straight from the reply bytes, without an (m, d)
        matrix (:func:`fedcore.flat.weighted_sum_views`)."""
        layout = flat.spec_layout(self.spec)
        return flat.weighted_sum_views([flat.record_views(r, layout) for r in self.models], weights,
                                       dtype=self.dtype)

    def write_updates(self, rows: torch.Tensor, writer: flat.UpdateWriter, copies: list[torch.Tensor] | None = None,
                      norms: bool = False) -> tuple[torch.Tensor, np.ndarray | None]:
        """(θ_t as the writer's float32 host vector, ‖Δ_i‖² or None): Δ_i written into ``rows[i]``
        (any device; and into ``copies[i]``) in one pass over the reply bytes; afterwards
        :attr:`deltas` is ``rows[:m]``."""
        theta = writer.theta(self.current)
        sq_norms = writer.write(theta, self.models, rows, copies, norms)
        self._deltas = rows[: len(self.models)]
        return theta, sq_norms

    def record_matrix(self, name: str) -> torch.Tensor:
        """(m, d) float32 of a declared record (SCAFFOLD's Δc_i)."""
        return flat.records_to_matrix(self.records[name])

    def subset(self, keep: list[int]) -> Round:
        """The round with only the replies at ``keep`` (in that order)."""
        idx = torch.tensor(keep, dtype=torch.long)
        return dataclasses.replace(
            self, clients=[self.clients[i] for i in keep], num_examples=self.num_examples[idx],
            weights=self.weights[idx], values={k: v[idx] for k, v in self.values.items()},
            records={k: [v[i] for i in keep] for k, v in self.records.items()},
            models=[self.models[i] for i in keep], _deltas=None)

    def with_models(self, models: list[ArrayRecord]) -> Round:
        """The round with other local models (a defence's transformed ones)."""
        return dataclasses.replace(self, models=list(models), _deltas=None)

    def to_record(self, flat_vec: torch.Tensor) -> ArrayRecord:
        """A flat (d,) vector as the model's ArrayRecord (its names, shapes and dtypes)."""
        return flat.flat_to_record(flat_vec, self.spec)


@dataclasses.dataclass
class Step:
    """What :meth:`Method.aggregate` returns.

    ``model``: θ_{t+1} as a flat (d,) tensor, or as arrays by name (a method that steps array by
    array in Flower's arithmetic returns its own dtypes); None: the model stays. ``state``: the
    state the next round starts from. ``metrics``: the method's diagnostics (rounds.jsonl's
    ``strategy``; finite numbers or lists of them). ``dropped``: index in the round → why the method
    could not use that reply after all (FedPCD's non-finite update). ``selected``: the indices whose
    own metrics Flower's metric aggregation reads (Krum's selection; None: every reply used).
    ``defence``: the defences' reports (``update_clip``, ``privacy``)."""

    model: torch.Tensor | dict[str, np.ndarray] | None
    state: Any = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    dropped: dict[int, str] = dataclasses.field(default_factory=dict)
    selected: list[int] | None = None
    defence: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Request:
    """What every train request of a round carries for the method beside the model: ``config``
    values for the client routine (FedProx's μ, FedeRage's β̂) and model-shaped ``records``
    (SCAFFOLD's c)."""

    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    records: Mapping[str, ArrayRecord] = dataclasses.field(default_factory=dict)


class Method:
    """An aggregation method (see the module docstring). A subclass sets its declarations and
    writes :meth:`aggregate`; every other hook has a default that does nothing."""

    name: ClassVar[str] = ""  # the run-config method name (set by strategies.registry.register)
    Params: ClassVar[type[MethodParams]] = NoParams
    weighting: ClassVar[str] = ""  # one of strategies.registry.WEIGHTINGS: each method declares it (register checks)
    client_method: ClassVar[str] = keys.SGD  # the client routine its requests name (client_app.methods)
    needs_individual_updates: ClassVar[bool] = True  # False: a weighted sum of the replies suffices (SecAgg+, DP)
    secagg_weighting: ClassVar[str] = "num-examples"  # or "uniform": the weights of a secure sum
    personalized: ClassVar[bool] = False  # clients are scored with their personal models (Ditto)
    own_step: ClassVar[str | None] = None  # how it steps when it does not use server-lr (server-lr refused)
    evaluated_iterate: ClassVar[str] = "last"  # what evaluation_model gives: "last" θ_t or "averaged" (AFL)

    def __init__(self, params: MethodParams | None = None, setting: Setting | None = None) -> None:
        self.params = params if params is not None else self.Params()
        if not isinstance(self.params, self.Params):
            raise TypeError(f"{type(self).__name__}: params must be a {self.Params.__qualname__}")
        self.setting = setting if setting is not None else Setting()
        self.reads = Reads()

    @classmethod
    def resolve_weighting(cls, config: Mapping[str, Any]) -> str:
        """How it weights its clients under a full run config (a key may choose: FedAvg's
        ``fedavg-weighting``); default: :attr:`weighting`."""
        return cls.weighting

    def init(self) -> Any:
        """The state at round 0 (None: the method keeps nothing)."""
        return None

    def aggregate(self, round_: Round, state: Any) -> Step:
        """θ_{t+1}, the next state and the round's metrics from the gate's round."""
        raise NotImplementedError

    def check(self, round_: Round, state: Any) -> dict[int, str]:
        """index → why a reply's declared records are out of bounds against the state (SCAFFOLD's
        Δc_i against its own update); the gate drops them. Default: none."""
        return {}

    def request(self, server_round: int, state: Any, current: ArrayRecord) -> Request:
        """What every request of the round carries for the client routine (``current``: θ_t, the
        model the records are shaped like)."""
        return Request()

    def client_records(self, state: Any, client: int | None, current: ArrayRecord) -> dict[str, ArrayRecord]:
        """ArrayRecords for one client's request only (SCAFFOLD's c_i after a resume)."""
        return {}

    def evaluation_model(self, state: Any, current: ArrayRecord) -> ArrayRecord:
        """The model evaluation scores (AFL: its averaged iterate); default θ_t."""
        return current

    def restore(self, fields: Fields) -> Any:
        """The state rebuilt from a checkpoint's saved fields (:mod:`fedcore.state`)."""
        template = self.init()
        if template is None:
            raise ValueError(f"{self.name or type(self).__name__} keeps no state, but the checkpoint holds fields "
                             f"{sorted(fields)}: it was written by another method")
        return rebuild(type(template), fields)

    def restored(self, state: Any) -> Any:
        """The state once a run resumed from it (SCAFFOLD: every mirrored c_i is owed again)."""
        return state

    def node_changed(self, state: Any, client: int) -> Any:
        """The state once ``client`` is served by another node (a restarted SuperNode): what it
        kept in its node's ``context.state`` is gone (SCAFFOLD re-sends its c_i)."""
        return state


class Transform(Method):
    """A method around another (a defence: :class:`strategies.defences.UpdateClip`,
    :class:`strategies.privacy.CentralDP`): every declaration and hook is the inner method's
    unless the transform writes its own; its state is the inner method's (or wraps it)."""

    def __init__(self, inner: Method) -> None:
        self.inner = inner
        self.params, self.setting, self.reads = inner.params, inner.setting, inner.reads
        for name in ("name", "Params", "weighting", "client_method", "needs_individual_updates", "secagg_weighting",
                     "personalized", "own_step", "evaluated_iterate"):
            setattr(self, name, getattr(inner, name))

    @property
    def core(self) -> Method:
        """The method at the centre of the chain."""
        inner = self.inner
        return inner.core if isinstance(inner, Transform) else inner

    def resolve_weighting(self, config):  # type: ignore[override]
        return self.inner.resolve_weighting(config)

    def init(self):
        return self.inner.init()

    def aggregate(self, round_, state):
        return self.inner.aggregate(round_, state)

    def check(self, round_, state):
        return self.inner.check(round_, state)

    def request(self, server_round, state, current):
        return self.inner.request(server_round, state, current)

    def client_records(self, state, client, current):
        return self.inner.client_records(state, client, current)

    def evaluation_model(self, state, current):
        return self.inner.evaluation_model(state, current)

    def restore(self, fields):
        return self.inner.restore(fields)

    def restored(self, state):
        return self.inner.restored(state)

    def node_changed(self, state, client):
        return self.inner.node_changed(state, client)


def find(method: Method, kind: type) -> Any:
    """The first method of type ``kind`` in ``method``'s chain of transforms (None if none)."""
    while method is not None:
        if isinstance(method, kind):
            return method
        method = method.inner if isinstance(method, Transform) else None
    return None


def restore_state(method: Method, value: Any) -> Any:
    """A state assigned from a checkpoint: saved :class:`Fields` rebuilt by the method, anything else as it is."""
    return method.restore(value) if isinstance(value, Fields) else value
