"""One experiment on this machine: the ServerApp/ClientApp on the local engine or on Flower's Ray engine.

    python -m fedpcd_app.simulate --run-config "method='fedpcd' num-server-rounds=20"
    python -m fedpcd_app.simulate --workers 0 --run-config run_configs/digits_fedpcd.toml
    python -m fedpcd_app.simulate --engine ray --num-cpus 1 --num-gpus 0.25 --run-config "..."

``--run-config`` takes flwr's syntax (``key=value`` pairs, strings in inner quotes, or a
TOML file). One node per client partition (``num-clients``). Tests, sweeps and benchmarks
call :func:`simulate`. Prints the output folder on the last line.

Engines (same numbers for the same seed; ``tests/test_engine.py``):

* ``local`` (default): :mod:`fedpcd_app.engine`. The ServerApp runs in this process on a
  :class:`~fedpcd_app.engine.LocalGrid`; the ClientApps run in ``--workers`` worker
  processes (``0`` = in this process; default ``auto``: in this process when the run's
  client training is too small to repay starting workers, else the usable cores —
  :func:`auto_workers`) that keep their model and data for the whole run. GPUs are shared
  round-robin by the workers. The train requests a worker (or this process) gets in a round
  go to it together, so that ``client-execution`` can train them at once
  (:mod:`client_app.vectorised`).
* ``ray``: ``flwr run`` of this app against a private local SuperLink in simulation mode
  (Flower's Ray backend: one actor per ``--num-cpus``/``--num-gpus`` share), the route
  Flower 1.42 supports in place of the deprecated ``run_simulation``. The SuperLink gets a
  free port and its own ``FLWR_HOME``; the run's status is checked; every process it started
  (SuperExec, the simulation, Ray's) is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client_app.data import DataError
from fedcore.config import ConfigError

ENGINES = ("local", "ray")
CLIENT_APP = "client_app.client_app:app"
CLIENT_BATCH = "client_app.vectorised:deliver_batch"  # a round's train requests to one process, together
# --workers auto: worker processes only when they repay their start. Measured on this 2-core
# machine (docs/performance.md §"Clients trained at once"): starting the pool (forkserver,
# imports, data) costs WORKER_START_S more wall time than running in process, and W workers
# save at most (1 − 1/W) of the clients' training time.
WORKER_START_S = 4.0
# What the ClientApp imports lazily (data loading; torch._dynamo on the first optimizer):
# imported once in the forkserver the workers fork from, not once per worker.
CLIENT_PRELOAD = ("client_app.data", "sklearn.datasets", "datasets", "flwr_datasets.partitioner", "torch._dynamo")
PROJECT = Path(__file__).resolve().parent.parent  # the Flower app (pyproject.toml) `flwr run` builds


def simulate(
    overrides: Mapping[str, Any] | str | None = None,
    *,
    engine: str = "local",
    workers: int | str | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    verbose: bool = False,
) -> Path:
    """Run one experiment; returns its output folder (holding ``summary.json``).

    ``workers``: local engine, worker processes (``None`` or ``"auto"`` = :func:`auto_workers`,
    0 = this process). ``num_cpus``/``num_gpus``: Ray engine, each client actor's share."""
    if engine not in ENGINES:
        raise ConfigError(f"engine '{engine}' is not one of {', '.join(ENGINES)}: use --engine local or --engine ray")
    if workers == "auto":
        workers = None
    if workers is not None and (not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"--workers {workers}: give 0 (in this process) or more worker processes")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    out = (_simulate_local(overrides, workers) if engine == "local"
           else _simulate_ray(overrides, num_cpus=num_cpus, num_gpus=num_gpus))
    if not (out / "summary.json").is_file():
        raise RuntimeError(f"the run did not finish: no summary.json in {out} (see the log above)")
    return out


# -- local engine --------------------------------------------------------------------------------
def _simulate_local(overrides, workers: int | None) -> Path:
    from fedpcd_app.config import load_setup
    from fedpcd_app.engine import run_local, usable_cores
    from fedpcd_app.server_app import make_server_app

    setup = load_setup(overrides)  # every key checked, strategy and model built, once
    workers = auto_workers(setup.cfg, usable_cores()) if workers is None else workers
    run_local(make_server_app(setup), CLIENT_APP, setup.cfg.num_clients, workers=workers,
              run_config=setup.raw, warmup="fedpcd_app.simulate:load_client_data" if workers else None,
              preload=CLIENT_PRELOAD, batch=CLIENT_BATCH)
    return Path(setup.cfg.output_dir).resolve()


