"""The ServerApp's log: the ``HH:MM:SS LEVEL [<method>] message`` lines on stderr (the level
always shown, so a warning never reads like progress), and the one-line
report of the errors whose message is the whole story (a bad run config, unloadable data, a
stopped aggregation) on Flower's path."""

from __future__ import annotations

import logging

log = logging.getLogger("fedpcd")


class AggregationStopped(RuntimeError):
    """A strategy's aggregation raised and ``on-aggregation-error`` = stop (one-line message)."""


class RunFailed(RuntimeError):
    """An exception ended the run (:func:`fedpcd_app.server.faults.ended_by`); its message is the
    summary's ``incomplete_reason`` (one line)."""


class _MethodTag(logging.Formatter):
    """``HH:MM:SS LEVEL [<method>] message``: the prefix names the run's method (set by
    :func:`set_log_method`; ``fedpcd``, the app's name, before a run has one)."""

    method = "fedpcd"

    def format(self, record: logging.LogRecord) -> str:
        record.method = _MethodTag.method
        return super().format(record)


def set_log_method(method: str) -> None:
    _MethodTag.method = str(method) or "fedpcd"


class _StderrHandler(logging.StreamHandler):
    """Writes to the *current* ``sys.stderr`` (not the one of the first run in this process:
    test runners and tools swap it between runs)."""

    @property
    def stream(self):
        import sys

        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging() -> None:
    if not log.handlers:
        handler = _StderrHandler()
        handler.setFormatter(_MethodTag("%(asctime)s %(levelname)s [%(method)s] %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


# -- errors on the Flower path: the app's one line, last ----------------------------------------------
# A ServerApp that raises ends the run as failed: Flower 1.42 logs "<entity> raised an
# exception" with the traceback, then its exit-code message (flwr.supercore.exit.flwr_exit),
# and puts "... failed with exception: <str(exc)>" in the run's status details (`flwr ls`).
# For the errors whose message is already the whole story (a bad run config, unloadable data,
# a stopped aggregation), the traceback is noise: the filter below drops it from Flower's log
# and ends Flower's exit message with the app's own line, the last line of `flwr log`.


def _one_line_errors() -> tuple[type[BaseException], ...]:
    from client_app.data import DataError
    from fedcore.config import ConfigError

    return (ConfigError, DataError, AggregationStopped, RunFailed)


class _OneLineReport(logging.Filter):
    """On Flower's logger, for one exception: its traceback record is dropped, and the next
    "Exit Code" message ends with ``error: <the exception's one line>``. Removes itself then."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc, self.line = exc, f"error: {exc}".splitlines()[0]
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and _caused_by(record.exc_info[1], self.exc):
            self.seen = True
            return False
        if self.seen and str(record.msg).startswith("Exit Code"):
            record.msg, record.args = f"{record.getMessage()}\n{self.line}", ()
            logging.getLogger("flwr").removeFilter(self)
        return True


def _caused_by(exc: BaseException | None, cause: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if exc is cause:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def one_line_report(exc: BaseException) -> None:
    """Make Flower's report of ``exc`` (about to leave the ServerApp) end with its one line."""
    flwr_logger = logging.getLogger("flwr")
    for old in [f for f in flwr_logger.filters if isinstance(f, _OneLineReport)]:
        flwr_logger.removeFilter(old)
    flwr_logger.addFilter(_OneLineReport(exc))
    log.error("%s", f"{exc}".splitlines()[0])


ONE_LINE_ERRORS = _one_line_errors()
