"""A sweep's runs as Ray tasks, on a private local Ray or an existing Ray cluster.

    python -m fedpcd_app.sweep FILE --ray auto            # the cluster `ray start` made on this machine
    python -m fedpcd_app.sweep FILE --ray 10.0.0.1:6379   # a cluster's head (its GCS address)
    python -m fedpcd_app.sweep FILE --ray local           # a private Ray on this machine
    python -m fedpcd_app.sweep FILE --ray auto --num-cpus 4 --num-gpus 0.5   # each run's share

Each pending run is one Ray task (``ray.remote(num_cpus=..., num_gpus=..., max_calls=1)``:
a fresh worker process per run, as the local sweep's fresh process per run) that runs
:func:`fedpcd_app.analysis.runner.run_one` on the local engine, so a run is the same run as in a
local sweep: the same folder, ``run.json``, ``run.log`` and results, and the same numbers at
the same torch thread count (Ray sets a task's threads to its ``num_cpus``). Ray places the
tasks on the cluster's nodes by the resources they ask for; how many run at once is what the
cluster holds (``--jobs`` does not apply). A run's CPUs: ``--num-cpus`` (default 1), or its
``--workers`` if more; its local-engine workers: ``--workers``, default ``--num-cpus`` when
that is 2 or more, else 0 (in the run's process). Its GPUs: ``--num-gpus`` (fractions share
a GPU; Ray sets ``CUDA_VISIBLE_DEVICES`` to the task's GPUs); a run that asks for none sees no
GPU. Each run's ``run.json`` gains ``ray_node`` (the Ray node id, host name, IP address and
GPU ids it ran on).

The output folder must be on storage every node sees, at the same path (a shared file system:
NFS, a cluster's home or scratch folder; on one machine that holds trivially): the driver
writes each run's ``run.json`` there, the task writes the results next to it, and a task that
does not see its ``run.json`` fails with that one line. Resume, the progress bar and the
failure list are the local sweep's: finished runs (``summary.json``) are skipped, a failed run
is listed with its reason and does not stop the others. Every node needs this project and its
environment installed at the same path as the driver's (the tasks get the driver's
``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedpcd_app.analysis.layout import RUN_FILE
from fedpcd_app.analysis.runner import LOG_FILE, run_one
from fedpcd_app.server.results import write_json_atomic

PROJECT = Path(__file__).resolve().parents[2]
NODE_KEY = "ray_node"  # in run.json: where the run ran


class RaySweepError(ValueError):
    """A sweep that cannot run on Ray (bad address, --engine ray, a folder a node cannot see):
    one line; the sweep reports it as its own error."""


def task_resources(engine: Mapping[str, Any]) -> tuple[float, float, int]:
    """(CPUs, GPUs, local-engine workers) of one run's task from the sweep's engine arguments."""
    cpus = float(engine.get("num_cpus") or 1.0)
    gpus = float(engine.get("num_gpus") or 0.0)
    workers = engine.get("workers")
    if workers is None:
        workers = int(cpus) if cpus >= 2 else 0
    return max(cpus, float(workers)), gpus, int(workers)


def run_task(overrides: dict[str, Any], folder: str, engine: dict[str, Any], gpus: float) -> str:
    """The body of a run's Ray task, on whichever node Ray chose: record the node in
    ``run.json``, then the run as the local sweep runs it."""
    import ray

    if gpus == 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a run that asked for no GPU uses none (before torch does)
    ctx = ray.get_runtime_context()
    node = {"node-id": ctx.get_node_id(), "hostname": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(), "gpus": [str(g) for g in ray.get_gpu_ids()]}
    run_file = Path(folder) / RUN_FILE
    if not run_file.is_file():
        raise RaySweepError(f"{folder} is not visible on Ray node {node['hostname']} ({node['node-id'][:12]}): "
                            "--out must be on storage every node sees, at the same path")
    write_json_atomic(run_file, {**json.loads(run_file.read_text()), NODE_KEY: node})
    return run_one(overrides, folder, engine)


def connect(address: str) -> None:
    """``ray.init`` for the sweep's driver: ``local`` starts a private Ray on this machine;
    otherwise the cluster at ``address`` (``host:port``, from :func:`check_ray`). The tasks get this process's
    ``PYTHONPATH`` (the project first), as Flower's Ray backend gives its actors."""
    import ray

    from fedpcd_app.runtime.pool import usable_cores

    parts = [str(PROJECT), *os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path]
    path = os.pathsep.join(p for p in dict.fromkeys(parts) if p)
    env = {"PYTHONPATH": path, "FLWR_TELEMETRY_ENABLED": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    kwargs: dict[str, Any] = {"num_cpus": usable_cores()} if address == "local" else {}
    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": env}, **kwargs)


def check_ray(address: str, engine: str = "local") -> str:
    """``--ray ADDRESS``: the address resolved and checked to answer, or RaySweepError (one line)."""
    from fedcore.config import ConfigError
    from fedpcd_app.runtime.flwr_run import resolve_ray_address

    if engine != "local":
        raise RaySweepError("--ray runs each run as a Ray task on the local engine; drop --engine ray "
                            "(or drop --ray to run each run on Flower's Ray engine)")
    try:
        return resolve_ray_address(address)
    except ConfigError as exc:
        raise RaySweepError(f"--ray: {exc}") from None


def run_sweep_ray(name: str, total: int, pending: list, out: Path, address: str, progress: bool = True,
                  engine: Mapping[str, Any] | None = None) -> list[tuple[Any, str]]:
    """Run the ``pending`` runs of a sweep (:class:`~fedpcd_app.analysis.sweep.RunSpec`, their
    folders and ``run.json`` written: :func:`fedpcd_app.analysis.sweep.prepare`) as Ray tasks on the
    Ray at ``address``; returns the failures ``(run, reason)`` (finished runs are kept), as
    :func:`fedpcd_app.analysis.sweep.run_sweep`. ``name`` and ``total``: the progress bar's."""
    import ray
    from tqdm import tqdm

    engine = dict(engine or {})
    address = check_ray(address, engine.get("engine", "local"))
    cpus, gpus, workers = task_resources(engine)
    run_engine = {"engine": "local", "workers": workers}
    failures: list[tuple[Any, str]] = []
    bar = tqdm(total=total, initial=total - len(pending), unit="run", desc=name, disable=not progress,
               dynamic_ncols=True)
    if not pending:
        bar.close()
        return failures
    connect(address)
    try:
        task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_calls=1, max_retries=0)(run_task)
        refs = {task.remote(r.overrides, str(r.folder(out)), run_engine, gpus): r for r in pending}
        remaining = list(refs)
        try:
            while remaining:
                done, remaining = ray.wait(remaining, num_returns=1)
                for ref in done:
                    run = refs[ref]
                    try:
                        ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - one failed run must not stop the sweep
                        reason = failure_reason(exc)
                        failures.append((run, reason))
                        bar.write(f"FAILED {run.folder(out)}: {reason} (log: {run.folder(out) / LOG_FILE})")
                    bar.set_postfix_str(f"{run.method} {run.variant} seed{run.seed}", refresh=False)
                    bar.update(1)
        except BaseException:  # Ctrl-C: the runs still going are stopped, not left on the cluster
            for ref in remaining:
                ray.cancel(ref, force=True)
            raise
    finally:
        bar.close()
        ray.shutdown()
    return failures


def failure_reason(exc: BaseException) -> str:
    """A failed task's one-line reason: the run's own exception, not Ray's wrapper around it."""
    import ray

    if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
        exc = exc.cause
    text = f"{type(exc).__name__}: {exc}"
    return next((ln for ln in text.splitlines() if ln.strip()), type(exc).__name__)