def client_seconds(cfg) -> float | None:
    """The run's client training time in one process, estimated: rounds × clients per round ×
    local steps per client × one step's CPU time, measured here on one thread (the run's model,
    one batch of client 0's data, fastest of three after a warm-up; CPU time, so that a busy
    machine does not inflate it). None when the data is not here
    (``client-data = 'node'``)."""
    import time

    import torch

    from client_app import local_data
    from client_app.data import load_federated_data
    from client_app.models import build_model
    from client_app.training import num_local_steps

    if local_data.is_node_mode(cfg):
        return None
    data = load_federated_data(cfg)
    sizes = [len(t) for t in data.train_idx]
    mean_n = max(1, round(sum(sizes) / len(sizes)))
    steps = cfg.local_steps if cfg.local_steps > 0 else num_local_steps(mean_n, cfg.batch_size, cfg.local_epochs)
    bs = mean_n if cfg.batch_size <= 0 else min(cfg.batch_size, mean_n)
    probe_bs = min(bs, 32)  # a CNN's 128-batch step is timed on 32 examples and scaled
    x, y = data.client_train(0)
    reps = (probe_bs + len(y) - 1) // max(len(y), 1)
    x, y = x.repeat(reps, *([1] * (x.dim() - 1)))[:probe_bs], y.repeat(reps)[:probe_bs]
    with torch.random.fork_rng(devices=[]):
        model = build_model(cfg.model, data.input_shape, data.num_classes)
    best = float("inf")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time of one thread: what the step costs, whatever the machine's load
    try:
        for i in range(4):
            t0 = time.thread_time()
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-1e-9)
            if i:
                best = min(best, time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    step_s = best * bs / probe_bs
    return cfg.num_server_rounds * cfg.clients_per_round * steps * step_s


def auto_workers(cfg, cores: int) -> int:
    """``--workers auto``: the usable cores when (1 − 1/W) of the run's client training
    (:func:`client_seconds`) exceeds the workers' start-up cost :data:`WORKER_START_S`, else 0
    (in this process)."""
    if cores < 2:
        return 0
    est = client_seconds(cfg)
    if est is None:
        return cores
    workers = cores
    return workers if est * (1 - 1 / workers) > WORKER_START_S else 0


def load_client_data(run_config: Mapping[str, Any]) -> None:
    """A worker's warm-up: its data, loaded while the server starts (the ClientApp would load
    it on its first message; either way once per process)."""
    from client_app.data import load_federated_data
    from fedcore.config import parse_run_config

    load_federated_data(parse_run_config(run_config))


# -- Ray engine: `flwr run` against a private local SuperLink --------------------------------------
def _simulate_ray(overrides, *, num_cpus: float, num_gpus: float) -> Path:
    from fedcore.config import parse_overrides, resolve
    from fedpcd_app.config import check
    from fedpcd_app.results import default_output_dir

    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    raw = resolve(overrides)
    cfg = check(raw)  # every key checked, nothing built or loaded: the run loads what it uses
    if cfg.dataset_path:  # ...except a local folder: bad data is one line here, not a failed run behind Ray
        from client_app.data import load_federated_data

        load_federated_data(cfg)
    # The ServerApp runs from an installed copy of the app (another working directory).
    raw["output-dir"] = str(Path(raw["output-dir"] or default_output_dir(cfg)).resolve())
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="fedpcd-flwr-") as home:
        home = Path(home)
        run_config = home / "run_config.toml"
        run_config.write_text("".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in raw.items()))
        env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
               "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
               "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        with LocalSuperLink(home, env) as link:
            federation = (f"num-supernodes={cfg.num_clients} client-resources-num-cpus={num_cpus:g} "
                          f"client-resources-num-gpus={num_gpus:g}")
            subprocess.run([str(bin_dir / "flwr"), "run", str(PROJECT), link.name, "--stream",
                            "--federation-config", federation, "--run-config", str(run_config)],
                           env=env, cwd=PROJECT, check=False)
            status = link.last_run_status()
        if status != "finished:completed":
            raise RuntimeError(f"the flwr run ended with status {status!r} (see its log above)")
    return Path(raw["output-dir"])


