"""Server memory and seconds per round of every exported strategy, built as a foreign app builds
it (``Cls(fraction_train=...)``: no ``num_clients``), beside its floor.

Each cell (strategy × clients a round × model size) runs in a process of its own, forked after
the imports, so its peak RSS is its own: a grid of ``4k`` nodes (a quarter sampled each round:
the ``k`` clients of a round are new and returning ones, so a history cache fills), ``--rounds`` rounds of Flower's
``configure_train`` → ``aggregate_train``, each round's ``k`` replies built as real Flower
Messages (every reply its own arrays: θ_t − η_l·g_i, g_i a shared drift plus the client's own
part) just before its aggregation, with every metric and record the method requires.

Reported per cell: ``peak_mb`` = the process's peak RSS − its RSS after the imports and the
initial model (what the round's replies, the strategy's state and its working memory took at
their worst), ``floor_mb`` = the bytes the round and the state must hold: the k replies' arrays
(and model-shaped records), θ_t and θ_{t+1}, and the strategy's state as it stands after the
last round (the tensors and arrays of its ``State``: FedPCD's cache entries, CRAFT's previous
update, SCAFFOLD's c, ...), ``x_floor`` = peak / floor, and ``s_round`` = median wall seconds of
a round's ``configure_train`` + ``aggregate_train`` over the rounds after the first
(``cpu_round`` its process CPU seconds). A cell whose floor exceeds ``--max-gb`` is not run and
says so. ``d=100k`` is a two-layer model of 100,352 parameters; ``resnet18`` the project's
ResNet-18 (CIFAR-100 head, 11.2 M). FedPCD runs with its float32 and its 16-bit
(``cache_dtype='bfloat16'``) cache.

    python -m benchmarks.server_memory                                   # the docs' table
    python -m benchmarks.server_memory --methods fedpcd,craft --clients 10,100 --sizes resnet18 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import time

import numpy as np
import torch

SIZES = ("100k", "resnet18")
CLIENTS = (10, 100, 1000)


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def model_record(size: str):
    from flwr.app import ArrayRecord

    if size == "resnet18":
        from benchmarks.aggregation import model_record as real

        return real("resnet18")
    gen = torch.Generator().manual_seed(0)
    shapes = {"fc1.weight": (96, 1024), "fc1.bias": (96,), "fc2.weight": (64, 96), "fc2.bias": (64,)}
    return ArrayRecord({k: torch.randn(*s, generator=gen) * 0.05 for k, s in shapes.items()})


def strategy_classes() -> dict[str, type]:
    import strategies

    return {c.method_class.name: c for n in strategies.__all__ if isinstance(c := getattr(strategies, n), type)
            and issubclass(c, strategies.FairStrategy) and c is not strategies.FairStrategy}


def state_bytes(obj, seen=None) -> int:
    """Bytes of the tensors and arrays reachable from a State (dataclasses, dicts, lists)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(state_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj)
                   if not f.name.startswith("_"))
    if isinstance(obj, dict):
        return sum(state_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v, seen) for v in obj)
    return 0


class Nodes:
    """The foreign app's grid as the strategy sees it: ``n`` connected node ids."""

    def __init__(self, n: int) -> None:
        self.ids = list(range(1, n + 1))

    def get_node_ids(self):
        return list(self.ids)


