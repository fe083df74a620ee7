"""Server aggregation time of any registered method next to Flower's built-in FedAvg.

For each model size and method: realistic train replies (the model's real ArrayRecord
shapes from ``client_app.models``, random perturbations of the seeded initial model),
``--rounds`` rounds of ``set_model`` + ``aggregate_valid`` (the aggregation itself; reply validation is not timed) with ``--replies`` clients
sampled from ``--clients`` (so stateful methods such as FedPCD's history cache reach their
steady state), the last ``--timed`` rounds timed; in the same rounds Flower's
``flwr.serverapp.strategy.FedAvg().aggregate_train`` is timed on the SAME replies.
Times are medians over the timed rounds; ratio = method / Flower FedAvg.

    flock /tmp/fedpcd-heavy.lock python -m benchmarks.aggregation --sizes cnn,resnet18
    python -m benchmarks.aggregation --methods fedpcd --replies 100 --json

``--json`` prints one object per line: strategy, params, replies, cache, seconds,
fedavg_seconds, ratio (+ size, rounds, timed). ``cache`` is the method's reported cache
size (a MetricRecord key ending in ``cache-size``; 0 for stateless methods).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time

import numpy as np
import torch

from fedcore.config import load_config
from fedcore import keys
from fedcore import flat
from strategies import registry

_BASE_METRICS = (keys.NUM_EXAMPLES, keys.TRAIN_LOSS, keys.LOSS_BEFORE, keys.PARTITION_ID, keys.NUM_STEPS)

SIZE_CONFIGS = {  # model size -> the run config that builds it
    "mlp": {"model": "mlp", "dataset": "fashion-mnist"},
    "cnn": {"model": "cnn", "dataset": "cifar10"},
    "resnet18": {"model": "resnet18", "dataset": "cifar100"},
}


def model_record(size: str):
    from flwr.app import ArrayRecord

    from client_app.models import initial_model

    return ArrayRecord(initial_model(load_config(SIZE_CONFIGS[size])).state_dict())


def reply_pool(theta: torch.Tensor, spec, count: int, seed: int, lr: float) -> list:
    """``count`` local models θ − η_l g_i, g_i = shared drift + client-specific part."""
    gen = torch.Generator().manual_seed(seed)
    scale = 1e-2  # per coordinate
    common = torch.randn(theta.numel(), generator=gen) * scale
    pool = []
    for _ in range(count):
        g = common + 2.0 * scale * torch.randn(theta.numel(), generator=gen)
        pool.append(flat.flat_to_record(theta - lr * g, spec))
    return pool


def build_replies(pool, pids, sizes, extra_records, spec, extra_metrics=()):
    """Train replies carrying the pool's models for the sampled partition ids.

    ``extra_metrics``: a method's further ``required_metrics`` (e.g. FedeRage's β_i), each
    a per-client value in (0, 1).
    """
    from tests.helpers import train_reply

    out = []
    for i, pid in enumerate(pids):
        extra = {name: pool[(i + 1) % len(pool)] for name in extra_records}
        metrics = {name: 0.5 + 0.004 * (int(pid) % 100) for name in extra_metrics}
        out.append(train_reply(pool[i % len(pool)], int(pid), num_examples=int(sizes[pid]),
                               loss_before=1.0 + 0.01 * pid, train_loss=0.9, num_steps=10,
                               extra_records=extra or None, extra_metrics=metrics or None))
    return out


def cache_size(metrics) -> int:
    for key, value in dict(metrics or {}).items():
        if key.endswith("cache-size"):
            return int(value)
    return 0


def run(method: str, size: str, args) -> dict:
    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

    arrays = model_record(size)
    spec = flat.spec_of(arrays)
    theta = flat.record_to_flat(arrays)
    lr = 0.05
    cfg = load_config({"method": method, "num-clients": args.clients,
                       "fraction-train": args.replies / args.clients, "lr": lr,
                       **SIZE_CONFIGS[size], **dict(args.set)})
    strategy = registry.build(cfg)
    flower = FlowerFedAvg(train_metrics_aggr_fn=lambda *_: None)
    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(50, 500, size=args.clients)
    pool = reply_pool(theta, spec, args.replies, args.seed, lr)
    extras = tuple(getattr(strategy, "required_records", ()))
    metric_keys = tuple(k for k in getattr(strategy, "required_metrics", ()) if k not in _BASE_METRICS)
    ours, theirs, metrics = [], [], None
    for rnd in range(1, args.rounds + 1):
        pids = np.sort(rng.choice(args.clients, size=args.replies, replace=False))
        replies = build_replies(pool, pids, sizes, extras, spec, metric_keys)
        strategy.set_model(arrays)
        t0 = time.perf_counter()
        _, metrics = strategy.aggregate_valid(rnd, replies)
        t1 = time.perf_counter()
        if rnd > args.rounds - args.timed:
            ours.append(t1 - t0)
            plain = replies if not extras else build_replies(pool, pids, sizes, (), spec)
            t2 = time.perf_counter()
            flower.aggregate_train(rnd, plain)
            theirs.append(time.perf_counter() - t2)
        del replies
    sec, ref = statistics.median(ours), statistics.median(theirs)
    row = {"strategy": method, "size": size, "params": spec.dim, "replies": args.replies,
           "cache": cache_size(metrics), "rounds": args.rounds, "timed": args.timed,
           "seconds": sec, "fedavg_seconds": ref, "ratio": sec / ref}
    del strategy, pool
    gc.collect()
    return row


@torch.no_grad()  # not torch.set_grad_enabled(False): main() is also called from tests
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="", help="comma-separated (default: every registered method)")
    parser.add_argument("--sizes", default="cnn,resnet18", help=f"comma-separated of {', '.join(SIZE_CONFIGS)}")
    parser.add_argument("--replies", type=int, default=10, help="replies per round")
    parser.add_argument("--clients", type=int, default=100, help="client population N")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per method (warm-up + timed)")
    parser.add_argument("--timed", type=int, default=3, help="last rounds that are timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra run-config value (e.g. fedpcd-cache-dtype=bfloat16); repeatable")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    args.set = [_typed(kv) for kv in args.set]
    methods = [m for m in args.methods.split(",") if m] or registry.names()
    sizes = [s for s in args.sizes.split(",") if s]
    for bad in [s for s in sizes if s not in SIZE_CONFIGS]:
        parser.error(f"--sizes: unknown size {bad!r}; choose from {', '.join(SIZE_CONFIGS)}")
    if not 1 <= args.timed <= args.rounds or args.replies > args.clients:
        parser.error("need 1 <= --timed <= --rounds and --replies <= --clients")
    logging.getLogger("flwr").setLevel(logging.WARNING)  # Flower's FedAvg logs every call
    if not args.json:
        print(f"{'strategy':<12} {'size':<9} {'params':>10} {'replies':>7} {'cache':>5} "
              f"{'seconds':>8} {'fedavg_s':>8} {'ratio':>6}")
    for size in sizes:
        for method in methods:
            row = run(method, size, args)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{row['strategy']:<12} {row['size']:<9} {row['params']:>10} {row['replies']:>7} "
                      f"{row['cache']:>5} {row['seconds']:>8.3f} {row['fedavg_seconds']:>8.3f} "
                      f"{row['ratio']:>6.2f}", flush=True)
    return 0


def _typed(kv: str) -> str:
    """``key=value`` with the value parsed like flwr's --run-config (numbers, bools)."""
    from fedcore.config import parse_overrides

    if "=" not in kv:
        raise SystemExit(f"error: --set {kv!r}: expected KEY=VALUE")
    key, value = kv.split("=", 1)
    try:
        parsed = parse_overrides(f"{key}={value}")[key]
    except Exception:  # noqa: BLE001 - a bare word is a string
        parsed = value
    return (key, parsed)


if __name__ == "__main__":
    sys.exit(main())
