"""The ClientApp: answers the server's query, train and evaluate messages.

The run config comes once per run, in the ``Context`` (``context.run_config``, as Flower's
runtime and the local engine give it; parsed once per run: :mod:`client_app.run_config`); a
request carries what changes per round or per client, its ``config`` record (the round, its
learning rate, the client routine, the method's values), so the same code runs in Flower's
simulation, in the in-process entry point and on real SuperNodes.
:func:`train_reply` and :func:`evaluate_reply` are the client side of every method for a
foreign ClientApp too. The client's partition id comes from its
node config (``partition-id``, set by the simulation engine or by
``flower-supernode --node-config "partition-id=3 num-partitions=10"``). A node that brings
its own data (run config ``client-data = "node"``) trains and is scored on the folder named
by ``data-path`` in its node config instead (:mod:`client_app.local_data`).
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Mapping, MutableMapping

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app import batch_delivery, local_data
from client_app.attacks import attack_eval_mod, attack_mod
from client_app.attacks import passes_through as attack_passes_through
from client_app.data import CropFlip, FederatedData, batch_augmentation, load_federated_data
from client_app.methods import ClientMethod, LocalTraining, TrainJob, TrainOutcome, get_client_method
from client_app.models import build_model, input_spec
from client_app.run_config import read_run_config
from client_app.secagg import requested as secagg_requested
from client_app.secagg import secure_aggregation_mod
from client_app.training import device, evaluate
from fedcore import flat, keys
from fedcore.config import RunConfig
from fedcore.seeding import derive_seed, seed_torch, torch_generator

app = ClientApp()


def node_partition(context: Context, config: Mapping | None = None) -> int:
    """This node's partition id: its node config, else the one the server assigned."""
    if keys.PARTITION_ID in context.node_config:
        return int(context.node_config[keys.PARTITION_ID])
    if config is not None and keys.PARTITION_ID in config:
        return int(config[keys.PARTITION_ID])
    raise ValueError(
        "this SuperNode has no partition id: start it with "
        "--node-config \"partition-id=<i> num-partitions=<n>\""
    )


def served_partition(context: Context, config: Mapping, cfg: RunConfig) -> int:
    """The partition a request is for. With partitioned data (``client-data = "partition"``)
    a node can serve any partition, and a simulation with fewer nodes than partitions routes
    several to one node (:class:`fedpcd_app.server.membership.PartitionRouter`): the request's
    ``partition-id`` wins. A node with its own data (``client-data = "node"``) always serves
    its own partition."""
    if not local_data.is_node_mode(cfg) and keys.PARTITION_ID in config:
        return int(config[keys.PARTITION_ID])
    return node_partition(context, config)


