"""Building Flower messages in tests (as Flower's own strategy tests do, no running app)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.app.error import Error
from flwr.app.metadata import Metadata

from fedcore import keys


class SimulatedCtrlC(KeyboardInterrupt):
    """A Ctrl-C a test raises on purpose (inside a grid or a client) and catches: a real one (a
    plain KeyboardInterrupt, or the app's RunInterrupted) is not caught, so it stops the suite."""

def _metadata(src_node_id: int, message_type: str = MessageType.TRAIN) -> Metadata:
    return Metadata(
        run_id=1, message_id=f"m{src_node_id}", src_node_id=src_node_id, dst_node_id=0,
        reply_to_message_id="", group_id="", created_at=time.time(), ttl=3600.0,
        message_type=message_type,
    )


def make_reply(content: RecordDict, src_node_id: int, message_type: str = MessageType.TRAIN) -> Message:
    """A reply as the server receives it from node ``src_node_id``."""
    return Message(content, metadata=_metadata(src_node_id, message_type))


def make_error_reply(src_node_id: int, reason: str = "client crashed") -> Message:
    return Message(Error(code=1, reason=reason), metadata=_metadata(src_node_id))


def arrays_from_flat(flat: np.ndarray | torch.Tensor, template: ArrayRecord) -> ArrayRecord:
    """An ArrayRecord shaped like ``template`` holding the values of ``flat``."""
    flat = np.asarray(flat, dtype=np.float32)
    out, start = {}, 0
    for key, arr in template.items():
        n = int(np.prod(arr.shape))
        out[key] = Array(flat[start : start + n].reshape(arr.shape).copy())
        start += n
    return ArrayRecord(out)


def train_reply(
    arrays: ArrayRecord,
    partition_id: int,
    *,
    node_id: int | None = None,
    num_examples: int = 10,
    train_loss: float = 1.0,
    loss_before: float = 1.0,
    num_steps: int = 1,
    extra_metrics: dict | None = None,
    extra_records: dict | None = None,
) -> Message:
    """A well-formed train reply (the node id defaults to 1000 + partition id)."""
    metrics = {
        keys.NUM_EXAMPLES: num_examples, keys.TRAIN_LOSS: train_loss,
        keys.LOSS_BEFORE: loss_before, keys.PARTITION_ID: partition_id, keys.NUM_STEPS: num_steps,
        **(extra_metrics or {}),
    }
    content = RecordDict({keys.ARRAYS: arrays, keys.METRICS: MetricRecord(metrics), **(extra_records or {})})
    return make_reply(content, node_id if node_id is not None else 1000 + partition_id)


def tiny_template(sizes=((3, 2), (2,))) -> ArrayRecord:
    """A small two-array 'model' for adapter tests."""
    return ArrayRecord({f"w{i}": Array(np.zeros(s, dtype=np.float32)) for i, s in enumerate(sizes)})


# -- driving a strategy on built replies (no grid, no app loop) -------------------------------
def flat64(arrays: ArrayRecord) -> np.ndarray:
    """The model as one float64 vector."""
    return np.concatenate([a.numpy().ravel().astype(np.float64) for a in arrays.values()])


def make_replies(template: ArrayRecord, locals_, pids=None, *, n=None, loss_before=None, train_loss=None,
                 steps=None, extra_metrics=None) -> list[Message]:
    """Train replies carrying the flat local models ``locals_`` (client i: partition ``pids[i]``,
    default i; ``n`` examples, default 10; ``loss_before``/``train_loss`` default 1; ``steps`` 1;
    ``extra_metrics`` one dict per reply, default none)."""
    m = len(locals_)
    pids = list(range(m)) if pids is None else pids
    n, steps = n or [10] * m, steps or [1] * m
    loss_before, train_loss = loss_before or [1.0] * m, train_loss or [1.0] * m
    extra_metrics = extra_metrics or [None] * m
    return [
        train_reply(arrays_from_flat(x, template), pid, num_examples=k, loss_before=lb, train_loss=tl, num_steps=s,
                    extra_metrics=e)
        for x, pid, k, lb, tl, s, e in zip(locals_, pids, n, loss_before, train_loss, steps, extra_metrics)
    ]


def noisy_locals(template: ArrayRecord, clients: int = 3, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """θ ~ N(0, I) of the template's size and ``clients`` local models θ + N(0, I), drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=sum(int(np.prod(a.shape)) for a in template.values()))
    return theta, [theta + rng.normal(size=theta.size) for _ in range(clients)]


def aggregate_round(strategy, server_round: int, theta, template: ArrayRecord, replies: list[Message]):
    """One aggregation as ``configure_train`` + ``aggregate_train`` do it: θ_t handed over, the
    replies' nodes expected with their partitions. Returns (the new model as float64, metrics)."""
    strategy.set_model(arrays_from_flat(theta, template))
    strategy.expected = {int(r.metadata.src_node_id): int(r.content[keys.METRICS][keys.PARTITION_ID])
                         for r in replies}
    arrays, metrics = strategy.aggregate_train(server_round, replies)
    return flat64(arrays), dict(metrics or {})


def tree_through_bytes(tree):
    """A ``fedcore.state.to_tree`` tree written by torch.save and read back with
    ``weights_only=True`` (as a checkpoint is), then rebuilt by ``from_tree``."""
    import io

    from fedcore.state import from_tree

    buf = io.BytesIO()
    torch.save(tree, buf)
    buf.seek(0)
    return from_tree(torch.load(buf, weights_only=True))


def check_resume(make_strategy, template: ArrayRecord, theta0, replies_at, rounds: int = 4, cut: int = 2,
                 atol: float = 0.0) -> None:
    """A run whose strategy is rebuilt after round ``cut`` from its checkpointed ``state``
    (``to_tree`` → torch.save/load → ``from_tree``) gives the uninterrupted run's models, round
    by round, and evaluates the same model. ``replies_at(r, theta)``: round r's replies."""
    from fedcore.state import to_tree

    full = make_strategy()
    theta, outs = theta0, []
    for r in range(1, rounds + 1):
        theta, _ = aggregate_round(full, r, theta, template, replies_at(r, theta))
        outs.append(theta)
    first = make_strategy()
    theta = theta0
    for r in range(1, cut + 1):
        theta, _ = aggregate_round(first, r, theta, template, replies_at(r, theta))
    tree = to_tree(first.state)
    aggregate_round(first, cut + 1, theta, template, replies_at(cut + 1, theta + 5.0))  # must not leak into tree
    resumed = make_strategy()
    resumed.state = tree_through_bytes(tree)
    for r in range(cut + 1, rounds + 1):
        theta, _ = aggregate_round(resumed, r, theta, template, replies_at(r, theta))
        np.testing.assert_allclose(theta, outs[r - 1], rtol=0, atol=atol, err_msg=f"round {r}")
    final = arrays_from_flat(theta, template)
    np.testing.assert_allclose(flat64(resumed.evaluation_arrays(final)), flat64(full.evaluation_arrays(final)),
                               rtol=0, atol=atol)


def brute_force_projection(v, total: float = 1.0) -> np.ndarray:
    """argmin ‖x − v‖ over {x ≥ 0, Σx = total} by cvxpy (an independent solver)."""
    import cvxpy as cp

    x = cp.Variable(v.size)
    cp.Problem(cp.Minimize(cp.sum_squares(x - v)), [x >= 0, cp.sum(x) == total]).solve(solver=cp.CLARABEL)
    return np.asarray(x.value)


def random_rounds(template: ArrayRecord, *, clients: int = 4, per_round: int = 2, rounds: int = 4,
                  scale: float = 1.0, seed: int = 1):
    """(θ_0, replies_at) for :func:`check_resume`: per round ``per_round`` of ``clients``
    sampled, their models θ_t + ``scale``·N(0, 1), their losses uniform in [0.1, 3], all drawn
    up front from ``seed``."""
    rng = np.random.default_rng(seed)
    d = sum(int(np.prod(a.shape)) for a in template.values())
    theta0 = rng.normal(size=d)
    plan = []
    for _ in range(rounds):
        pids = sorted(rng.choice(clients, size=per_round, replace=False).tolist())
        plan.append((pids, [scale * rng.normal(size=d) for _ in pids], rng.uniform(0.1, 3.0, size=per_round).tolist()))

    def replies_at(server_round: int, theta) -> list[Message]:
        pids, offsets, losses = plan[server_round - 1]
        return make_replies(template, [theta + o for o in offsets], pids, loss_before=losses)

    return theta0, replies_at


def _hand_over(strategy, arrays: ArrayRecord, replies: list[Message]) -> None:
    """What ``configure_train`` leaves for the aggregation: θ_t, and each replying node expected
    with the partition it reports (node id − 1000 if none)."""
    strategy.set_model(arrays)
    expected = {}
    for r in replies:
        node = int(r.metadata.src_node_id)
        pid = (None if r.has_error()
               else r.content[keys.METRICS].get(keys.PARTITION_ID) if keys.METRICS in r.content else None)
        expected[node] = int(pid) if pid is not None else node - 1000
    strategy.expected = expected


def aggregate_arrays(strategy, server_round: int, arrays: ArrayRecord, replies: list[Message]):
    """What ``configure_train`` + the round loop do around a strategy's aggregation: θ_t in,
    each replying node expected with the partition it reports (node id − 1000 if none),
    then ``aggregate_train`` (validation included). Returns its (arrays, metrics); replies may be
    malformed (:func:`aggregate_round` is the float64 form for well-formed ones)."""
    _hand_over(strategy, arrays, replies)
    arrays, metrics = strategy.aggregate_train(server_round, replies)
    return arrays, dict(metrics or {})


def round_outcome(strategy, server_round: int, arrays: ArrayRecord, replies: list[Message], context=None):
    """As :func:`aggregate_arrays`, the whole round returned: ``strategy.train_outcome`` (a
    :class:`strategies.rounds.RoundOutcome`: valid, dropped, defence, arrays, metrics)."""
    _hand_over(strategy, arrays, replies)
    return strategy.train_outcome(server_round, replies, context)


def aggregate_clients(strategy, server_round: int, theta: np.ndarray, template: ArrayRecord, clients):
    """One aggregation from θ_t (a flat vector) with ``clients`` = [(pid, local model, loss_before,
    train_loss, num_examples)]. Returns (θ_{t+1} as float64, metrics dict)."""
    replies = [train_reply(arrays_from_flat(x, template), pid, loss_before=lb, train_loss=tl, num_examples=n)
               for pid, x, lb, tl, n in clients]
    arrays, metrics = aggregate_arrays(strategy, server_round, arrays_from_flat(theta, template), replies)
    return flat64(arrays), dict(metrics or {})


def perturbed_replies(template: ArrayRecord, rng: np.random.Generator, num_examples=(10, 30, 60, 20),
                      scale: float = 0.01):
    """Train replies of clients 0..m−1 whose local models are θ + scale·N(0, I) (θ = ``template``),
    and those local models as sent ((m, d) float64 of the float32 values)."""
    theta = flat64(template)
    locals_ = [theta + scale * rng.normal(size=theta.size) for _ in num_examples]
    msgs = [train_reply(arrays_from_flat(x, template), pid, num_examples=k)
            for pid, (x, k) in enumerate(zip(locals_, num_examples))]
    return msgs, np.stack(locals_).astype(np.float32).astype(np.float64)


def play_rounds(strategy, plan, theta: np.ndarray, template: ArrayRecord, start: int = 1) -> list[np.ndarray]:
    """Aggregate the rounds of ``plan`` from round ``start`` on, each round a list of clients
    ``(pid, offset, loss_before, train_loss, num_examples)`` whose local model is
    θ_t + 0.1·offset. Returns θ after each round (float64)."""
    out = []
    for r, clients in enumerate(plan, start=start):
        theta, _ = aggregate_clients(strategy, r, theta, template,
                                     [(pid, theta + 0.1 * x, lb, tl, n) for pid, x, lb, tl, n in clients])
        out.append(theta)
    return out


def random_plan(d: int, rounds: int, seed: int = 0) -> list[list[tuple]]:
    """Rounds of (pid, offset, loss_before, train_loss, num_examples) with varying participation."""
    rng = np.random.default_rng(seed)
    sets = [[0, 1, 2], [3, 4, 1], [0, 2, 5], [4, 5, 3], [1, 0, 3]][:rounds]
    return [[(pid, rng.normal(size=d), float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.5, 2.0)),
              int(rng.integers(5, 30))) for pid in s] for s in sets]


