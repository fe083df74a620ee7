"""FedProx from a quickstart-style ClientApp: the quickstart's own loop with one line added,
``side.before_step()`` between ``loss.backward()`` and ``optimizer.step()``, which adds the
proximal term's gradient μ(w − θ_t) (μ: the request's ``fedprox-mu``). Without it nothing is
dropped: the run is FedAvg under FedProx's name.

    python -m examples.client_fedprox
"""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import FedProx

NAME = "fedprox"
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model)  # piece: θ_t and μ from the request
    optimizer = torch.optim.SGD(model.parameters(), lr=side.lr)
    criterion = torch.nn.CrossEntropyLoss()
    running = 0.0
    for _ in range(EPOCHS):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            side.before_step()  # piece: + μ(w − θ_t)
            optimizer.step()
            running += loss.item()
    metrics = {"train_loss": running / (EPOCHS * len(trainloader)), "num-examples": len(trainloader.dataset)}
    # the quickstart's own reply: FedProx reads nothing beyond it
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


STRATEGIES = {NAME: lambda: FedProx(fraction_train=0.5, mu=0.1, seed=0)}
server = server_app(NAME, STRATEGIES[NAME])

if __name__ == "__main__":
    simulate(NAME, server, client)
