"""The ClientApp as a SuperNode runs it: its train and evaluate handlers on one digits partition,
then the third-party packages the process imported.

Run as a script, with no ``tests`` package on the path: ``tests/test_client_install.py`` runs it
in a virtualenv that holds the app's wheel and the base (client) set alone, and in this
environment (where every extra is installed) to catch an import of a server-side package::

    python tests/client_probe.py [model[,model...]] [partition-id] [run-config JSON]    # one JSON line per model

Each line also lists every module the probe loaded (``loaded``: the full dotted names, the
ClientApp's own and what it pulled in), which ``tests/test_lean_client.py`` reads in a fresh
process to check that a message loads nothing heavy (``torch._dynamo``, a server module, ...).
"""

from __future__ import annotations

import json
import sys
import time


def probe(model: str = "mlp", partition: int = 1, clients: int = 4, overrides: dict | None = None) -> dict:
    """The ClientApp's train then evaluate handler on digits partition ``partition`` of ``clients``
    (``overrides``: more run-config values, e.g. momentum), in this process."""
    before = set(sys.modules)
    t0 = time.perf_counter()
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.app.metadata import Metadata

    from client_app.client_app import app
    from client_app.models import initial_model
    from fedcore import keys
    from fedcore.config import load_config
    from fedcore.internals import task_identity

    t_import = time.perf_counter() - t0
    cfg = load_config({"model": model, "num-clients": clients, "dataset": "digits", "seed": 0, **(overrides or {})})
    arrays = ArrayRecord(initial_model(cfg).state_dict())
    context = Context(run_id=1, node_id=7, node_config={keys.PARTITION_ID: partition, "num-partitions": clients},
                      state=RecordDict(), run_config=cfg.as_dict())  # the run config: once, in the Context

    def request(message_type: str) -> Message:
        conf = {keys.SERVER_ROUND: 1, keys.ROUND_LR: cfg.lr_at(1), keys.CLIENT_METHOD: "sgd"}
        content = RecordDict({keys.ARRAYS: arrays, keys.CONFIG: ConfigRecord(conf)})
        meta = Metadata(run_id=1, message_id=f"probe-{message_type}", src_node_id=1, dst_node_id=7,
                        reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0,
                        message_type=message_type)
        return Message(content, metadata=meta)

    out = {"model": model, "partition": partition, "import_s": round(t_import, 3)}
    replies = {}
    with task_identity(run_id=1, node_id=7):
        for message_type, name in ((MessageType.TRAIN, "train"), (MessageType.EVALUATE, "evaluate")):
            t = time.perf_counter()
            reply = app(request(message_type), context)
            if reply.has_error():
                raise RuntimeError(f"the {name} handler replied with an error: {reply.error.reason}")
            out[f"{name}_s"] = round(time.perf_counter() - t, 3)
            out[name] = dict(reply.content[keys.METRICS].items())
            replies[name] = reply
    trained = replies["train"].content[keys.ARRAYS]
    out["model_moved"] = any(bool((a.numpy() != trained[k].numpy()).any()) for k, a in arrays.items())
    out["imported"] = sorted({m.split(".")[0] for m in set(sys.modules) - before if not m.startswith("_")})
    out["loaded"] = sorted(set(sys.modules) - before)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    for name in (args[0] if args else "mlp").split(","):
        print(json.dumps(probe(name, int(args[1]) if len(args) > 1 else 1,
                               overrides=json.loads(args[2]) if len(args) > 2 else None)), flush=True)
