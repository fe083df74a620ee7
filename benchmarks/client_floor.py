"""The floor of one ClientApp message: a fresh Python process that imports torch and flwr, then does
the message's work (the same training, or the same evaluation) with this app's ClientApp handler,
and exits. What a SuperNode's message costs above it is Flower's per-message machinery (the
SuperExec's poll, the ``flwr-clientapp`` process's own start, pulling and unpacking the app
bundle, the message's pull and push).

Run as a script with the client-only virtualenv's python (``benchmarks/supernode.py`` does, pinned
to one CPU), from any folder: it imports only torch, flwr and the app's wheel::

    python benchmarks/client_floor.py train|evaluate MODEL PARTITION NUM_PARTITIONS '<run config JSON>' [--flower]

``--flower``: first import what Flower's ``flwr-clientapp`` command loads before it loads an app
(``flwr.supernode.cli.flwr_clientapp``: its runtime, the SuperNode's client, FAB installation; it
pulls sqlalchemy, fastapi, pydantic, alembic, requests), then the same: the floor of a process
that Flower's one-process-per-message design starts.

It prints one JSON line: the seconds to import torch and flwr (``import_s``; with ``--flower``, Flower's
runtime too), to do the work with
the ClientApp's handler, its imports included (``work_s``), and the process's peak resident set
(``maxrss_mib``). The request is the first round's, as the run's ServerApp sends it to a FedAvg
client (the round, its learning rate, the client routine, the initial weights); the run config is
the node's Context's, as Flower gives it.
"""

from __future__ import annotations

import json
import resource
import sys
import time

T0 = time.perf_counter()


def main(argv: list[str]) -> dict:
    kind, model, partition, partitions = argv[0], argv[1], int(argv[2]), int(argv[3])
    overrides = json.loads(argv[4]) if len(argv) > 4 and not argv[4].startswith("--") else {}
    if "--flower" in argv:
        from flwr.supernode.cli.flwr_clientapp import flwr_clientapp  # noqa: F401 - Flower's per-message process
    import flwr.app  # noqa: F401 - the floor: Python, torch and flwr
    import flwr.clientapp  # noqa: F401
    import torch  # noqa: F401

    t_import = time.perf_counter()
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.app.metadata import Metadata

    from client_app.client_app import app
    from client_app.models import initial_model
    from fedcore import keys
    from fedcore.config import load_config
    from fedcore.internals import task_identity  # what Flower's runtime sets in its process

    cfg = load_config({"model": model, "num-clients": partitions, **overrides})
    content = RecordDict({
        keys.ARRAYS: ArrayRecord(initial_model(cfg).state_dict()),
        keys.CONFIG: ConfigRecord({keys.SERVER_ROUND: 1, keys.ROUND_LR: cfg.lr_at(1), keys.CLIENT_METHOD: keys.SGD,
                                   keys.PARTITION_ID: partition}),
    })
    message_type = MessageType.TRAIN if kind == "train" else MessageType.EVALUATE
    meta = Metadata(run_id=1, message_id="floor", src_node_id=1, dst_node_id=7, reply_to_message_id="",
                    group_id="1", created_at=time.time(), ttl=3600.0, message_type=message_type)
    context = Context(run_id=1, node_id=7, node_config={keys.PARTITION_ID: partition, "num-partitions": partitions},
                      state=RecordDict(), run_config=cfg.as_dict())
    with task_identity(run_id=1, node_id=7):
        reply = app(Message(content, metadata=meta), context)
    if reply.has_error():
        raise SystemExit(f"error: the {kind} handler replied with an error: {reply.error.reason}")
    done = time.perf_counter()
    return {"kind": kind, "flower": "--flower" in argv, "import_s": t_import - T0, "work_s": done - t_import,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
