"""A federation of strangers: quickstart-style ClientApps on an in-process grid whose nodes come
and go, for driving any exported strategy through Flower's own entry points.

:func:`quickstart_app` answers as Flower's ``quickstart-pytorch`` ClientApp does — it loads
``msg.content["arrays"]``, trains a small model on its own data with the ``lr`` of the request's
config, and replies with the model and Flower's metric names (``train_loss``, ``num-examples``;
``eval_loss``, ``eval_acc``, ``num-examples``) and nothing method-specific. ``fail`` names the
partitions whose handler raises. A ``prepare(msg, context)`` hook and a ``finish(msg, reply,
context)`` hook let a test add a method's documented client piece.

:class:`ChangingGrid` is the project's in-process :class:`~fedpcd_app.runtime.grid.LocalGrid`
(one persistent Context per node, a handler that raises yields an error reply) whose set of
connected nodes changes: ``join`` maps a partition to the number of ``get_node_ids`` calls
before it appears (late nodes), ``leave`` maps a partition to the server round from which it
is gone (a message to it then gets Flower's "node unavailable" error reply).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedpcd_app.runtime.grid import LocalGrid
from tests.fakegrid import task_identity

__all__ = ["ChangingGrid", "net", "quickstart_app", "run_start", "task_identity"]

_DIGITS: tuple[torch.Tensor, torch.Tensor] | None = None


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled digits as float tensors (loaded once)."""
    global _DIGITS
    if _DIGITS is None:
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        _DIGITS = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    return _DIGITS


def net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def node_data(pid: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partition ``pid``'s own (train x, train y, test x, test y): a random size in 8 … 60."""
    x, y = digits()
    rng = np.random.default_rng([seed, pid])
    size = int(rng.integers(8, 61))
    idx = torch.from_numpy(rng.choice(len(y), size=size, replace=False))
    cut = max(1, int(0.75 * size))
    return x[idx[:cut]], y[idx[:cut]], x[idx[cut:]], y[idx[cut:]]


def quickstart_app(fail: frozenset[int] = frozenset(), prepare=None, finish=None, epochs: int = 1) -> ClientApp:
    """Flower's quickstart-pytorch ClientApp, on digits (see the module docstring)."""
    app = ClientApp()

    def model_of(msg: Message) -> torch.nn.Module:
        model = net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return model

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        if pid in fail:
            raise RuntimeError(f"client {pid} failed while training")
        model = model_of(msg)
        x, y, _, _ = node_data(pid)
        if prepare is not None:
            prepare(msg, context, model, x, y)
        lr = float(msg.content["config"].get("lr", 0.1))
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        running = 0.0
        for _ in range(epochs):
            for xb, yb in zip(x.split(16), y.split(16)):
                opt.zero_grad()
                loss = loss_fn(model(xb), yb)
                loss.backward()
                opt.step()
                running += loss.item()
        metrics = {"train_loss": running / max(1, epochs * len(x.split(16))), "num-examples": len(x)}
        reply = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}),
                        reply_to=msg)
        return finish(msg, reply, context, model, x, y) if finish is not None else reply

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        model = model_of(msg)
        _, _, x, y = node_data(int(context.node_config["partition-id"]))
        with torch.no_grad():
            out = model(x)
            loss = float(torch.nn.functional.cross_entropy(out, y))
            acc = float((out.argmax(1) == y).float().mean())
        metrics = {"eval_loss": loss, "eval_acc": acc, "num-examples": len(x)}
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


class ChangingGrid(LocalGrid):
    """LocalGrid whose connected nodes change (see the module docstring)."""

    def __init__(self, client_app: ClientApp, num_nodes: int, join: dict[int, int] | None = None,
                 leave: dict[int, int] | None = None) -> None:
        super().__init__(client_app, num_nodes, workers=0)
        self.pid_of = {node: int(ctx.node_config["partition-id"]) for node, ctx in self.contexts.items()}
        self.join, self.leave = dict(join or {}), dict(leave or {})
        self.calls = 0
        self.gone: dict[int, Context] = {}
        self.server_round = 0
        self.requests: list[Message] = []
        self.pushed_at: list[int] = []

    def present(self) -> list[int]:
        return [n for n, p in self.pid_of.items() if n in self.contexts and self.join.get(p, 0) <= self.calls]

    def get_node_ids(self):
        self.calls += 1
        return self.present()

    def push_messages(self, messages):
        messages = list(messages)
        rounds = [int(m.metadata.group_id) for m in messages if m.metadata.group_id.isdigit()]
        if rounds:
            self.server_round = max(rounds)
            for node, pid in self.pid_of.items():
                if node in self.contexts and self.leave.get(pid, 10**9) <= self.server_round:
                    self.gone[node] = self.contexts.pop(node)
        self.requests += messages
        self.pushed_at += [self.calls] * len(messages)  # how many looks at the nodes came before each
        return super().push_messages(messages)


def run_start(strategy, grid, num_rounds: int = 3, **kwargs):
    """``strategy.start`` as a foreign ServerApp calls it (quickstart's train config ``lr``)."""
    from flwr.app import ConfigRecord

    with task_identity():
        return strategy.start(grid=grid, initial_arrays=ArrayRecord(net().state_dict()), num_rounds=num_rounds,
                              train_config=ConfigRecord({"lr": 0.1}), **kwargs)
