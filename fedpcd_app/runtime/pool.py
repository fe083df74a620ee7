"""The local engine's worker processes: a pool that lives for the whole run.

Each worker loads the ClientApp once and keeps its model object and data between messages; a
node's Context travels with its message to whichever worker is free and comes back with the
reply (as Flower's Ray backend ships it to an actor). Workers fork from a forkserver that
imported the ClientApp's modules once; GPUs, when present, are shared round-robin. A worker
that dies costs the messages it held (their replies come back as None), not the run.

**Kept from run to run.** In a process that runs one run after another (a sweep's run process,
:mod:`fedpcd_app.analysis.runner`, calls :func:`keep_workers`), a pool outlives its run: the next
run with the same settings (ClientApp, worker count, threads, GPUs, warm-up, batch hook, run id)
takes it over (:func:`open_pool`), so that neither the forkserver nor the workers start again.
Each run begins by putting every worker back as a fresh one starts (:meth:`WorkerPool.begin_run`):
its stdout and stderr become the driver's current ones (the run's log), its random generators
(torch's, numpy's, Python's) the states it had before its first warm-up, its torch threads its
own, and the warm-up runs with the new run's config. What stays is what cannot change a result,
as in the run process: imported modules, the data cache (keyed by its data keys), the models
overwritten from every message. A pool whose run left a worker busy (a timed-out message still
training) or dead, or whose settings differ, is closed instead and a new one started.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator

from flwr.app import Context, Message

from fedcore.internals import SERVER_NODE_ID, task_identity
from fedpcd_app.runtime.node import deliver_many, keep_freed_memory, load_batch, load_client_app

log = logging.getLogger("fedpcd")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


BEGIN_RUN = "begin-run"  # a control message: (BEGIN_RUN, run_config), then the driver's fds 1 and 2
REPLY, DONE = "reply", "done"  # a worker's messages: (REPLY, message id, reply, context), (DONE, the task's ids)


def _generators() -> tuple:
    """The process's global random generators' states (torch's, numpy's, Python's)."""
    import random

    import numpy as np
    import torch

    return torch.random.get_rng_state(), np.random.get_state(), random.getstate()


def _set_generators(states: tuple) -> None:
    import random

    import numpy as np
    import torch

    torch.random.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


def _take_output(conn) -> None:
    """File descriptors 1 and 2 become the two the driver sends next (:func:`_give_output`)."""
    import sys
    from multiprocessing.reduction import recv_handle

    sys.stdout.flush()
    sys.stderr.flush()
    for target in (1, 2):
        fd = recv_handle(conn)
        os.dup2(fd, target)
        os.close(fd)


def _give_output(conn, pid: int) -> None:
    """This process's file descriptors 1 and 2 to the worker ``pid`` (:func:`_take_output`)."""
    import sys
    from multiprocessing.reduction import send_handle

    sys.stdout.flush()
    sys.stderr.flush()
    for fd in (1, 2):
        send_handle(conn, fd, pid)


def _worker_main(conn, index: int, app_ref: str, threads: int, gpu: int | None, warmup: str | None,
                 run_config: dict, run_id: int, batch_ref: str | None = None) -> None:
    """A worker: load the ClientApp once, then answer (message ids, messages, contexts) until None;
    a (:data:`BEGIN_RUN`, run config) message puts it back as a fresh worker starts that run."""
    import signal
    import sys

    import torch

    # A session of its own, as Ray starts its actors: terminal signals (Ctrl-C) reach only the
    # driver, which stops the workers; and where the kernel groups CPU time by session
    # (autogroup), the workers get the share Ray's actors get rather than splitting the
    # driver's. A worker still ends with the driver: its pipe closes.
    with contextlib.suppress(OSError):
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _take_output(conn)  # the driver's stdout and stderr, not the forkserver's (those of the run that started it)
    keep_freed_memory()  # as the run's process (fedpcd_app.runtime.execution's rule)
    torch.set_num_threads(threads)
    if gpu is not None:
        torch.cuda.set_device(gpu)
    with task_identity(run_id=run_id, node_id=SERVER_NODE_ID + 1 + index):
        app = load_client_app(app_ref)
        batch = load_batch(batch_ref)
        fresh = _generators()  # what a new worker's generators hold before its warm-up

        def warm(config: dict) -> None:
            if warmup:
                module, _, fn = warmup.partition(":")
                getattr(importlib.import_module(module), fn)(config)

        warm(run_config)
        while True:
            try:
                task = conn.recv()
            except EOFError:  # the driver is gone
                return
            if task is None:  # nothing to keep: skip the interpreter's (torch's) slow teardown
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            if task[0] == BEGIN_RUN:  # another run: as a fresh worker starts it (see the module docstring)
                _take_output(conn)  # the driver's stdout and stderr now (the run's log)
                torch.set_num_threads(threads)
                _set_generators(fresh)
                warm(task[1])
                continue
            mids, messages, contexts = task
            sending = threading.Lock()  # replies come from the batch's threads

            def sent(i: int, reply, mids=mids, contexts=contexts, sending=sending) -> None:
                with sending:  # each reply as soon as it is ready: a slow client holds back no other
                    conn.send((REPLY, mids[i], reply, contexts[i]))

            deliver_many(app, list(zip(messages, contexts)), batch, on_reply=sent)
            with sending:
                conn.send((DONE, mids))


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start a worker without the driver's ``__main__``: a forkserver (or spawn) child runs
    the main script again before its target unless told of none, so a script calling
    ``run_local`` without an ``if __name__ == "__main__":`` guard would run itself once
    per worker. The workers need nothing of it (their target lives in this module)."""
    import sys

    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


class _Worker:
    def __init__(self, ctx, index: int, args: tuple) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, index, *args), daemon=True,
                                   name=f"fedpcd-worker-{index}")
        with _main_module_hidden():
            self.process.start()
        child.close()
        _give_output(self.conn, self.process.pid)
        self.busy: list[str] | None = None  # the message ids it is working on
        self.left: set[str] = set()  # of those, the ones whose reply has not come


def _start_method(preload: list[str]):
    """``forkserver``: workers fork from a clean server process that imported the ClientApp's
    modules once (fork from the driver would hang torch's OpenMP pool once the driver used it,
    and CUDA cannot survive a fork); ``spawn`` where there is no forkserver."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(preload)  # no effect once this process's forkserver runs
        return ctx
    return multiprocessing.get_context("spawn")


def stop_forkserver() -> None:
    """Stop this process's forkserver (what the workers fork from) by its PID, for a command
    that is about to exit: without it the server outlives the command by its interpreter's
    teardown (seconds with torch loaded), holding the command's output pipes. A later pool
    starts a new one. (``multiprocessing.forkserver`` keeps its PID in a private attribute.)"""
    import signal
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(AttributeError, OSError):
        server._stop()


_keep = False  # keep_workers(): pools outlive their runs in this process
_kept: dict[tuple, WorkerPool] = {}  # settings -> the idle pool of the last run with them


def keep_workers(on: bool = True) -> None:
    """Keep each run's worker pool for the next run of this process (a sweep's run process);
    ``on=False`` closes the kept one."""
    global _keep
    _keep = on
    if not on:
        while _kept:
            _kept.popitem()[1].close()


def open_pool(app_ref: str, workers: int, *, threads: int | None = None, gpus: int | None = None,
              warmup: str | None, run_config: dict, run_id: int, preload: list[str],
              batch: str | None = None) -> WorkerPool:
    """A run's pool: the kept one of the last run when its settings are these (put back for
    this run, :meth:`WorkerPool.begin_run`), else a new one (a kept one of other settings is closed)."""
    key = (app_ref, workers, threads, gpus, warmup, run_id, batch)
    pool = _kept.pop(key, None)
    keep_workers(_keep)  # closes the kept pools of other settings
    if pool is not None:
        if pool.begin_run(run_config):
            return pool
        pool.close()
    pool = WorkerPool(app_ref, workers, threads=threads, gpus=gpus, warmup=warmup, run_config=run_config,
                      run_id=run_id, preload=preload, batch=batch)
    pool.key = key
    return pool


def release_pool(pool: WorkerPool) -> None:
    """The run is over: keep the pool for the next run (:func:`keep_workers`) when every worker
    is alive and idle, else close it."""
    if _keep and pool.idle():
        keep_workers(_keep)
        _kept[pool.key] = pool
        log.debug("local engine: %d worker(s) kept for the next run", len(pool.workers))
    else:
        pool.close()


class WorkerPool:
    """Worker processes answering tasks; a free worker takes the next pending task.

    ``threads``: each worker's torch threads outside the ClientApp calls (default: the usable
    cores shared out); ``gpus``: GPUs shared round-robin (default: all visible; none without
    CUDA). The workers start in a background thread (a forkserver's first fork waits for its
    imports), so that the driver's own start-up (data for evaluation, node discovery)
    overlaps theirs; the first task waits for them."""

    def __init__(self, app_ref: str, workers: int, *, threads: int | None = None, gpus: int | None = None,
                 warmup: str | None, run_config: dict, run_id: int, preload: list[str],
                 batch: str | None = None) -> None:
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        threads = threads or max(1, usable_cores() // workers)
        modules = ["torch", app_ref.partition(":")[0], *([warmup.partition(":")[0]] if warmup else []), *preload]
        ctx = _start_method(list(dict.fromkeys(modules)))
        self.workers: list[_Worker] = []
        self.pending: list[tuple[list[str], list[Message], list[Context]]] = []  # one task: one or more messages
        self.done: dict[str, tuple[Message | None, Context | None]] = {}  # message id -> (reply, context)
        self._error: BaseException | None = None
        self.key: tuple = ()  # open_pool's settings key
        self.runs = 1  # runs served (a kept pool serves several)
        self.size = workers

        def start() -> None:
            try:
                for i in range(workers):
                    self.workers.append(_Worker(ctx, i, (app_ref, threads, (i % gpus) if gpus else None, warmup,
                                                         dict(run_config), run_id, batch)))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the driver's thread
                self._error = exc

        self._starter = threading.Thread(target=start, name="fedpcd-worker-start", daemon=True)
        self._starter.start()

    def _ready(self) -> None:
        self._starter.join()
        if self._error is not None:
            raise RuntimeError(f"the local engine's worker processes did not start: {self._error}") from self._error

    @property
    def pids(self) -> list[int]:
        self._ready()
        return [w.process.pid for w in self.workers]

    def submit(self, mid: str, message: Message, context: Context) -> None:
        self.submit_many([mid], [message], [context])

    def submit_many(self, mids: list[str], messages: list[Message], contexts: list[Context]) -> None:
        """One task of several messages: one worker answers them all (trained together)."""
        self.pending.append((list(mids), list(messages), list(contexts)))
        self._dispatch()

    def _dispatch(self) -> None:
        self._ready()
        for w in self.workers:
            if not self.pending:
                return
            if w.busy is None and w.process.is_alive():
                task = self.pending.pop(0)
                try:
                    w.conn.send(task)
                except OSError:  # it has just died: the task goes to another worker
                    self.pending.insert(0, task)
                    continue
                w.busy = task[0]  # the task's message ids
                w.left = set(task[0])  # those not answered yet

    def wait(self, timeout: float | None) -> None:
        """Collect the results that arrive within ``timeout`` s, then hand out pending tasks."""
        from multiprocessing.connection import wait

        if not any(w.process.is_alive() for w in self.workers):
            raise RuntimeError("every local-engine worker process has died (see the log above); "
                               "rerun with --workers 0 to run the ClientApps in this process")
        busy = [w for w in self.workers if w.busy is not None]
        ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout) if busy else []
        for w in busy:
            if w.conn not in ready and w.process.sentinel not in ready:
                continue
            try:
                self._read(w)
            except (EOFError, OSError):  # it died (its pipe closed) before replying
                w.process.join(1.0)
                log.error("local engine: worker %d (pid %d) died with exit code %s",
                          self.workers.index(w), w.process.pid, w.process.exitcode)
                for mid in w.left:  # the grid turns them into error replies
                    self.done[mid] = (None, None)
                w.busy = None
        self._dispatch()

    def idle(self) -> bool:
        """Every worker alive with nothing to do (nothing pending): fit to serve another run."""
        self._ready()
        try:
            for w in self.workers:  # every reply in: its task's end follows at once
                if w.busy is not None and not w.left and w.process.is_alive() and w.conn.poll(5.0):
                    self._read(w)
        except (EOFError, OSError):  # one died: not to be reused
            return False
        self.done.clear()
        return (not self.pending and bool(self.workers)
                and all(w.busy is None and w.process.is_alive() for w in self.workers))

    def begin_run(self, run_config: dict) -> bool:
        """Put each (idle) worker back as a fresh worker starts a run of ``run_config`` (see the
        module docstring); False when one cannot be (it died): the pool is then not to be used."""
        if not self.idle():
            return False
        try:
            for w in self.workers:
                w.conn.send((BEGIN_RUN, dict(run_config)))
                _give_output(w.conn, w.process.pid)
        except OSError:
            return False
        self.runs += 1
        return True

    def describe(self) -> str:
        """One line for the run's log: the workers, and whether they are an earlier run's."""
        if self.runs == 1:
            return f"local engine: {self.size} new worker process(es)"
        pids = ", ".join(str(w.process.pid) for w in self.workers)
        return f"local engine: {self.size} worker(s) (pids {pids}) reused for this run (run {self.runs} of this pool)"

    def _read(self, w: _Worker) -> None:
        """Everything ``w`` has sent so far: each reply (as soon as it was ready), then its task's end."""
        while w.busy is not None and w.conn.poll():
            kind, *body = w.conn.recv()
            if kind == REPLY:
                mid, reply, context = body
                self.done[mid] = (reply, context)
                w.left.discard(mid)
            else:  # DONE: the task is over, the worker free
                w.busy = None

    def close(self) -> None:
        """Stop the workers: ask, then SIGTERM, then SIGKILL, each by its PID."""
        self._starter.join()
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(None)
        deadline = time.monotonic() + 5.0
        for w in self.workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(2.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
