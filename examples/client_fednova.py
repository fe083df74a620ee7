"""FedNova from a quickstart-style ClientApp: the quickstart's own loop, with the step count
``num-steps`` (FedNova's a_i) counted by ``side.before_step()`` and sent by ``side.reply``.
Without it every reply lacks ``num-steps`` and is dropped.

    python -m examples.client_fednova
"""

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import FedNova

NAME = "fednova"
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model)  # piece
    optimizer = torch.optim.SGD(model.parameters(), lr=side.lr)
    criterion = torch.nn.CrossEntropyLoss()
    running = 0.0
    for _ in range(EPOCHS):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            side.before_step()  # piece: counts the step
            optimizer.step()
            running += loss.item()
    metrics = {"train_loss": running / (EPOCHS * len(trainloader)), "num-examples": len(trainloader.dataset)}
    return side.reply(metrics)  # piece: + num-steps


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


STRATEGIES = {NAME: lambda: FedNova(fraction_train=0.5, seed=0)}
server = server_app(NAME, STRATEGIES[NAME])

if __name__ == "__main__":
    simulate(NAME, server, client)
