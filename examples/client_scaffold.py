"""SCAFFOLD from a quickstart-style ClientApp: ``ClientSide.step`` takes the corrected step
g − c_i + c, and its reply sends Δc_i (``scaffold-delta-c``) and ``num-steps``; the node keeps
c_i in its ``context.state``. Without the piece every reply lacks ``scaffold-delta-c`` and is
dropped.

    python -m examples.client_scaffold
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app.foreign import ClientSide
from client_app.quickstart import EPOCHS, evaluate_reply, load_data, received, server_app, simulate
from strategies import Scaffold

NAME = "scaffold"
client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model, (trainloader, _) = received(msg), load_data(context)
    side = ClientSide(msg, context, model)  # c from the request, c_i from context.state
    for _ in range(EPOCHS):
        for x, y in trainloader:
            side.step(x, y)  # plain SGD at round-lr on the corrected gradient
    return side.reply({"num-examples": len(trainloader.dataset)})  # + scaffold-delta-c, num-steps


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_reply(msg, received(msg), load_data(context)[1])


STRATEGIES = {NAME: lambda: Scaffold(fraction_train=0.5, seed=0)}
server = server_app(NAME, STRATEGIES[NAME])

if __name__ == "__main__":
    simulate(NAME, server, client)
