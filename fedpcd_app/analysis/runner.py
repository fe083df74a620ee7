"""A sweep's run processes: each runs one run after another (torch, flwr and the app imported
once), on the GPUs it was started with.

The sweep (:mod:`fedpcd_app.analysis.sweep`) starts ``--jobs`` of them, each with its own
environment (``CUDA_VISIBLE_DEVICES`` = its slot's GPUs, :mod:`fedpcd_app.runtime.placement`),
and hands each the next pending run as it finishes the last. A run that kills its process
(a segfault, the OOM killer) is a failed run; the slot starts a new process for the next one.

Protocol (``python -m fedpcd_app.analysis.runner``): one JSON request per line on the stdin the
process started with, ``{"overrides": {...}, "folder": "...", "engine": {...}}``; one JSON reply
per line on the stdout it started with, ``{"ok": "<output folder>"}`` or ``{"error": "<one line>"}``.
During a run, the process's stdout and stderr (file descriptors 1 and 2, so its engine's
output too) go to the run's ``run.log``; a failed run's traceback is written there.

Between runs the process is put back as a fresh one would be (:func:`reset_state`): torch's
thread count and default generator, the loggers (levels, handlers), the memory a run left
(``gc``, CUDA's cache).
What stays is what cannot change a result: imported modules, the data of the last data setting
(:func:`client_app.data.load_federated_data` caches it by its data keys), parsed configs and
models overwritten from every message. The local engine's workers (``--workers`` > 0) and their
forkserver live as long as this process too (:func:`fedpcd_app.runtime.pool.keep_workers`): the
next run with the same engine settings takes them over, each worker put back as a fresh one
starts a run (its output to the new run's log, its random generators and threads reset, its
data warm-up run); a run that left a worker busy or dead, or a run of other engine settings
(worker count, GPUs), starts new workers (from the same forkserver).
``tests/test_sweep_reuse.py`` checks that a run done after another in one process equals the
same run in a fresh process, summary and model bytes, with the clients in the run's process and
in reused workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LOG_FILE = "run.log"
ROOT = Path(__file__).resolve().parents[2]  # the project: a run process imports this copy of the app


class RunFailed(RuntimeError):
    """A run raised, or its process died; the message is one line."""


# -- the run process ----------------------------------------------------------------------------
def initial_state() -> dict[str, Any]:
    """What :func:`reset_state` puts back, read when the process starts."""
    import torch

    return {"threads": torch.get_num_threads(), "seed": torch.initial_seed(), "loggers": _loggers()}


def _loggers() -> dict[str, tuple]:
    """Every logger's (level, handlers, filters, propagate, disabled), the root's under ``""``."""
    found = {"": logging.getLogger()}
    found.update({n: lg for n, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)})
    return {n: (lg.level, list(lg.handlers), list(lg.filters), lg.propagate, lg.disabled) for n, lg in found.items()}


def reset_state(initial: Mapping[str, Any]) -> None:
    """Put this process back as a fresh one starts a run (see the module docstring)."""
    import gc

    import torch

    torch.set_num_threads(initial["threads"])
    torch.manual_seed(initial["seed"])  # the default generator(s) as a fresh process has them
    for name in _loggers():  # as they were when the process started (a logger made since: as made)
        level, handlers, filters, propagate, disabled = initial["loggers"].get(
            name, (logging.NOTSET, [], [], True, False))
        lg = logging.getLogger(name)
        lg.setLevel(level)
        lg.handlers[:], lg.filters[:] = handlers, filters
        lg.propagate, lg.disabled = propagate, disabled
    from client_app.vectorised import forget_notices

    forget_notices()  # the rows' once-per-run notices: said again in the next run's log
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def run_one(overrides: Mapping[str, Any], folder: str, engine: Mapping[str, Any] | None = None) -> str:
    """One run, its output (and its engine's) to ``<folder>/run.log``; the report and figures are
    the sweep's (drawn once, over all its runs, at its end)."""
    from fedpcd_app.runtime.simulate import simulate
    from fedpcd_app.server.checkpoint import rounds_in

    # A pending run's folder may hold what an earlier attempt left: an interrupted run with a
    # checkpoint is continued from it, anything else replaced (overwrite; a finished run is never rerun).
    again = {"resume-from": folder} if was_interrupted(Path(folder)) and rounds_in(folder) else {"overwrite": True}
    with open(Path(folder) / LOG_FILE, "a" if "resume-from" in again else "w") as log, _redirected(log):
        try:
            return str(simulate({**overrides, "output-dir": folder, "figures": "none", **again}, **(engine or {})))
        except BaseException:
            traceback.print_exc(file=log)
            raise


def was_interrupted(folder: Path) -> bool:
    """The run in ``folder`` was stopped by SIGINT/SIGTERM (its summary says so)."""
    from fedpcd_app.server.results import SUMMARY

    try:
        reason = json.loads((folder / SUMMARY).read_text()).get("incomplete_reason") or ""
    except (OSError, ValueError, AttributeError):
        return False
    return str(reason).startswith("interrupted at round")


@contextlib.contextmanager
def _redirected(log):
    """File descriptors 1 and 2 (and sys.stdout/sys.stderr) to ``log``, then to /dev/null."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = log
    try:
        yield
    finally:
        log.flush()
        sys.stdout, sys.stderr = saved
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def serve(requests, replies) -> None:
    """Answer requests (one JSON object a line) until the input closes."""
    initial = initial_state()
    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        reset_state(initial)
        stop = False
        try:
            reply = {"ok": run_one(req["overrides"], req["folder"], req.get("engine"))}
        except KeyboardInterrupt as exc:  # Ctrl-C reaches the sweep's whole process group: this run and the sweep end
            plain = type(exc) is KeyboardInterrupt  # else flwr_run's Interrupted, which names the run it stopped
            reply, stop = {"error": "KeyboardInterrupt: the sweep was interrupted" if plain else reason(exc)}, True
        except BaseException as exc:  # noqa: BLE001 - a failed run is reported; the process serves the next
            reply, stop = {"error": reason(exc)}, False
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
        if stop:
            return


def main() -> None:
    # The request and reply channels on private descriptors (not inherited by what a run starts:
    # its engine's processes must not read the requests); fd 0 is /dev/null, 1 and 2 each run's log.
    requests, replies = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)  # this process's stdin until it ends
    import gc

    import fedpcd_app.runtime.simulate  # noqa: F401 - torch, flwr and the app: once, before the first run
    import fedpcd_app.server.server_app  # noqa: F401
    from fedpcd_app.runtime.pool import keep_workers

    # What the imports built (~216k objects: torch, flwr, the app) lives as long as the process:
    # out of the collector's sight, so that reset_state's gc.collect() between runs (and the
    # collections during a run) walk only what the runs made (0.1-0.3 s a run before, most of
    # the gap between a sweep's runs).
    gc.freeze()

    keep_workers()  # the local engine's workers serve run after run (the module docstring)
    serve(requests, replies)
    sys.stderr.flush()
    os._exit(0)  # skip torch's slow interpreter teardown: nothing is left to write


# -- the sweep's side ---------------------------------------------------------------------------
def process_env(environ: Mapping[str, str]) -> dict[str, str]:
    """A run process's environment: ``environ`` with this copy of the project first on
    ``PYTHONPATH`` (the runs import the code the sweep was started from)."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


class RunProcess:
    """One run process of a sweep (started on first use, restarted after it died).

    ``env``: its environment (:func:`fedpcd_app.runtime.placement.child_env`); ``gpus``: the
    physical GPU ids it sees (recorded with each run); ``reuse=False``: a new process per run."""

    def __init__(self, env: Mapping[str, str], gpus: tuple[str, ...] = (), reuse: bool = True) -> None:
        self.env = process_env(env)
        self.gpus = tuple(gpus)
        self.reuse = reuse
        self.proc: subprocess.Popen | None = None
        self.started = 0  # processes started so far (a test reads it)

    def start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "fedpcd_app.analysis.runner"], cwd=ROOT,
                                         env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.started += 1
        return self.proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def run(self, overrides: Mapping[str, Any], folder: str | Path, engine: Mapping[str, Any] | None = None) -> str:
        """Run one run in this process; its output folder, or :class:`RunFailed`."""
        proc = self.start()
        request = {"overrides": dict(overrides), "folder": str(folder), "engine": dict(engine or {})}
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not self.reuse:
            self.close()
        if not line:
            code = proc.wait()
            self._drop(proc)
            why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            raise RunFailed(f"the run's process died ({why}); see {Path(folder) / LOG_FILE}")
        reply = json.loads(line)
        if "error" in reply:
            raise RunFailed(reply["error"])
        return reply["ok"]

    def _drop(self, proc: subprocess.Popen) -> None:
        """Forget a process that has ended (its pipes closed)."""
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        if self.proc is proc:
            self.proc = None

    def close(self, timeout: float = 30.0) -> None:
        """Stop the process: close its input (it exits), then SIGTERM, then SIGKILL, by its PID."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _terminate(proc)
        with contextlib.suppress(OSError):
            proc.stdout.close()

    def kill(self) -> None:
        """Stop it now (Ctrl-C of the sweep), by its PID."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            _terminate(proc)


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 5 s, by its PID."""
    proc.terminate()
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