def check_resume_equals_uninterrupted(make_strategy, rounds: int = 4, cut: int = 2, atol: float = 1e-6) -> None:
    """A strategy whose State went through a checkpoint after round ``cut`` (into a fresh
    strategy) continues exactly as the uninterrupted one (tiny model, random rounds)."""
    template = tiny_template()
    d = sum(int(np.prod(a.shape)) for a in template.values())
    plan = random_plan(d, rounds)
    theta0 = np.random.default_rng(1).normal(size=d)
    full = play_rounds(make_strategy(), plan, theta0, template)
    first = make_strategy()
    theta = play_rounds(first, plan[:cut], theta0, template)[-1]
    resumed = make_strategy()
    resumed.state = state_through_bytes(first.state)
    for got, want in zip(play_rounds(resumed, plan[cut:], theta, template, start=cut + 1), full[cut:]):
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def state_through_bytes(state):
    """A strategy State saved and loaded as a checkpoint does it: ``fedcore.state.to_tree``,
    ``torch.save``, ``torch.load(weights_only=True)``, ``from_tree``."""
    from fedcore.state import to_tree

    return tree_through_bytes(to_tree(state))


def build_strategy(method: str, **overrides):
    """``registry.build`` from run-config overrides (keys as in pyproject.toml)."""
    from fedcore.config import load_config
    from strategies import registry

    return registry.build(load_config({"method": method, **overrides}))


