"""Faults are reported, never passed off as a healthy run.

**Client faults** (:func:`watch`, :func:`incomplete_reason`). A round is *faulty* when its
error replies (a train handler that raised, a node that could not be reached) and time-outs
("no reply (timeout or lost)") are more than :data:`FAULT_SHARE` of the clients it asked.
Replies refused by validation are not faults of this kind (they are the hostile replies of
docs/hostile.md, reported with their reasons). Once :data:`FAULT_WARN_ROUNDS` rounds were
faulty, ``summary.json``'s ``warnings`` carry one line naming the failing clients and the first
error text; a run in which more than :data:`FAULT_LIMIT` of the rounds played were faulty (or
whose last :data:`FAULT_STREAK` rounds all were) ends ``complete: false`` with that line as its
``incomplete_reason``: measured before this rule, 18 of 20 clients raising in every round ended
``complete: true`` at a mean accuracy of 0.430 (0.946 without the fault). Computed from the
rounds' records alone, so a resumed run counts its earlier rounds too.

**An exception inside a run** (:func:`ended_by`): whatever escapes the round loop (a grid that
fails, ``MemoryError``, a bug) ends the run with ``summary.json`` written (``complete: false``,
``incomplete_reason`` "failed at round N: <Exception>: <its first line>"), and
:class:`RunFailed` raised from it with that line (one of the errors the ServerApp logs in one line
and Flower's log ends with, :mod:`fedpcd_app.server.logs`; ``python -m fedpcd_app.simulate``
prints it as ``error: ...``); the output folder's lock is released by ``Experiment.run``'s
``finally``. A run that already wrote its summary (a stopped aggregation) re-raises as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from fedpcd_app.server.checkpoint import OutputError
from fedpcd_app.server.logs import ONE_LINE_ERRORS, RunFailed

__all__ = ["RunFailed", "ended_by", "incomplete_reason", "watch"]

log = logging.getLogger("fedpcd")

FAULT_SHARE = 0.5  # a round is faulty when errors + time-outs exceed this share of the clients asked
FAULT_WARN_ROUNDS = 2  # summary.json warns once this many rounds were faulty
FAULT_LIMIT = 0.5  # a run with more than this share of its rounds faulty is incomplete ...
FAULT_STREAK = 5  # ... and so is one whose last FAULT_STREAK rounds were all faulty
NO_REPLY = "no reply (timeout or lost)"


def is_fault(reason: str) -> bool:
    """An error reply or a time-out (not a reply refused by validation)."""
    return reason.startswith("error reply") or reason == NO_REPLY


def faults_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The round's dropped replies that are faults."""
    return [d for d in record.get("dropped", ()) if is_fault(str(d.get("reason", "")))]


def is_faulty(record: dict[str, Any]) -> bool:
    """Errors and time-outs exceed :data:`FAULT_SHARE` of the clients the round asked."""
    asked = len(record.get("sampled", ()))
    return asked > 0 and len(faults_of(record)) > FAULT_SHARE * asked


def describe(records: Iterable[dict[str, Any]]) -> str:
    """The failing clients of ``records`` and the first error text (or time-out), in one clause."""
    failed = [d for r in records for d in faults_of(r)]
    clients = sorted({d["partition"] if d.get("partition") is not None else d.get("node") for d in failed},
                     key=lambda c: (c is None, c))
    first = next((d["reason"] for d in failed if str(d["reason"]).startswith("error reply")), failed[0]["reason"]
                 if failed else "")
    shown = ", ".join(map(str, clients[:20])) + (f", ... ({len(clients)} in all)" if len(clients) > 20 else "")
    return f"client(s) {shown} failed; first: {first}".splitlines()[0]


def watch(history: list[dict[str, Any]], record: dict[str, Any], warn: Callable[[str], None]) -> None:
    """Warn (``warn``: logged and kept in summary.json) when ``record`` makes the
    :data:`FAULT_WARN_ROUNDS`-th faulty round of the run."""
    if not is_faulty(record):
        return
    faulty = [r for r in (*history, record) if is_faulty(r)]
    if len(faulty) == FAULT_WARN_ROUNDS:
        warn(f"round {record['round']}: in {len(faulty)} rounds more than {FAULT_SHARE:.0%} of the clients asked "
             f"answered with an error or not at all: {describe(faulty)}")


def incomplete_reason(history: list[dict[str, Any]]) -> str | None:
    """Why the run's client faults make it incomplete (None when they do not): more than
    :data:`FAULT_LIMIT` of its rounds faulty, or its last :data:`FAULT_STREAK` rounds."""
    if not history:
        return None
    faulty = [r for r in history if is_faulty(r)]
    tail = history[-FAULT_STREAK:]
    if len(faulty) > FAULT_LIMIT * len(history) or (len(tail) == FAULT_STREAK and all(map(is_faulty, tail))):
        return (f"client faults: in {len(faulty)} of {len(history)} rounds more than {FAULT_SHARE:.0%} of the clients "
                f"asked answered with an error or not at all: {describe(faulty)}")
    return None


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (SIGINT, or SIGTERM as one) that ``exc`` was raised while handling, if
    any: e.g. a lock released twice as the interrupt unwound a ``with`` block. Such a run was
    interrupted, not failed."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__context__
    return None


def ended_by(exp, exc: BaseException) -> BaseException:
    """``exc`` escaped ``exp``'s round loop: the summary written with ``complete: false`` (unless
    the run wrote it already); returns what to raise (:class:`RunFailed` from
    ``exc``, or ``exc`` itself when the summary stood already)."""
    if getattr(exp, "finished", False):
        return exc

    done = exp.state.round
    text = str(exc).strip()
    line = f"failed at round {done + 1}: {type(exc).__name__}{': ' + text if text else ''}".splitlines()[0]
    try:
        exp.keep_trained()  # trained, then failed before its record was kept
        exp.finish(line, report=False)
    except Exception as again:  # noqa: BLE001 - the summary is best effort; the line is not
        log.error("summary.json could not be written (%s: %s)", type(again).__name__, again)
    # an error that is its own one line (a config, data or output error) is raised as it is
    return exc if isinstance(exc, (*ONE_LINE_ERRORS, OutputError)) else RunFailed(line)