def cell(method: str, clients: int, size: str, rounds: int, cache_dtype: str | None) -> dict:
    """One cell, in this process (call it in a fresh one: peak RSS is per process)."""
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    from fedcore import flat, keys
    from tests.fakegrid import task_identity

    cls = strategy_classes()[method]
    arrays = model_record(size)
    spec = flat.spec_of(arrays)
    d = spec.dim
    base_mb = max(_rss_mb(), _peak_mb())  # a forked child starts with its parent's peak
    kwargs = {"fraction_train": 0.25}
    if cache_dtype is not None:
        kwargs["cache_dtype"] = cache_dtype
    with torch.no_grad(), task_identity():
        strategy = cls(**kwargs)
        grid = Nodes(4 * clients)
        gen = torch.Generator().manual_seed(1)
        drift = torch.randn(d, generator=gen) * 1e-2
        lr = strategy.lr
        times, cpus, extra_bytes = [], [], 0
        theta = flat.record_to_flat(arrays)
        for rnd in range(1, rounds + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            requests = strategy.configure_train(rnd, arrays, ConfigRecord(), grid)
            t_conf, c_conf = time.perf_counter() - t0, time.process_time() - c0
            replies = []
            for i, req in enumerate(requests):
                g = drift + 2e-2 * torch.randn(d, generator=gen)
                local = flat.flat_to_record(theta - lr * g, spec)
                metrics = {keys.NUM_EXAMPLES: 20 + i % 50, keys.TRAIN_LOSS: 1.0 + 0.01 * (i % 7),
                           keys.LOSS_BEFORE: 1.2 + 0.01 * (i % 7), keys.NUM_STEPS: 5}
                metrics.update({m: 0.5 for m in strategy.method.reads.metrics if m not in metrics})
                content = {keys.ARRAYS: local, keys.METRICS: MetricRecord(metrics)}
                for name in strategy.method.reads.records:
                    content[name] = flat.flat_to_record(1e-3 * g, spec)
                replies.append(Message(RecordDict(content), reply_to=req))
            extra_bytes = len(strategy.method.reads.records) * len(replies) * d * 4
            del requests
            t1, c1 = time.perf_counter(), time.process_time()
            new, _ = strategy.aggregate_train(rnd, replies)
            times.append(t_conf + time.perf_counter() - t1)
            cpus.append(c_conf + time.process_time() - c1)
            if new is None:
                raise RuntimeError(f"{method}: round {rnd} produced no model")
            arrays, theta = new, flat.record_to_flat(new)
            del replies, new
    k = len(strategy.expected)
    floor = k * d * 4 + extra_bytes + 2 * d * 4 + state_bytes(strategy.state)
    peak = _peak_mb() - base_mb
    timed = times[1:] or times
    return {"strategy": method + (f"[{cache_dtype}]" if cache_dtype else ""), "size": size, "params": d,
            "clients": k, "rounds": rounds, "peak_mb": round(peak, 1), "floor_mb": round(floor / 2**20, 1),
            "x_floor": round(peak / (floor / 2**20), 2), "state_mb": round(state_bytes(strategy.state) / 2**20, 1),
            "s_round": round(statistics.median(timed), 4), "cpu_round": round(statistics.median(cpus[1:] or cpus), 4)}


def _child(conn, *spec) -> None:
    try:
        conn.send(cell(*spec))
    except BaseException as exc:  # noqa: BLE001 - reported as the cell's row
        conn.send({"failed": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    conn.close()


def run_forked(method: str, clients: int, size: str, rounds: int, dtype: str) -> dict:
    """One cell in a child forked from this process (the imports done once, the peak its own)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, method, clients, size, rounds, dtype or None))
    proc.start()
    child.close()
    try:
        row = parent.recv()
    except EOFError:
        row = {"failed": f"the process died (exit code {proc.join() or proc.exitcode}: killed for memory?)"}
    proc.join()
    if "failed" in row:
        row = {"strategy": method + (f"[{dtype}]" if dtype else ""), "size": size, "clients": clients, **row}
    return row


def floor_estimate_gb(method: str, clients: int, size: str) -> float:
    d = 11_227_812 if size == "resnet18" else 100_352
    records = len(strategy_classes()[method]().method.reads.records)
    return (clients * (1 + records) + 2) * d * 4 / 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="", help="comma-separated run-config names (default: every strategy)")
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)), help="clients a round, comma-separated")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated of {', '.join(SIZES)}")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-gb", type=float, default=12.0, help="skip cells whose floor exceeds this")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    import strategies  # noqa: F401 - imported once, before the cells fork
    from tests.fakegrid import task_identity  # noqa: F401

    methods = [m for m in args.methods.split(",") if m] or sorted(strategy_classes())
    rows = []
    if not args.json:
        print(f"{'strategy':26s} {'size':9s} {'clients':>7s} {'peak MB':>9s} {'floor MB':>9s} {'x floor':>8s} "
              f"{'state MB':>9s} {'s/round':>8s} {'CPU s':>7s}")
    for size in args.sizes.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            for method in methods:
                for dtype in (("", "bfloat16") if method == "fedpcd" else ("",)):
                    est = floor_estimate_gb(method, clients, size)
                    name = method + (f"[{dtype}]" if dtype else "")
                    if est > args.max_gb:
                        row = {"strategy": name, "size": size, "clients": clients,
                               "skipped": f"floor {est:.1f} GB > --max-gb {args.max_gb}"}
                    else:
                        row = run_forked(method, clients, size, args.rounds, dtype)
                    rows.append(row)
                    if args.json:
                        print(json.dumps(row), flush=True)
                    elif "peak_mb" in row:
                        print(f"{row['strategy']:26s} {size:9s} {clients:7d} {row['peak_mb']:9.1f} "
                              f"{row['floor_mb']:9.1f} {row['x_floor']:8.2f} {row['state_mb']:9.1f} "
                              f"{row['s_round']:8.3f} {row['cpu_round']:7.3f}", flush=True)
                    else:
                        print(f"{name:26s} {size:9s} {clients:7d}   {row.get('skipped') or 'FAILED: ' + row['failed']}",
                              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
