"""The ClientApp: answers the server's query, train and evaluate messages.

Everything a client needs comes in the request's ConfigRecord (the full resolved run
config plus per-round values), so the same code runs in Flower's simulation, in the
in-process entry point and on real SuperNodes. The client's partition id comes from its
node config (``partition-id``, set by the simulation engine or by
``flower-supernode --node-config "partition-id=3 num-partitions=10"``).
"""

from __future__ import annotations

import threading
import warnings

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.data import load_federated_data
from client_app.methods import TrainJob, get_client_method
from client_app.models import build_model
from client_app.training import device, evaluate
from fedcore import keys
from fedcore.config import RunConfig, parse_run_config
from fedpcd_app.secagg import secure_aggregation_mod
from fedcore.seeding import derive_seed, torch_generator
from fedcore import flat

app = ClientApp()

# Keys the server adds to the run config in each request (not run-config keys).
ROUND_KEYS = (keys.SERVER_ROUND, keys.PARTITION_ID, keys.ROUND_LR, keys.WANT_LOSS_BEFORE, "client-method")


def node_partition(context: Context, config: dict | None = None) -> int:
    """This node's partition id: its node config, else the one the server assigned."""
    if keys.PARTITION_ID in context.node_config:
        return int(context.node_config[keys.PARTITION_ID])
    if config is not None and keys.PARTITION_ID in config:
        return int(config[keys.PARTITION_ID])
    raise ValueError(
        "this SuperNode has no partition id: start it with "
        "--node-config \"partition-id=<i> num-partitions=<n>\""
    )


def request_config(msg: Message) -> tuple[RunConfig, dict]:
    raw = dict(msg.content[keys.CONFIG])
    run_raw = {k: v for k, v in raw.items() if k not in ROUND_KEYS}
    return parse_run_config(run_raw, check_method=False), raw


# One model object per (architecture, input shape, classes, device, thread), reused across
# the messages a process handles: every parameter and buffer is overwritten from the
# received ArrayRecord, so a reused model equals a fresh one (ResNet-18 construction is
# ~80 ms per message on a CPU, the CNN's ~2-6 ms). Training mutates it; the reply is
# copied out of it (``ArrayRecord(model.state_dict())``) before the next message.
_MODELS: dict[tuple, torch.nn.Module] = {}


def model_for(cfg: RunConfig, arrays: ArrayRecord) -> torch.nn.Module:
    """The run's model holding the received weights (this process's reused model object:
    a method that keeps a model beyond the message must copy it, as Ditto does)."""
    data = load_federated_data(cfg)
    dev = device()
    key = (cfg.model, tuple(data.input_shape), data.num_classes, str(dev), threading.get_ident())
    model = _MODELS.get(key)
    if model is None:
        model = build_model(cfg.model, data.input_shape, data.num_classes).to(dev)
        _MODELS.clear()  # one model per process: a new run (or thread) drops the old one
        _MODELS[key] = model
    load_arrays(model, arrays)
    model.zero_grad(set_to_none=True)
    return model


@torch.no_grad()
def load_arrays(model: torch.nn.Module, arrays: ArrayRecord) -> None:
    """``model.load_state_dict(arrays.to_torch_state_dict(), strict=True)`` with one copy
    per tensor instead of three (the bytes are read in place and copied straight to the
    model's device): a third of a CNN message's client overhead."""
    state = model.state_dict()
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
    """Report this node's partition id (the server builds its node → partition map)."""
    pid = node_partition(context)
    content = RecordDict({keys.METRICS: MetricRecord({keys.PARTITION_ID: pid})})
    return Message(content=content, reply_to=msg)


@app.train(mods=[secure_aggregation_mod])  # SecAgg+ when the request asks for it, else a no-op
def train(msg: Message, context: Context) -> Message:
    cfg, raw = request_config(msg)
    pid = node_partition(context, raw)
    server_round = int(raw[keys.SERVER_ROUND])
    data = load_federated_data(cfg)
    x, y = data.client_train(pid)
    global_arrays = msg.content[keys.ARRAYS]
    # Pin torch's global RNG so that nothing depends on what ran before in this process
    # (model construction draws from it; the batch order has its own generator).
    torch.manual_seed(derive_seed(cfg.seed, "client-init", pid, server_round))
    model = model_for(cfg, global_arrays)
    torch.manual_seed(derive_seed(cfg.seed, "client-train", pid, server_round))
    # F_i(θ_t): one forward pass over the train split, only for methods that use it.
    want_before = bool(raw.get(keys.WANT_LOSS_BEFORE, True))
    loss_before = evaluate(model, x, y, cfg.eval_batch_size)[1] if want_before else None
    method = get_client_method(str(raw.get("client-method", "sgd")))
    job = TrainJob(
        cfg=cfg, server_round=server_round, partition_id=pid,
        lr=float(raw.get(keys.ROUND_LR, cfg.lr)), model=model, global_arrays=global_arrays,
        x=x, y=y, generator=torch_generator(cfg.seed, "batches", pid, server_round),
        request=msg.content, state=context.state, config=raw,
    )
    outcome = method.train(job)
    metrics = {
        keys.NUM_EXAMPLES: int(len(y)),
        keys.TRAIN_LOSS: float(outcome.train_loss),
        keys.PARTITION_ID: pid,
        keys.NUM_STEPS: int(outcome.num_steps),
    }
    if loss_before is not None:
        metrics[keys.LOSS_BEFORE] = float(loss_before)
    metrics.update({k: _scalar(v) for k, v in outcome.metrics.items()})
    content = RecordDict(
        {
            keys.ARRAYS: ArrayRecord(model.state_dict()),
            keys.METRICS: MetricRecord(metrics),
            **outcome.records,
        }
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Score the received global model (or this client's personal model) on the local test split."""
    cfg, raw = request_config(msg)
    pid = node_partition(context, raw)
    data = load_federated_data(cfg)
    x, y = data.client_test(pid)
    model = model_for(cfg, msg.content[keys.ARRAYS])
    method = get_client_method(str(raw.get("client-method", "sgd")))
    if method.eval_model is not None:
        job = TrainJob(
            cfg=cfg, server_round=int(raw[keys.SERVER_ROUND]), partition_id=pid,
            lr=float(raw.get(keys.ROUND_LR, cfg.lr)), model=model,
            global_arrays=msg.content[keys.ARRAYS], x=x, y=y,
            generator=torch_generator(cfg.seed, "eval", pid), request=msg.content,
            state=context.state, config=raw,
        )
        model = method.eval_model(job)
    acc, loss = evaluate(model, x, y, cfg.eval_batch_size)
    metrics = {keys.EVAL_ACC: acc, keys.EVAL_LOSS: loss, keys.NUM_TEST: int(len(y)), keys.PARTITION_ID: pid}
    return Message(content=RecordDict({keys.METRICS: MetricRecord(metrics)}), reply_to=msg)


def _scalar(v):
    if isinstance(v, (list, tuple)):
        return [float(t) for t in v]
    if isinstance(v, bool):
        return int(v)
    return int(v) if isinstance(v, int) else float(v)

