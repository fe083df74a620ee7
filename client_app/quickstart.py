"""Flower's quickstart-pytorch pattern, shipped in the wheel for the library's examples
(docs/library.md) and ``examples/client_<method>.py``: a small ``Net`` on data that needs nothing
but torch (a seeded 10-class problem, split over the nodes with uneven sizes), its plain ClientApp
(:data:`plain_client`: FedAvg's client, no method field) and a ServerApp that starts any strategy
with ``strategy.start``. Each ``examples/client_<method>.py`` is this quickstart with the method's
client piece (``client_app.foreign.ClientSide``) added. It imports torch and Flower only.

    python -m examples.client_federage        # Flower's simulation, 6 nodes, 3 rounds
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 20, 10
EPOCHS, BATCH = 1, 16
RESULTS: dict[str, object] = {}  # the last run's Result (what strategy.start returned), by example


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def initial_arrays() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(Net().state_dict())


def load_data(context: Context) -> tuple[DataLoader, DataLoader]:
    """This node's train and test loaders: partition ``partition-id`` of ``num-partitions``
    (uneven sizes), class means fixed by seed 0, 80/20 split."""
    pid, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    means = 2.0 * torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(100 + pid + 1000 * parts)
    n = 60 + 20 * pid
    y = torch.randint(CLASSES, (n,), generator=g)
    x = means[y] + torch.randn(n, FEATURES, generator=g)
    cut = int(0.8 * n)
    train = DataLoader(TensorDataset(x[:cut], y[:cut]), batch_size=BATCH, shuffle=True,
                       generator=torch.Generator().manual_seed(pid))
    return train, DataLoader(TensorDataset(x[cut:], y[cut:]), batch_size=64)


def received(msg: Message) -> Net:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


def test(model: torch.nn.Module, loader: DataLoader) -> tuple[float, float]:
    """(loss, accuracy) on the loader, as the quickstart's ``test``."""
    model.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            loss += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            n += len(y)
    return loss / n, correct / n


def evaluate_reply(msg: Message, model: torch.nn.Module, loader: DataLoader) -> Message:
    loss, acc = test(model, loader)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(loader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


# -- the quickstart's own ClientApp: plain SGD, Flower's metric names, no method field -------------
plain_client = ClientApp()


@plain_client.train()
def plain_train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(msg.content["config"]["round-lr"]))
    criterion = torch.nn.CrossEntropyLoss()
    running = 0.0
    for _ in range(EPOCHS):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            running += loss.item()
    metrics = {"train_loss": running / (EPOCHS * len(trainloader)), "num-examples": len(trainloader.dataset)}
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


@plain_client.evaluate()
def plain_evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


# -- the ServerApp and the simulation ---------------------------------------------------------------
def server_app(name: str, make_strategy: Callable[[], object], rounds: int = 3) -> ServerApp:
    """A ServerApp that starts ``make_strategy()`` for ``rounds`` rounds (RESULTS[name]: its Result)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        RESULTS[name] = make_strategy().start(grid=grid, initial_arrays=initial_arrays(), num_rounds=rounds)

    return app


def simulate(name: str, server: ServerApp, client: ClientApp, nodes: int = 6) -> None:
    """Run the example in Flower's simulation and print its federated accuracy by round."""
    from flwr.simulation import run_simulation

    run_simulation(server_app=server, client_app=client, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    result = RESULTS[name]
    accs = [round(float(m["accuracy"]), 3) for _, m in sorted(result.evaluate_metrics_clientapp.items())]
    print(f"{name}: federated accuracy by round {accs}")