def toy_problem(seed: int = 0, n: int = 40):
    """A 5-feature, 3-class linear model and its data (client routine tests)."""
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(seed)
    return nn.Linear(5, 3), x, y


def make_job(cfg, model, x, y, *, config=None, request=None, state=None, seed=0):
    """A TrainJob as the ClientApp builds it (model already holding the global weights);
    ``config`` is the request's config dict (what the strategy sent)."""
    from client_app.methods import TrainJob

    global_arrays = ArrayRecord(model.state_dict())
    return TrainJob(
        cfg=cfg, server_round=1, partition_id=0, lr=cfg.lr, model=model, global_arrays=global_arrays,
        x=x, y=y, generator=torch.Generator().manual_seed(seed),
        request=request if request is not None else RecordDict({keys.ARRAYS: global_arrays}),
        state=state if state is not None else RecordDict(), config=config or {},
    )


def app_request(cfg, arrays: ArrayRecord, message_type: str = MessageType.TRAIN, *, server_round: int = 1,
                client_method: str = "sgd", **round_values) -> Message:
    """A request as this app's server sends it and a node receives it: the model and the
    ``config`` record of per-round values (call inside ``task_identity()``); the run config is the
    node's (:func:`app_context`)."""
    from flwr.app import ConfigRecord

    conf = {keys.SERVER_ROUND: server_round, keys.ROUND_LR: cfg.lr_at(server_round),
            keys.CLIENT_METHOD: client_method, **round_values}
    return make_reply(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: ConfigRecord(conf)}), 0,
                      message_type=message_type)


