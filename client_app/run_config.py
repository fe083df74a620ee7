"""The run config this app's ClientApp trains by: its ``Context``'s, parsed once per run.

Flower gives a ClientApp the run's config once, in ``Context.run_config``: ``flwr run`` (Ray
simulation or a deployment's SuperNodes) and this project's local engine
(:class:`fedpcd_app.runtime.grid.LocalGrid`) alike. A request carries only what changes per round or
per client (its ``config`` record: the round, ``round-lr``, the client routine, the method's values,
the partition) and, in a run whose nodes bring their own data, the few values the server learned
from them at the start (the ``run-config`` record, :data:`fedcore.keys.NODE_DATA_SETTLED`).

:func:`read_run_config` fuses the two and parses them once per run: the parsed config is kept with
what it was parsed from and handed out again while a message's Context holds the same values (a
comparison of two dicts, ~5 µs, where a parse costs ~0.25 ms), so every message of a run shares one
:class:`~fedcore.config.RunConfig` object and what is derived from it can be kept by its identity.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from flwr.app import Context, Message

from fedcore import keys
from fedcore.config import RunConfig, parse_run_config

NO_RUN_CONFIG = (
    "this ClientApp reads the run config from its Context, and Context.run_config is empty: start the run "
    "with `flwr run` or `python -m fedpcd_app.simulate` (the local engine's LocalGrid takes run_config=...); "
    "a ClientApp of your own serving these strategies calls client_app.client_app.train_reply() instead"
)
_KEPT = 4  # runs whose parsed config is kept (a process serves one run at a time; a sweep's, one after another)
_parsed: list[tuple[dict, dict, RunConfig]] = []  # (the Context's run config, the settled values, parsed), newest first
_lock = threading.Lock()


def settled_values(msg: Message | None) -> dict[str, Any]:
    """The request's ``run-config`` record (what the server settled at the run's start), or {}."""
    if msg is None or keys.RUN_CONFIG not in msg.content:
        return {}
    return dict(msg.content[keys.RUN_CONFIG])


def read_run_config(context: Context, msg: Message | None = None) -> RunConfig:
    """The run's config: ``context.run_config`` with the request's settled values over it
    (:func:`settled_values`), parsed once per run (see the module docstring). An empty run config
    is one ``ValueError`` line saying how the run must be started; a bad value, the parse's
    one-line :class:`~fedcore.config.ConfigError`."""
    raw: Mapping[str, Any] = context.run_config
    if not raw:
        raise ValueError(NO_RUN_CONFIG)
    settled = settled_values(msg)
    with _lock:  # a batch's threads read it at once: one parse, one object per run
        for source, values, cfg in _parsed:
            if values == settled and source == raw:
                return cfg
        cfg = parse_run_config({**raw, **settled})
        _parsed.insert(0, (dict(raw), settled, cfg))
        del _parsed[_KEPT:]
    return cfg