def _toml_key(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


class LocalSuperLink:
    """``flower-superlink --simulation`` on a free local port, with its own FLWR_HOME (a
    ``config.toml`` naming it), and every process it starts tracked so that :meth:`stop`
    ends them all by PID: Ray's actors and servers outlive the run otherwise."""

    name = "fedpcd-local"

    def __init__(self, home: Path, env: dict[str, str], startup_timeout: float = 60.0) -> None:
        self.home, self.env = home, env
        self.port = _free_port()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{self.name}"\n\n[superlink.{self.name}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.log = home / "superlink.log"
        cmd = [str(Path(sys.executable).parent / "flower-superlink"), "--insecure", "--simulation",
               "--host", "127.0.0.1", "--port", str(self.port), "--log-file", str(self.log),
               "--disable-runtime-dependency-installation"]
        self.process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        self.seen: dict[int, int] = {}  # pid -> start time (a reused pid is not ours)
        self._stop_watch = threading.Event()
        self._watch = threading.Thread(target=self._track, daemon=True)
        self._watch.start()
        deadline = time.monotonic() + startup_timeout
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the local SuperLink did not start (exit code {self.process.poll()}); "
                                   f"its log: {self.log}")
            time.sleep(0.2)

    def __enter__(self) -> LocalSuperLink:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def _track(self) -> None:
        while not self._stop_watch.wait(0.25):
            self.seen.update(_descendants(self.process.pid))

    def last_run_status(self) -> str:
        import json

        proc = subprocess.run([str(Path(sys.executable).parent / "flwr"), "ls", self.name, "--format", "json"],
                              env=self.env, capture_output=True, text=True, check=False)
        try:
            runs = json.loads(proc.stdout).get("runs", [])
        except ValueError:
            return f"unknown ({proc.stdout.strip()[-200:]} {proc.stderr.strip()[-200:]})"
        runs.sort(key=lambda r: r.get("pending-at", ""))
        return runs[-1].get("status", "unknown") if runs else "no run"

    def stop(self) -> None:
        """SIGTERM the SuperLink and everything it started, then SIGKILL what remains, by PID."""
        self.seen.update(_descendants(self.process.pid))
        self._stop_watch.set()
        self._watch.join()
        self.seen.update(_descendants(self.process.pid))
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
            if self.process.poll() is None:
                self.process.send_signal(sig)
            alive = [pid for pid, started in self.seen.items() if _start_time(pid) == started]
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while (alive or self.process.poll() is None) and time.monotonic() < deadline:
                time.sleep(0.05)
                alive = [pid for pid in alive if _start_time(pid) == self.seen[pid]]
            if not alive and self.process.poll() is not None:
                break
        self.process.wait()
        shutil.rmtree(self.home / "apps", ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot) from /proc, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else int(fields[19])  # a zombie is already gone


def _descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root`` (pid -> start time), from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        started = _start_time(pid)
        if started is not None:
            out[pid] = started
        stack.extend(children.get(pid, []))
    return out


# -- command line ----------------------------------------------------------------------------------
def add_engine_arguments(parser: argparse.ArgumentParser, *, workers_help: str | None = None) -> None:
    """``--engine``/``--workers``/``--num-cpus``/``--num-gpus`` (shared with the sweeps)."""
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="local: this project's engine (default); ray: `flwr run` on Flower's Ray engine")
    parser.add_argument("--workers", type=_workers_arg, default=None,
                        help=workers_help or "local engine: worker processes (default 'auto': in this process when "
                                             "the run is too small to repay starting workers, else the usable "
                                             "cores; 0 = in this process)")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="ray engine: CPUs per client actor")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="ray engine: GPU share per client actor")


def _workers_arg(text: str) -> int | None:
    """``--workers``: a count, or ``auto`` (None)."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of worker processes (0 = in this process) "
                                         "or 'auto'") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default="", help="flwr-style overrides or a TOML file")
    add_engine_arguments(parser)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = simulate(args.run_config, engine=args.engine, workers=args.workers, num_cpus=args.num_cpus,
                       num_gpus=args.num_gpus, verbose=args.verbose)
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        from fedpcd_app.engine import stop_forkserver

        stop_forkserver()
    print(out, flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the results are written and every worker stopped: skip the interpreter's teardown
