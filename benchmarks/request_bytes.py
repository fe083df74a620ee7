"""The bytes of one train request as Flower sends it: this app's default request, and the same request
with the whole run config in it (what every request carried before the run config moved to the
ClientApp's ``Context``, issue 51).

    python -m benchmarks.request_bytes [--run-config "method='fedpcd' model='cnn'"]

The request is the first round's to one client, built by the strategy as the ServerApp builds it
(``strategies.requests.train_requests`` with the app's ``RunContext``) and serialised as Flower's
runtime serialises a message (``flwr.common.serde.message_to_proto``, then protobuf's bytes). The
table gives each record's bytes (a record serialised alone, as one entry of a ``RecordDict``) and the
whole message's. Prints a Markdown table.
"""

from __future__ import annotations

import argparse

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.serde import message_to_proto, recorddict_to_proto

from fedcore import keys
from fedcore.config import parse_overrides
from fedcore.internals import task_identity
from fedpcd_app.server.config import load_setup
from strategies.requests import RunContext, train_requests


def request_bytes(overrides: dict) -> list[tuple[str, int, int, int, int]]:
    """(record, entries now, bytes now, entries and bytes with the whole run config in the request) per
    record, then the whole message's bytes."""
    setup = load_setup(overrides)
    arrays = ArrayRecord(setup.model.state_dict())
    context = RunContext(run_config=setup.cfg.as_dict())
    with task_identity():
        (msg,) = train_requests(setup.strategy, 1, arrays, ConfigRecord(), {7: 0}, context)
        whole = msg.content.copy()
        whole[keys.RUN_CONFIG] = ConfigRecord(setup.cfg.as_dict())  # every request's record before issue 51
        before = Message(whole, dst_node_id=7, message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)

    def size(name: str, content: RecordDict) -> tuple[int, int]:
        if name not in content:
            return 0, 0
        return len(content[name]), len(recorddict_to_proto(RecordDict({name: content[name]})).SerializeToString())

    rows = [(name, *size(name, msg.content), *size(name, before.content))
            for name in dict.fromkeys([*msg.content.keys(), *before.content.keys()])]
    rows.append(("the whole message", 0, len(message_to_proto(msg).SerializeToString()), 0,
                 len(message_to_proto(before).SerializeToString())))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default="method='fedpcd'", help="flwr-style overrides of the defaults")
    args = parser.parse_args(argv)
    rows = request_bytes(parse_overrides(args.run_config))
    print(f"One train request ({args.run_config}; round 1, one client), serialised as Flower does:\n")
    print("| record | entries | bytes | with the whole run config: entries | bytes | saved |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, entries, now, entries_before, whole in rows:
        saved = f"{whole - now:,} ({(whole - now) / whole:.1%})" if whole else "-"
        counts = ("", "") if name == "the whole message" else (entries, entries_before)
        print(f"| {name} | {counts[0]} | {now:,} | {counts[1]} | {whole:,} | {saved} |")


if __name__ == "__main__":
    main()
