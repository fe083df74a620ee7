"""Ditto from a quickstart-style ClientApp: ``ClientSide.step`` trains the shared model and,
on the same batch, the node's personal model pulled towards θ_t by λ (``ditto-lambda``); the
reply keeps the personal model in ``context.state`` and the evaluate handler scores it
(``evaluation_model``). Without the piece nothing is dropped: the shared model trains and the
personal models, Ditto's point, do not exist (evaluation scores the global model).

    python -m examples.client_ditto
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide, evaluation_model
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import Ditto

NAME = "ditto"
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model)  # the personal model from context.state
    for _ in range(EPOCHS):
        for x, y in trainloader:
            side.step(x, y)  # the shared model's step, and the personal model's
    return side.reply({"num-examples": len(trainloader.dataset)})  # keeps the personal model


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    personal = evaluation_model(msg, context, received(msg))  # Ditto scores the personal model
    return evaluate_reply(msg, personal, load_data(context)[1])


STRATEGIES = {NAME: lambda: Ditto(fraction_train=0.5, lam=0.1, seed=0)}
server = server_app(NAME, STRATEGIES[NAME])

if __name__ == "__main__":
    simulate(NAME, server, client)
