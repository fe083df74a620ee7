"""FedFa from a quickstart-style ClientApp: the quickstart's own loop, with the piece from
``client_app.foreign.ClientSide`` (three changed lines, marked ``# piece``): the received model's
accuracy on the training data, scored before training and sent as ``fedfa-accuracy``, and SGD
with FedFa's client momentum γ (the request's ``fedfa-gamma``). Without it every reply lacks
``fedfa-accuracy`` and FedFa drops it.

    python -m examples.client_fedfa
"""

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import FedFa

NAME = "fedfa"
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model, data=trainloader)  # piece: the accuracy, before training
    optimizer = torch.optim.SGD(model.parameters(), lr=side.lr, momentum=side.momentum)  # piece: γ
    for _ in range(EPOCHS):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = side.loss(model(x), y)  # the plain loss, recorded as train-loss
            loss.backward()
            optimizer.step()
    return side.reply({"num-examples": len(trainloader.dataset)})  # piece: + fedfa-accuracy


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


STRATEGIES = {NAME: lambda: FedFa(fraction_train=0.5, seed=0)}
server = server_app(NAME, STRATEGIES[NAME])

if __name__ == "__main__":
    simulate(NAME, server, client)