def app_context(cfg, partition_id: int, *, node_id: int = 1, state: RecordDict | None = None, **node_config):
    """A node's Context as the run gives it: ``cfg``'s run config (``context.run_config``), the
    partition in its node config, its persistent ``state``."""
    from flwr.app import Context

    return Context(run_id=1, node_id=node_id, node_config={keys.PARTITION_ID: partition_id, **node_config},
                   state=state if state is not None else RecordDict(), run_config=cfg.as_dict())


# -- finished run folders (report, figures, robustness tables) --------------------------------
def make_run(out: Path, setting: str, method: str, seed: int, client_acc: list[float], *,
             grid: dict | None = None, registered: str | None = None, curve: dict[int, float] | None = None,
             strategy: dict[int, dict] | None = None, central: float = 0.5, extra: dict | None = None,
             labels: bool = True, rounds: int = 30, folder: Path | None = None,
             summary: dict | None = None) -> Path:
    """A finished run folder as the sweep and the server write it (run.json, summary.json,
    rounds.jsonl, clients.csv); the final metrics are computed from ``client_acc``.
    ``labels=False`` leaves out run.json, as a run made by ``flwr run`` or ``simulate``;
    ``summary``: more summary.json entries."""
    import json

    from fedcore.config import resolve
    from fedpcd_app.server.metrics import fairness_metrics
    from fedpcd_app.server.results import write_json_atomic

    grid = grid or {}
    variant = ",".join(f"{k}={v}" for k, v in grid.items()) or "base"
    folder = folder or out / setting / method / variant / f"seed{seed}"
    folder.mkdir(parents=True)
    config = resolve({"method": "fedavg", "num-clients": len(client_acc), "num-server-rounds": rounds, "seed": seed,
                      **(extra or {})})
    config["method"] = registered or method  # FedPCD etc. are not on this branch: fake their name only
    config.update(grid)
    metrics = fairness_metrics(client_acc)
    if labels:
        write_json_atomic(folder / "run.json", {"setting": setting, "method": method, "variant": variant,
                                                "grid": grid, "seed": seed, "overrides": {}})
    write_json_atomic(folder / "summary.json", {"method": config["method"], "seed": seed, "rounds": rounds,
                                                **metrics, "central_acc": central, "client_acc": client_acc,
                                                "config": config, **(summary or {})})
    curve = curve or {rounds: metrics["mean_acc"]}
    with open(folder / "rounds.jsonl", "w") as fh:
        for r in range(1, rounds + 1):
            rec = {"round": r, "num_replies": 5}
            if r in curve:  # every client's accuracy, scaled to the curve's mean at that round
                scale = curve[r] / metrics["mean_acc"] if metrics["mean_acc"] else 1.0
                rec["eval"] = {"mean_acc": curve[r], "worst10_acc": curve[r] - 0.1,
                               "client_acc": [min(1.0, a * scale) for a in client_acc]}
            if strategy and r in strategy:
                rec["strategy"] = strategy[r]
            fh.write(json.dumps(rec) + "\n")
    with open(folder / "clients.csv", "w") as fh:
        fh.write("partition_id,num_train,num_test,times_sampled,final_acc,final_loss\n")
        for i, a in enumerate(client_acc):
            fh.write(f"{i},{10 + 3 * i},3,{(i % 3) * 5},{a},0.1\n")
    return folder


