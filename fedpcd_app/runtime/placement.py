"""Which GPUs a run gets: sweeps spread their runs over every visible GPU, one run's GPUs fixed
before its process initialises CUDA.

A run sees only its GPUs through ``CUDA_VISIBLE_DEVICES`` in its process's environment, set
before torch first talks to the driver; inside the run ``cuda`` (``cuda:0``) is the first of
them, so the server, its evaluation and ``server-device='auto'`` stay on the run's GPUs, and
local-engine worker *i* uses visible GPU *i* mod #visible (:mod:`fedpcd_app.runtime.pool`).

* :func:`~fedpcd_app.server.gpus.visible_gpus`: the physical ids this process may hand out
  (``CUDA_VISIBLE_DEVICES``'s entries when it is set, else ``0..n-1`` from torch; none without CUDA).
* :func:`slots`: the GPUs of each of a sweep's ``--jobs`` run processes, from ``--gpus-per-run``
  (``1``: a GPU each; ``2``: two each; ``0.5``: two runs share each GPU; default: the jobs
  spread evenly over the GPUs). A slot keeps its GPUs for the whole sweep (its process is reused).
* :func:`child_env`: a run process's environment for its slot.
* :func:`select` (``simulate --gpus 0,1``): this process's own GPUs, before CUDA starts.
* what a run records (``gpus`` in ``run.json`` and ``summary.json``): its process's
  :func:`~fedpcd_app.server.gpus.visible_gpus`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from fedpcd_app.server.gpus import ENV, cuda_count, env_ids, visible_gpus

__all__ = ["ENV", "PlacementError", "child_env", "parse_gpu_list", "parse_gpus_per_run", "select",
           "slots", "visible_gpus"]


class PlacementError(ValueError):
    """GPUs asked for that this machine cannot give (one line, naming the fix)."""


def parse_gpus_per_run(text: str | float | None) -> float | None:
    """``--gpus-per-run``: a whole number of GPUs, or a fraction 1/k (0.5, 0.25, ...: k runs per
    GPU); None = spread the jobs evenly."""
    if text is None or text == "auto":
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise PlacementError(f"--gpus-per-run {text!r}: give a number of GPUs (1, 2) or a share (0.5, 0.25)") from None
    if not value > 0 or not math.isfinite(value):
        raise PlacementError(f"--gpus-per-run {text!r}: must be > 0 (omit it to run on the CPU without GPUs)")
    if value >= 1 and value != int(value):
        raise PlacementError(f"--gpus-per-run {text!r}: above 1 give a whole number of GPUs (1, 2, 4)")
    if value < 1 and abs(1 / value - round(1 / value)) > 1e-6:
        raise PlacementError(f"--gpus-per-run {text!r}: below 1 give a share 1/k (0.5, 0.25, 0.2, ...)")
    return value


def slots(gpus: Sequence[str], jobs: int | None, gpus_per_run: float | None) -> list[tuple[str, ...]]:
    """The GPUs of each of the sweep's run processes (one tuple per process; ``()`` = no GPU).

    ``jobs``: the processes asked for (None: as many as the GPUs hold at ``gpus_per_run``, or
    1 without it). With ``gpus_per_run`` = g ≥ 1 each process gets g GPUs of its own; with
    g = 1/k, k processes share each GPU, filled GPU by GPU round-robin (so that a sweep with
    fewer jobs than room still uses every GPU). Without it, each process gets
    ``len(gpus) // jobs`` GPUs of its own when there are more GPUs than jobs, else one GPU,
    shared round-robin."""
    gpus = list(gpus)
    if not gpus:
        if gpus_per_run is not None:
            raise PlacementError(f"--gpus-per-run {gpus_per_run:g}: torch sees no GPU here; drop --gpus-per-run "
                                 "to run on the CPU")
        return [()] * (jobs or 1)
    if gpus_per_run is None:
        jobs = jobs or 1
        if jobs < len(gpus):
            each = len(gpus) // jobs
            return [tuple(gpus[j * each:(j + 1) * each]) for j in range(jobs)]
        return [(gpus[j % len(gpus)],) for j in range(jobs)]
    if gpus_per_run >= 1:
        each = int(gpus_per_run)
        room = len(gpus) // each
        if room == 0:
            raise PlacementError(f"--gpus-per-run {each}: only {len(gpus)} GPU(s) visible ({','.join(gpus)}); "
                                 f"give at most {len(gpus)}")
        table = [tuple(gpus[j * each:(j + 1) * each]) for j in range(room)]
    else:
        per_gpu = round(1 / gpus_per_run)
        room = per_gpu * len(gpus)
        table = [(gpus[j % len(gpus)],) for j in range(room)]
    jobs = room if jobs is None else jobs
    if jobs > room:
        raise PlacementError(f"--jobs {jobs} with --gpus-per-run {gpus_per_run:g} on {len(gpus)} GPU(s): at most "
                             f"{room} runs at once; lower --jobs or --gpus-per-run")
    return table[:jobs]


def child_env(slot: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A run process's environment: this one's, with ``CUDA_VISIBLE_DEVICES`` = the slot's GPUs
    (unchanged for an empty slot: a machine without GPUs)."""
    env = dict(os.environ if environ is None else environ)
    if slot:
        env[ENV] = ",".join(slot)
    return env


def parse_gpu_list(text: str) -> list[str]:
    """``simulate --gpus 0,1``: GPU ids (or UUIDs) as ``CUDA_VISIBLE_DEVICES`` takes them."""
    ids = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p or p.startswith("-") for p in ids) or len(set(ids)) != len(ids):
        raise PlacementError(f"--gpus {text!r}: give distinct GPU ids separated by commas, e.g. --gpus 0,1")
    return ids


def select(text: str, environ: dict[str, str] | os._Environ | None = None) -> list[str]:
    """``simulate --gpus``: this process sees only these GPUs. Ids as ``CUDA_VISIBLE_DEVICES``
    takes them (nvidia-smi's numbering); under an inherited ``CUDA_VISIBLE_DEVICES`` they must be
    among its entries. Must run before CUDA is initialised: torch is asked only after the
    variable is set (the driver reads it once, on its first call)."""
    import torch

    environ = os.environ if environ is None else environ
    ids = parse_gpu_list(text)
    if torch.cuda.is_initialized():
        raise PlacementError("--gpus: CUDA is already initialised in this process; choose the GPUs before "
                             "the run starts (or set CUDA_VISIBLE_DEVICES)")
    if ENV in environ:
        allowed = env_ids(environ[ENV])
        missing = [i for i in ids if i not in allowed]
        if missing:
            raise PlacementError(f"--gpus {text}: GPU(s) {','.join(missing)} are not in CUDA_VISIBLE_DEVICES="
                                 f"{environ[ENV]!r}; choose among them or unset it")
    environ[ENV] = ",".join(ids)
    seen = cuda_count()
    if seen < len(ids):
        raise PlacementError(f"--gpus {text}: torch sees {seen} of these {len(ids)} GPU(s) (CUDA stops at the "
                             "first id it does not know); give ids from nvidia-smi -L")
    return ids
