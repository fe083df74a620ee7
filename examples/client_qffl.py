"""q-FFL, AFL and TERM (and FedFV, FedLF) from a quickstart-style ClientApp: their servers weight each
client by ``loss-before``, the received model's loss on the client's training data before it
trains. ``ClientSide(..., data=trainloader)`` scores it when the request asks for it, and
``side.reply`` sends it; the training loop is the quickstart's own. Without it every reply
lacks ``loss-before`` and is dropped.

    python -m examples.client_qffl           # q-FFL
    python -m examples.client_qffl afl       # AFL
    python -m examples.client_qffl term      # TERM
"""

import sys

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import AFL, QFFL, TERM

STRATEGIES = {"qffl": lambda: QFFL(fraction_train=0.5, q=1.0, seed=0),
              "afl": lambda: AFL(fraction_train=1.0, seed=0),
              "term": lambda: TERM(fraction_train=0.5, tilt=1.0, seed=0)}
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model, data=trainloader)  # piece: loss-before, before training
    optimizer = torch.optim.SGD(model.parameters(), lr=side.lr)
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
    return side.reply(metrics)  # piece: + loss-before


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


servers = {name: server_app(name, make) for name, make in STRATEGIES.items()}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "qffl"
    if name not in STRATEGIES:
        sys.exit(f"usage: python -m examples.client_qffl [{' | '.join(STRATEGIES)}]")
    simulate(name, servers[name], client)
