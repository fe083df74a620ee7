"""A ClientApp for the local engine's straggler test: the project's ClientApp, except that
partition 0 sleeps :data:`SLOW_S` seconds before it trains, from round 2 on (round 1 is clean).
Loaded by name in worker processes (``tests.straggler_app:app``)."""

from __future__ import annotations

import time

from flwr.app import Message
from flwr.clientapp import ClientApp

SLOW_S = 3.0
SLOW_PARTITION = 0

app = ClientApp()


def _project(msg: Message, context) -> Message:
    from client_app.client_app import app as project

    return project(msg, context)


@app.train()
def train(msg: Message, context) -> Message:
    if context.node_config["partition-id"] == SLOW_PARTITION and int(msg.metadata.group_id) >= 2:
        time.sleep(SLOW_S)
    return _project(msg, context)


@app.evaluate()
def evaluate(msg: Message, context) -> Message:
    return _project(msg, context)


@app.query()
def query(msg: Message, context) -> Message:
    return _project(msg, context)