def _default_sigint() -> None:
    """``preexec_fn``: restore SIGINT's default action. A shell's background job (``cmd &``,
    nohup, a CI runner) starts with SIGINT ignored, the child inherits that, and Python then
    installs no KeyboardInterrupt handler: the test's Ctrl-C would be ignored and the run go on."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def interruptible(args: list[str], **popen) -> Iterator[subprocess.Popen]:
    """``args`` started as a terminal starts a command that Ctrl-C (:func:`ctrl_c`) interrupts: in
    a session of its own, SIGINT at its default action, stdout and stderr piped as text. On the
    way out of the block it is SIGKILLed (its whole process group) and reaped if still running."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def read_until(stream, pattern: str) -> list[str]:
    """The lines of ``stream`` up to the first that matches ``pattern``; the test fails if none does."""
    seen = []
    for line in stream:
        seen.append(line)
        if re.search(pattern, line):
            return seen
    pytest.fail(f"no line matched {pattern!r} before the stream ended: " + "".join(seen[-30:]))


def ctrl_c(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """SIGINT to ``proc``'s process group (what a terminal's Ctrl-C sends); the rest of its
    (stdout, stderr) once it exits (``timeout`` s at most)."""
    os.killpg(proc.pid, signal.SIGINT)
    return proc.communicate(timeout=timeout)


def run_on_fake_grid(cfg, reply, *, num_nodes: int = 6):
    """A whole ``Experiment`` for ``cfg`` on a :class:`tests.fakegrid.FakeGrid` of ``num_nodes``
    nodes (no Ray). ``reply(request, partition_id, node_id, run)`` returns that node's train
    replies (a list); ``run`` is the Experiment itself, so :func:`tests.fakegrid.honest_reply` can
    shape a reply for its strategy and bounds. Returns the finished Experiment."""
    # imported here: tests.fakegrid imports this module
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import FakeGrid, task_identity

    holder = {}
    with task_identity():
        grid = FakeGrid(num_nodes, lambda request, pid, node: reply(request, pid, node, holder["exp"]))
        exp = holder["exp"] = Experiment(grid, cfg)
        exp.run()
    return exp


# -- runs on the fake grid and their checkpoints ------------------------------------------------
def make_checkpoint(server_round: int, size: int = 10):
    """A FedAvg checkpoint of ``server_round`` (4 clients, a ``size``-long model, a small strategy
    state), its numbers drawn from the round."""
    from fedpcd_app.server import checkpoint

    rng = np.random.default_rng(server_round)
    return checkpoint.Checkpoint(
        round=server_round, method="fedavg", seed=0, num_clients=4,
        arrays={"w": rng.normal(size=(size,)).astype(np.float32)},
        strategy={"beta": 0.5 * server_round, "cache": rng.normal(size=(2, 3))}, params={"fedavg-x": 1},
        times_sampled=np.arange(4), history=[{"round": r} for r in range(1, server_round + 1)],
        last_eval={"mean_acc": 0.25}, config={"method": "fedavg", "seed": 0, "num-clients": 4},
        reply_trust={"norms": [1.0], "losses": {}, "near_bound_rounds": 0},
    )


def fedavg_config(out: Path, **kw):
    """A small FedAvg run into ``out``: 6 clients, half of them a round, 4 rounds, evaluated every
    round, a checkpoint every 2 (``kw``: more run-config keys)."""
    from fedcore.config import load_config

    return load_config({"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4,
                        "eval-every": 1, "checkpoint-every": 2, "figures": "none", "output-dir": str(out), **kw})


def run_honest(cfg, on_train=None):
    """One run of ``cfg`` on a 6-node fake grid of honest clients (client i: 10 + i examples);
    ``on_train(round)`` is called as each train request is answered. Returns the Experiment."""
    # imported here: tests.fakegrid imports this module
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import FakeGrid, honest_reply, task_identity

    holder = {}

    def craft(req, pid, node):
        if on_train is not None:
            on_train(int(req.metadata.group_id) if str(req.metadata.group_id).isdigit() else holder["round"])
        return [honest_reply(req, pid, node, holder["exp"], num_examples=10 + pid)]

    with task_identity():
        exp = holder["exp"] = Experiment(FakeGrid(6, craft), cfg)
        original = exp.train_round

        def train_round(state, server_round):
            holder["round"] = server_round
            return original(state, server_round)

        exp.train_round = train_round
        exp.run()
    return exp


def method_step(strategy, server_round: int, replies):
    """The method's own step on well-formed replies, the gate left out (what a kernel's tests
    drive): the round read from the replies and ``method.aggregate``, whose state the strategy
    keeps. Returns (the Step, the Round); ``step.model`` is θ_{t+1} (a tensor the method may reuse:
    copy it to keep it)."""
    round_ = strategy.read_round(server_round, list(replies), strategy.context)
    step = strategy.method.aggregate(round_, strategy.state)
    strategy.state = step.state
    return step, round_
