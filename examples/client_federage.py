"""FedeRage from a quickstart-style ClientApp: the quickstart's own loop, with the CVaR-weighted
loss and β from ``client_app.foreign.ClientSide`` (three changed lines, marked ``# piece``).
Without them every reply lacks ``federage-beta`` and FedeRage drops it.

    python -m examples.client_federage
"""

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import FedeRage

NAME = "federage"
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model)  # piece: reads α, γ, β̂ from the request
    optimizer = torch.optim.SGD(model.parameters(), lr=side.lr)
    for _ in range(EPOCHS):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = side.loss(model(x), y)  # piece: the CVaR-weighted loss (β takes its step)
            loss.backward()
            optimizer.step()
    return side.reply({"num-examples": len(trainloader.dataset)})  # piece: + federage-beta, train-loss


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


STRATEGIES = {NAME: lambda: FedeRage(fraction_train=0.5, alpha=0.3, gamma=0.3, seed=0)}
server = server_app(NAME, STRATEGIES[NAME])

if __name__ == "__main__":
    simulate(NAME, server, client)