class PartitionState(MutableMapping):
    """A partition's view of the node's ``context.state``: its entries under keys suffixed
    ``@p<partition>``, so that a node serving several partitions keeps each one's state
    (SCAFFOLD's c_i, Ditto's personal model) apart, and a partition's state is the same
    whichever other partitions its node serves."""

    def __init__(self, state: RecordDict, partition_id: int) -> None:
        self.state, self.suffix = state, f"@p{int(partition_id)}"

    def __getitem__(self, key):
        return self.state[key + self.suffix]

    def __setitem__(self, key, value) -> None:
        self.state[key + self.suffix] = value

    def __delitem__(self, key) -> None:
        del self.state[key + self.suffix]

    def __iter__(self):
        return (k[: -len(self.suffix)] for k in list(self.state) if k.endswith(self.suffix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def request_config(msg: Message, context: Context) -> tuple[RunConfig, dict]:
    """(the run config, from the Context, parsed once per run; the request's per-round values)."""
    return read_run_config(context, msg), dict(msg.content[keys.CONFIG])


# One model object per (architecture, input shape, classes, device, thread or batch slot), reused
# across the messages a process handles: every parameter and buffer is overwritten from the
# received ArrayRecord, so a reused model equals a fresh one (ResNet-18 construction is
# ~80 ms per message on a CPU, the CNN's ~2-6 ms). Training mutates it; the reply is
# copied out of it (``flat.state_to_record``) before the next message.
_MODELS: dict[tuple, _Held] = {}
# model -> its _Held's state (state_of); not the _Held itself, which holds the model: the entry
# goes with the model once _MODELS drops it
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass(eq=False)
class _Held:
    """One of the process's model objects and its parameters' and buffers' objects by name, read
    once (``state_dict(keep_vars=True)``): the module walk of ``state_dict()`` and ``zero_grad()``
    cost a small model's message more than its weights' copy. Training writes the same objects in
    place (the optimizers, the rows' ``load_params``), so what is read once stays what a walk reads."""

    model: torch.nn.Module
    state: dict[str, torch.Tensor]
    params: list[torch.Tensor]

    @classmethod
    def of(cls, model: torch.nn.Module) -> _Held:
        return cls(model, model.state_dict(keep_vars=True), list(model.parameters()))


def model_for(cfg: RunConfig, arrays: ArrayRecord, data: FederatedData | None = None) -> torch.nn.Module:
    """The run's model holding the received weights (this process's reused model object:
    a method that keeps a model beyond the message must copy it, as Ditto does). ``data``: the
    run's partitioned data when the caller holds it (else looked up again)."""
    if local_data.is_node_mode(cfg):  # the node's own data: shape and classes from the run config
        shape, classes = input_spec(cfg)
    else:
        data = data if data is not None else load_federated_data(cfg)
        shape, classes = data.input_shape, data.num_classes
    dev = device()
    key = (cfg.model, tuple(shape), classes, str(dev), batch_delivery.model_slot())
    held = _MODELS.get(key)
    if held is None:
        model = build_model(cfg.model, shape, classes).to(dev)
        for old in [k for k in _MODELS if k[:4] != key[:4]]:  # a new run drops the old run's models
            del _MODELS[old]
        held = _MODELS[key] = _Held.of(model)  # one per thread, or per message of a batch (model_slot)
        _STATES[model] = held.state
    _load_state(held.state, arrays)
    for p in held.params:  # model.zero_grad(set_to_none=True)
        p.grad = None
    return held.model


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()``'s names and tensors (the parameter objects themselves for a model of
    :func:`model_for`'s: read them detached)."""
    state = _STATES.get(model)
    return state if state is not None else model.state_dict()


@torch.no_grad()
def load_arrays(model: torch.nn.Module, arrays: ArrayRecord) -> None:
    """``model.load_state_dict(arrays.to_torch_state_dict(), strict=True)`` with one copy
    per tensor instead of three (the bytes are read in place and copied straight to the
    model's device): a third of a CNN message's client overhead."""
    _load_state(model.state_dict(), arrays)


@torch.no_grad()
def _load_state(state: Mapping[str, torch.Tensor], arrays: ArrayRecord) -> None:
    """:func:`load_arrays` into a model's ``state`` (its ``state_dict()``, or its tensors by name)."""
    if list(state) != list(arrays.keys()):
        raise ValueError(
            f"the received model's keys {list(arrays.keys())[:4]}... do not match the run's model "
            f"{list(state)[:4]}...: the server and the clients must use the same model and dataset"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only view: only read from, never written
        for name, tensor in state.items():
            view = torch.from_numpy(flat.array_view(arrays[name]))
            if view.shape != tensor.shape:
                raise ValueError(f"received {name} of shape {tuple(view.shape)}, the model has {tuple(tensor.shape)}")
            tensor.copy_(view)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Report this node's partition id (the server builds its node → partition map) and, for
    a node with its own data (``data-path`` in its node config), that data's shape, labels,
    sizes and per-channel sums (:func:`client_app.local_data.describe`)."""
    pid = node_partition(context)
    metrics = {keys.PARTITION_ID: pid}
    if local_data.DATA_PATH in context.node_config:
        metrics.update(local_data.describe(context.node_config))
    content = RecordDict({keys.METRICS: MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


def train_reply(msg: Message, context: Context, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                settings: LocalTraining, *, partition_id: int | None = None, seed: int = 0,
                augment=None) -> Message:
    """The reply to a train request of any strategy in ``strategies`` — the client side of
    every method in one call, for this app's ClientApp and for a foreign one alike.

    ``model`` must already hold the received weights (``load_arrays(model, msg.content["arrays"])``);
    it is trained in place with the routine the request names (``client-method``: plain SGD,
    FedProx's proximal pull, SCAFFOLD's control variates, Ditto's personal model, FedeRage's
    CVaR steps and β), with the method's values from the request's config record (μ, λ, α, ...)
    and the node's ``context.state`` for what a client keeps between rounds. ``settings`` are the
    local-training values (epochs, batch size, momentum, weight decay); the learning rate is the
    request's ``round-lr``. Batch order is seeded by (``seed``, partition, round); ``augment(batch,
    generator)`` (e.g. :class:`client_app.data.CropFlip`) augments each training batch. A request
    config holding ``attack-label-map`` (written by :func:`client_app.attacks.attack_mod` for
    a label-flip attacker, never by the server) makes it train on ``label_map[y]``. A foreign
    ClientApp::

        @app.train()
        def train(msg, context):
            net = Net()
            load_arrays(net, msg.content["arrays"])
            x, y = my_local_data(context)
            return train_reply(msg, context, net, x, y, LocalTraining(local_epochs=1, batch_size=32),
                               partition_id=context.node_config["partition-id"])
    """
    call = prepare_train(msg, context, model, x, y, settings, partition_id=partition_id, seed=seed, augment=augment)
    # the routine, or this client's rows with the round's other clients (client-execution)
    return reply_to_train(call, batch_delivery.train(call.method, call.job, batch_delivery.execution_mode(settings)))


@dataclasses.dataclass
class TrainCall:
    """A train request up to its training step (:func:`prepare_train`): the job, its routine,
    and what its reply needs after (:func:`reply_to_train`)."""

    msg: Message
    method: ClientMethod
    job: TrainJob
    loss_before: float | None


def prepare_train(msg: Message, context: Context, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                  settings: LocalTraining, *, partition_id: int | None = None, seed: int = 0,
                  augment=None) -> TrainCall:
    """:func:`train_reply` up to the training step (same arguments): the request read, the seeds
    set, ``loss-before`` scored, the job built."""
    config = dict(msg.content[keys.CONFIG])
    pid = partition_id if partition_id is not None else node_partition(context, config)
    server_round = int(config[keys.SERVER_ROUND])
    if keys.ATTACK_LABEL_MAP in config:  # a label-flip attacker (client_app.attacks) trains on label_map[y]
        y = torch.as_tensor(config[keys.ATTACK_LABEL_MAP], dtype=y.dtype, device=y.device)[y]
    train_seed = derive_seed(seed, "client-train", pid, server_round)
    seed_torch(train_seed)
    # F_i(θ_t): one forward pass over the train split, only for methods that use it.
    want_before = bool(config.get(keys.WANT_LOSS_BEFORE, True))
    loss_before = evaluate(model, x, y, settings.eval_batch_size)[1] if want_before else None
    method = get_client_method(str(config.get(keys.CLIENT_METHOD, keys.SGD)))
    job = TrainJob(
        cfg=settings, server_round=server_round, partition_id=pid,
        lr=float(config[keys.ROUND_LR]), model=model, global_arrays=msg.content[keys.ARRAYS],
        x=x, y=y, generator=torch_generator(seed, "batches", pid, server_round),
        request=msg.content, state=PartitionState(context.state, pid), config=config, augment=augment,
        train_seed=train_seed,
    )
    return TrainCall(msg=msg, method=method, job=job, loss_before=loss_before)


def reply_to_train(call: TrainCall, outcome: TrainOutcome) -> Message:
    """The train reply of a prepared request (:func:`prepare_train`) once its job trained:
    the model's weights, the metrics, the method's records."""
    job = call.job
    metrics = {
        keys.NUM_EXAMPLES: int(len(job.y)),
        keys.TRAIN_LOSS: float(outcome.train_loss),
        keys.PARTITION_ID: job.partition_id,
        keys.NUM_STEPS: int(outcome.num_steps),
    }
    if call.loss_before is not None:
        metrics[keys.LOSS_BEFORE] = float(call.loss_before)
    metrics.update({k: _scalar(v) for k, v in outcome.metrics.items()})
    content = RecordDict({keys.ARRAYS: flat.state_to_record(state_of(job.model)),
                          keys.METRICS: MetricRecord(metrics), **outcome.records})
    return Message(content=content, reply_to=call.msg)


def evaluate_reply(msg: Message, context: Context, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   settings: LocalTraining, *, partition_id: int | None = None, seed: int = 0,
                   validation: tuple[torch.Tensor, torch.Tensor] | None = None) -> Message:
    """The reply to an evaluate request: accuracy and loss of the received model (a
    personalised method's own model, e.g. Ditto's) on (x, y), and on the ``validation``
    split (``val-accuracy``, ``val-loss``) when one is given. ``model`` holds the received
    weights. For this app's ClientApp and for a foreign one (see :func:`train_reply`)."""
    config = dict(msg.content[keys.CONFIG])
    pid = partition_id if partition_id is not None else node_partition(context, config)
    method = get_client_method(str(config.get(keys.CLIENT_METHOD, keys.SGD)))
    if method.eval_model is not None:
        job = TrainJob(
            cfg=settings, server_round=int(config[keys.SERVER_ROUND]), partition_id=pid,
            lr=float(config[keys.ROUND_LR]), model=model, global_arrays=msg.content[keys.ARRAYS],
            x=x, y=y, generator=torch_generator(seed, "eval", pid), request=msg.content,
            state=PartitionState(context.state, pid), config=config,
        )
        model = method.eval_model(job)
    acc, loss = evaluate(model, x, y, settings.eval_batch_size)
    metrics = {keys.EVAL_ACC: acc, keys.EVAL_LOSS: loss, keys.NUM_TEST: int(len(y)), keys.PARTITION_ID: pid}
    if validation is not None:
        metrics[keys.VAL_ACC], metrics[keys.VAL_LOSS] = evaluate(model, *validation, settings.eval_batch_size)
    return Message(content=RecordDict({keys.METRICS: MetricRecord(metrics)}), reply_to=msg)


# SecAgg+ when the request asks for it (else a no-op) around the run's attack, if any: an
# attacked reply is masked like an honest one.
@app.train(mods=[secure_aggregation_mod, attack_mod])
def train(msg: Message, context: Context) -> Message:
    call = stage_train(msg, context)
    mode = batch_delivery.execution_mode(call.job.cfg)
    return reply_to_train(call, batch_delivery.train(call.method, call.job, mode))


def stage_train(msg: Message, context: Context) -> TrainCall:
    """This ClientApp's train handler up to the training step: the request's partition, data and
    model (holding the received weights), then :func:`prepare_train`."""
    cfg, config = request_config(msg, context)
    pid = served_partition(context, config, cfg)
    data = None
    if local_data.is_node_mode(cfg):  # the node's own folder, whole
        own = local_data.load_node_data(local_data.data_path(context.node_config), cfg, pid)
        x, y, augment = own.x_train, own.y_train, CropFlip(own.fill) if cfg.augment == "crop-flip" else None
    else:
        data = load_federated_data(cfg)
        x, y = data.client_train(pid)
        augment = batch_augmentation(cfg, data)
    # Pin torch's global RNG so that nothing depends on what ran before in this process
    # (model construction draws from it; the batch order has its own generator).
    seed_torch(derive_seed(cfg.seed, "client-init", pid, int(config[keys.SERVER_ROUND])))
    model = model_for(cfg, msg.content[keys.ARRAYS], data)
    return prepare_train(msg, context, model, x, y, cfg, partition_id=pid, seed=cfg.seed, augment=augment)


def passes_mods(msg: Message, context: Context) -> bool:
    """Whether the train handler's mods leave this request and its reply as they are (no SecAgg+,
    no attack on its partition): the local engine may then run :func:`stage_train`, the batch's
    training and :func:`reply_to_train` itself (:mod:`client_app.batch_delivery`)."""
    return not secagg_requested(msg) and attack_passes_through(msg, context)


batch_delivery.register_phases(app, stage=stage_train, finish=reply_to_train, plain=passes_mods)


@app.evaluate(mods=[attack_eval_mod])  # eval-lie (client_app.attacks); else a pass-through
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Score the received global model (or this client's personal model) on the local test split
    (and on the local validation split, when the run has one: ``val-fraction`` > 0)."""
    cfg, config = request_config(msg, context)
    pid = served_partition(context, config, cfg)
    data = None
    if local_data.is_node_mode(cfg):  # the node's own test.parquet
        own = local_data.load_node_data(local_data.data_path(context.node_config), cfg, pid)
        x, y = own.x_test, own.y_test
        validation = (own.x_val, own.y_val) if own.has_validation else None
    else:
        data = load_federated_data(cfg)
        x, y = data.client_test(pid)
        validation = data.client_val(pid) if data.has_validation else None
    model = model_for(cfg, msg.content[keys.ARRAYS], data)
    return evaluate_reply(msg, context, model, x, y, cfg, partition_id=pid, seed=cfg.seed, validation=validation)


def _scalar(v):
    if isinstance(v, (list, tuple)):
        return [float(t) for t in v]
    if isinstance(v, bool):
        return int(v)
    return int(v) if isinstance(v, int) else float(v)

