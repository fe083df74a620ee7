"""PropFair from a quickstart-style ClientApp: the quickstart's own loop, with the loss from
``client_app.foreign.ClientSide`` (two changed lines, marked ``# piece``): the log utility
−log(1 − f/M) of each batch's cross-entropy f against the baseline M (the request's
``propfair-base``, ``propfair-epsilon``). Without them nothing is dropped: the run is FedAvg under
PropFair's name.

    python -m examples.client_propfair
"""

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import PropFair

NAME = "propfair"
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model)  # piece: M, ε from the request
    optimizer = torch.optim.SGD(model.parameters(), lr=side.lr)
    for _ in range(EPOCHS):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = side.loss(model(x), y)  # piece: the log utility of the batch's loss
            loss.backward()
            optimizer.step()
    return side.reply({"num-examples": len(trainloader.dataset)})  # + train-loss


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


STRATEGIES = {NAME: lambda: PropFair(fraction_train=0.5, base=3.0, seed=0)}
server = server_app(NAME, STRATEGIES[NAME])

if __name__ == "__main__":
    simulate(NAME, server, client)
