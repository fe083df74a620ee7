"""How the local engine computes a run: its clients batched (rows) or one by one, and the
run process's torch intra-op threads, chosen by a rule on the run's settings alone.

The rule reads the model's size and the device, never the machine's load at the moment, so
the same settings always take the same path (and the same seed gives the same bytes whenever
the same path runs):

* **threads**: on the CPU, a model under :data:`SMALL_MODEL` parameters runs the run's process
  (the server's aggregation, validation and evaluation) on one intra-op thread. Its operations
  last microseconds; on two threads each wakes an OpenMP/MKL team that slept while the clients
  trained, which costs many times the operation and made the digits round several times slower
  than on one thread, most of it spinning (docs/performance.md, rule 2). The clients already
  train on one thread (:data:`fedpcd_app.runtime.node.CLIENT_THREADS`), so everything then runs
  on one. A larger model, or a GPU, keeps torch's own count. numpy's BLAS (OpenBLAS: the
  server's reply validation takes each update's norm with ``np.dot``) runs on one thread too
  (``threadpoolctl``, where installed: ``blas_threads``): its team woke for every reply's dot
  product, which made reply validation a large part of the digits round at two threads.
* **freed memory kept for reuse** (glibc, where present: ``malloc``): the run's process (and each
  worker) serves allocations under :data:`MALLOC_MMAP_THRESHOLD` from its heap and keeps up to
  :data:`MALLOC_TRIM_THRESHOLD` of freed memory instead of handing it back to the system at every
  free (``mallopt``; :func:`keep_freed_memory`). A digits round allocates and frees a few MB
  (the rows' stacked parameters, the replies' bytes, the aggregation's blocks) in pieces of
  100 KB-1 MB, glibc's default threshold (128 KB, raised only as large blocks are freed) mapped and
  unmapped them afresh, faulting their pages in again every round; with the thresholds set they
  stay (docs/performance.md, rule 3). (A process that had imported ``torch._dynamo`` -- the loop's
  first ``torch.optim.SGD`` did, before ``client_app.optim`` -- had grown its heap past the point
  where it trims, which is why the loop, and the benchmark's floor after it, never paid them.) No
  number depends on it.
* **clients**: ``client-execution = 'auto'`` trains a process's clients as rows for the models
  :data:`client_app.vectorised.AUTO_MODELS` names for the device (measured faster than the loop
  there, or as fast: on the CPU the MLPs and ``logreg``; docs/performance.md, rule 4), else one by one, each message
  delivered on its own (:func:`client_app.batch_delivery.wants_batch`: no thread per message);
  ``loop`` and ``vectorised`` as they say.

:func:`choose` gives the choice; :func:`applied` sets the threads for the run. The local engine
records the choice in ``summary.json`` (``execution``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# the allocator's settings (the module docstring) live with the rest of how a process runs client
# code, where the workers read them too
from fedpcd_app.runtime.node import (
    MALLOC_MMAP_THRESHOLD,
    MALLOC_TRIM_THRESHOLD,
    keep_freed_memory,
    malloc_settings,
)

__all__ = ["MALLOC_MMAP_THRESHOLD", "MALLOC_TRIM_THRESHOLD", "SMALL_MODEL", "applied", "choose", "heap_frozen",
           "keep_freed_memory", "malloc_settings"]

SMALL_MODEL = 1 << 20  # parameters: under it, one intra-op thread on the CPU (see the module docstring)


def _blas_limit_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("threadpoolctl") is not None


def choose(cfg, model) -> dict[str, Any]:
    """The run's path: ``device``, ``parameters``, ``clients`` (``rows`` or ``loop``, for
    ``client-execution``), ``threads`` (the run process's intra-op threads), ``blas_threads``
    (numpy's BLAS: 1 with ``threads``, None = its own count, also without ``threadpoolctl``),
    ``malloc`` (the allocator's thresholds, None where not glibc) and ``rule``."""
    import torch

    from client_app.vectorised import AUTO_MODELS, auto_rows

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = sum(p.numel() for p in model.parameters())
    mode = cfg.client_execution
    if mode == "auto":
        clients = "rows" if auto_rows(cfg.model, device) else "loop"
    else:
        clients = "rows" if mode == "vectorised" else "loop"
    small = device == "cpu" and size < SMALL_MODEL
    threads = "one thread (torch, numpy BLAS): a model under" if small else "torch threads: not a CPU model under"
    return {"device": device, "parameters": int(size), "client_execution": mode, "clients": clients,
            "threads": 1 if small else torch.get_num_threads(),
            "blas_threads": 1 if small and _blas_limit_available() else None,
            "malloc": malloc_settings(),
            "rule": (f"{threads} "
                     f"{SMALL_MODEL} parameters; clients as rows where client-execution='auto' names the model "
                     f"for the device ({', '.join(AUTO_MODELS.get(device, ())) or 'none'}), else the per-client "
                     "loop")}


@contextlib.contextmanager
def applied(choice: dict[str, Any]) -> Iterator[None]:
    """The run's intra-op threads (and numpy's BLAS threads, ``blas_threads``) set for the block,
    then put back; the allocator's settings (``malloc``: :func:`keep_freed_memory`) made for the
    process."""
    import torch

    if choice.get("malloc"):
        keep_freed_memory()

    old = torch.get_num_threads()
    if choice["threads"] != old:
        torch.set_num_threads(choice["threads"])
    blas = contextlib.nullcontext()
    if choice.get("blas_threads"):
        from threadpoolctl import threadpool_limits

        blas = threadpool_limits(limits=choice["blas_threads"], user_api="blas")
    try:
        with blas:
            yield
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """What exists when the run starts (the imports: torch, flwr, the app, ~216k objects; the
    run's data and model) out of the cyclic collector's sight for the block (``gc.freeze``), then
    handed back (``gc.unfreeze``): a collection during a run walks only what the run made (the
    oldest generation's collections walked every imported object: docs/performance.md, rule 3).
    Where the caller froze its own already (a sweep's run
    process, :func:`fedpcd_app.analysis.runner.main`, froze its imports) nothing more is frozen: a
    run's setup frozen there would never be handed back, and whatever of it formed a cycle would
    outlive the run. Results do not depend on when garbage is collected."""
    import gc

    if gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
