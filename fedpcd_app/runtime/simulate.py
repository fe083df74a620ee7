"""One experiment on this machine: the ServerApp/ClientApp on the local engine or on Flower's Ray engine.

    python -m fedpcd_app.simulate --run-config "method='fedpcd' num-server-rounds=20"
    python -m fedpcd_app.simulate --workers 0 --run-config run_configs/digits_fedpcd.toml
    python -m fedpcd_app.simulate --engine ray --num-cpus 1 --num-gpus 0.25 --run-config "..."

``--run-config`` takes flwr's syntax (``key=value`` pairs, strings in inner quotes, or a
TOML file). One node per client partition (``num-clients``). Tests, sweeps and benchmarks
call :func:`simulate`. Prints the output folder on the last line.

Engines (same numbers for the same seed; ``tests/test_engine.py``; on the local engine the same
bytes with any ``--workers``: ``tests/test_worker_determinism.py``):

* ``local`` (default): :mod:`fedpcd_app.runtime.grid`. The ServerApp runs in this process on a
  :class:`~fedpcd_app.runtime.grid.LocalGrid`; the ClientApps run in ``--workers`` worker
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
  (SuperExec, the simulation, Ray's) is stopped by PID at the end. Ray is a private local
  instance unless ``--ray-address HOST:PORT|auto`` asks to join an existing cluster, whose
  nodes then host the run's client actors (docs/deployment.md, "5. A Ray cluster").
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client_app.data import DataError
from fedcore.config import ConfigError
from fedpcd_app.runtime.flwr_run import Interrupted, add_ray_address_argument, check_local_data, check_output_dir
from fedpcd_app.runtime.placement import PlacementError, select
from fedpcd_app.server.checkpoint import OutputError
from fedpcd_app.server.logs import AggregationStopped, RunFailed

ENGINES = ("local", "ray")
CLIENT_APP = "client_app.client_app:app"
CLIENT_BATCH = "client_app.batch_delivery:deliver_batch"  # a round's train requests to one process, together
# --workers auto: worker processes only when they repay their start (docs/performance.md, rule 1):
# starting the pool (forkserver, imports, data) costs about WORKER_START_S more wall time than
# running in process (measured on a quiet 2-core machine), and W workers save at most (1 − 1/W)
# of the clients' training time.
WORKER_START_S = 4.0
# What the ClientApp imports lazily (data loading): imported once in the forkserver the workers
# fork from, not once per worker. (No torch._dynamo: client_app.optim's local step never imports it.)
CLIENT_PRELOAD = ("client_app.data",)


def simulate(
    overrides: Mapping[str, Any] | str | None = None,
    *,
    engine: str = "local",
    workers: int | str | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    ray_address: str | None = None,
    verbose: bool = False,
) -> Path:
    """Run one experiment; returns its output folder (holding ``summary.json``).

    ``workers``: local engine, worker processes (``None`` or ``"auto"`` = :func:`auto_workers`,
    0 = this process). ``num_cpus``/``num_gpus``: Ray engine, each client actor's share.
    ``ray_address``: Ray engine, the existing cluster to join (``host:port`` or ``auto``;
    None: a private local Ray)."""
    if engine not in ENGINES:
        raise ConfigError(f"engine '{engine}' is not one of {', '.join(ENGINES)}: use --engine local or --engine ray")
    if ray_address and engine != "ray":
        raise ConfigError(f"--ray-address {ray_address} joins a Ray cluster with Flower's Ray engine: "
                          "add --engine ray (the local engine runs on this machine only)")
    if workers == "auto":
        workers = None
    if workers is not None and (not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"--workers {workers}: give 0 (in this process) or more worker processes")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    out = (_simulate_local(overrides, workers) if engine == "local"
           else _simulate_ray(overrides, num_cpus=num_cpus, num_gpus=num_gpus, ray_address=ray_address))
    if not (out / "summary.json").is_file():
        raise RuntimeError(f"the run did not finish: no summary.json in {out} (see the log above)")
    return out


# -- local engine --------------------------------------------------------------------------------
def _simulate_local(overrides, workers: int | None) -> Path:
    from fedpcd_app.runtime import execution
    from fedpcd_app.runtime.grid import run_local
    from fedpcd_app.runtime.pool import usable_cores
    from fedpcd_app.server.config import load_setup
    from fedpcd_app.server.server_app import make_server_app

    _check_output_dir_first(overrides)  # before any data is loaded or model built
    setup = load_setup(overrides)  # every key checked, strategy and model built, once
    workers = auto_workers(setup.cfg, usable_cores()) if workers is None else workers
    choice = execution.choose(setup.cfg, setup.model)  # rows or loop, threads: by the settings (execution.py)
    with execution.applied(choice), execution.heap_frozen():
        run_local(make_server_app(setup), CLIENT_APP, setup.cfg.num_clients, workers=workers,
                  run_config=setup.raw, warmup="fedpcd_app.runtime.simulate:load_client_data" if workers else None,
                  preload=client_preload(setup.cfg), batch=CLIENT_BATCH, execution=choice)
    return Path(setup.cfg.output_dir).resolve()


def client_preload(cfg) -> tuple[str, ...]:
    """:data:`CLIENT_PRELOAD`, and ``datasets`` and ``flwr_datasets`` (heavy imports) where this run's
    data loads through them: a hub dataset or the pathological partitioner."""
    from client_app.data import HUB_NAMES

    hf = (not cfg.dataset_path and cfg.dataset in HUB_NAMES) or cfg.partitioner == "pathological"
    return CLIENT_PRELOAD + (("datasets", "flwr_datasets.partitioner") if hf else ())


def _check_output_dir_first(overrides) -> None:
    from fedcore.config import parse_overrides, parse_run_config, resolve
    from fedpcd_app.server.results import default_output_dir

    raw = resolve(parse_overrides(overrides) if isinstance(overrides, str) else dict(overrides or {}))
    check_output_dir(raw.get("output-dir") or default_output_dir(parse_run_config(raw)))


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
    """A worker's warm-up at the start of each run it serves: its data, loaded while the server
    starts (the ClientApp would load it on its first message; either way once per data setting
    and process), and the notices said once per run forgotten (a reused worker says them in the
    new run's log as a new one would)."""
    from client_app.data import load_federated_data
    from client_app.vectorised import forget_notices
    from fedcore.config import parse_run_config

    forget_notices()

    load_federated_data(parse_run_config(run_config))


# -- Ray engine: `flwr run` against a private local SuperLink --------------------------------------
def _simulate_ray(overrides, *, num_cpus: float, num_gpus: float, ray_address: str | None = None) -> Path:
    from fedcore.config import parse_overrides, resolve
    from fedpcd_app.runtime.flwr_run import resolve_ray_address
    from fedpcd_app.server.config import check
    from fedpcd_app.server.results import default_output_dir

    ray_address = resolve_ray_address(ray_address) if ray_address else None  # a dead cluster: one line, now

    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    raw = resolve(overrides)
    cfg = check(raw)  # every key checked, nothing built or loaded: the run loads what it uses
    check_local_data(cfg)  # ...except a local folder: bad data is one line here, not a failed run behind Ray
    # The ServerApp runs from an installed copy of the app (another working directory).
    raw["output-dir"] = str(Path(raw["output-dir"] or default_output_dir(cfg)).resolve())
    check_output_dir(raw["output-dir"])
    from fedpcd_app.runtime.flwr_run import run_app

    federation = (f"num-supernodes={cfg.num_clients} client-resources-num-cpus={num_cpus:g} "
                  f"client-resources-num-gpus={num_gpus:g}")
    run_id, info = run_app(raw, federation, ray_address=ray_address)  # follows the run id flwr run printed
    status = info.get("status", "unknown")
    if status != "finished:completed":
        details = " ".join(str(info.get("status-details", "")).split())
        raise RuntimeError(f"flwr run {run_id} ended with status {status!r}" + (f": {details}" if details else ""))
    return Path(raw["output-dir"])


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
    parser = argparse.ArgumentParser(prog="python -m fedpcd_app.simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default="", help="flwr-style overrides or a TOML file")
    add_engine_arguments(parser)
    parser.add_argument("--gpus", default=None, metavar="IDS",
                        help="the GPUs this run uses, as CUDA_VISIBLE_DEVICES takes them (e.g. 0,1); the server "
                             "is on the first, local-engine worker i on GPU i mod their number (default: all visible)")
    add_ray_address_argument(parser)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.gpus is not None:
            select(args.gpus)  # before anything initialises CUDA: this process and its children see only these
        out = simulate(args.run_config, engine=args.engine, workers=args.workers, num_cpus=args.num_cpus,
                       num_gpus=args.num_gpus, ray_address=args.ray_address or None, verbose=args.verbose)
    except (ConfigError, DataError, PlacementError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OutputError as exc:  # a full disk: one line, the last checkpoint intact
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (AggregationStopped, RunFailed) as exc:  # summary.json says so (complete: false): one line
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C: one line; the workers/the flwr run are stopped
        print("interrupted: the run stopped (its rounds so far are checkpointed in its output-dir: resume-from "
              "continues it)", file=sys.stderr, flush=True)
        return 130
    finally:
        from fedpcd_app.runtime.pool import stop_forkserver

        stop_forkserver()
    print(out, flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the results are written and every worker stopped: skip the interpreter's teardown
