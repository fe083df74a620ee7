"""A Flower app that is not this project's: quickstart-style ServerApp and ClientApp that use
the strategies (``strategies``) and the documented client helpers (``client_app.client_app``)
and nothing of ``fedpcd_app``. Data: scikit-learn's digits, split IID over the nodes.

    python -m examples.foreign_app fedpcd      # runs it in Flower's simulation (3 rounds)
    python examples/foreign_app.py craft       # the same from any folder (an installed wheel)
"""

import sys

import torch
from flwr.app import ArrayRecord, Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from sklearn.datasets import load_digits

from client_app.client_app import evaluate_reply, load_arrays, train_reply
from client_app.methods import LocalTraining
from strategies import Craft, FedeRage, FedPCD

STRATEGIES = {
    "fedpcd": lambda: FedPCD(fraction_train=0.5, tau=0.05, history=5, seed=0),
    "craft": lambda: Craft(fraction_train=0.5, step=0.5, model=net(), seed=0),
    "federage": lambda: FedeRage(fraction_train=0.5, alpha=0.3, gamma=0.3, seed=0),
}
RESULTS = {}
CHOSEN = {"strategy": "fedpcd"}  # python -m examples.foreign_app METHOD sets it


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    name = str(context.run_config.get("strategy", CHOSEN["strategy"]))
    strategy = STRATEGIES[name]()
    RESULTS[name] = strategy.start(grid=grid, initial_arrays=ArrayRecord(net().state_dict()), num_rounds=3)


client = ClientApp()
SETTINGS = LocalTraining(local_epochs=2, batch_size=16)


def local_data(context: Context, split: str):
    x, y = load_digits(return_X_y=True)
    pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[pid::n]
    cut = int(0.8 * len(idx))
    idx = idx[:cut] if split == "train" else idx[cut:]
    return torch.tensor(x / 16.0, dtype=torch.float32)[idx], torch.tensor(y)[idx]


def received(msg, context: Context, split: str):
    model = net()
    load_arrays(model, msg.content["arrays"])
    return (model, *local_data(context, split))


@client.train()
def train(msg, context: Context):
    return train_reply(msg, context, *received(msg, context, "train"), SETTINGS)


@client.evaluate()
def evaluate(msg, context: Context):
    return evaluate_reply(msg, context, *received(msg, context, "test"), SETTINGS)


if __name__ == "__main__":
    from flwr.simulation import run_simulation

    if len(sys.argv) != 2 or sys.argv[1] not in STRATEGIES:
        sys.exit(f"usage: python -m examples.foreign_app METHOD (METHOD: {', '.join(STRATEGIES)})")
    CHOSEN["strategy"] = sys.argv[1]
    run_simulation(server_app=server, client_app=client, num_supernodes=6,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    result = RESULTS[sys.argv[1]]
    print(f"{sys.argv[1]}: {len(result.arrays)} final arrays, federated accuracy by round "
          f"{[round(float(m['accuracy']), 3) for _, m in sorted(result.evaluate_metrics_clientapp.items())]}")
