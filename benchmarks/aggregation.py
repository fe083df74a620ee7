"""Server aggregation time of any registered method next to Flower's built-in FedAvg and
next to the method's own floor, all measured in the same rounds on the same replies.

For each model size and method: realistic train replies (the model's real ArrayRecord
shapes from ``client_app.models``, random perturbations of the seeded initial model),
``--rounds`` rounds of ``set_model`` + the method's step (:func:`method_step`: the round read from
the replies and ``method.aggregate``, the aggregation itself; the gate's checks are not timed)
with ``--replies`` clients sampled from ``--clients`` (so stateful
methods such as FedPCD's history cache reach their steady state), the last ``--timed``
rounds timed. In each timed round, right after the method and on the SAME replies:
Flower's ``flwr.serverapp.strategy.FedAvg().aggregate_train``, and, for the methods that
have one (:data:`FLOORS`), the method's *floor*: the least work its maths needs, done with
bare torch/numpy operations on buffers of the right shapes, with no method code:

* every floor: θ_t from its ArrayRecord and one pass over the replies (Δ_i = θ_t − θ_i of
  each reply written into a (k, d) buffer straight from the reply bytes; onto the device
  through one host row when ``--device`` is not the CPU), and the result (θ_t − g and its
  ArrayRecord);
* **FedPCD**: + the Gram rows of the k new entries against the cache, one (k × d)·(d × m')
  product with m' = the cache size the method reported that round, + the direction over
  the active entries only (a (d × a) matrix-vector product, a = its active constraints);
* **CRAFT**: + the per-group m × m Gram matrices (m²·d multiply-adds in all; the faster of
  torch's ``u @ u.T`` and numpy's, which is BLAS syrk, timed each round), + one m × d
  product (Δ_qᵀ c_q per group).

Times are medians over the timed rounds; ``ratio`` = method / Flower FedAvg (ratio of the
medians), ``floor_ratio`` = the median over the timed rounds of method / floor, both timed
back to back in the same round (paired: a busy machine slows both alike, so the pairs are
steadier than a ratio of medians). A ratio to Flower's FedAvg compares two different workloads, so it moves
with the machine (how fast its matrix products run against its memory); ``floor_ratio``
compares the method with its own arithmetic and should not.

    flock /tmp/fedpcd-heavy.lock python -m benchmarks.aggregation --sizes cnn,resnet18
    python -m benchmarks.aggregation --methods fedpcd,craft,fedavg --sizes resnet18 --replies 10 --json --check
    python -m benchmarks.aggregation --methods fedpcd,craft --sizes resnet18 --device cuda --json

``--json`` prints one object per line: strategy, params, replies, cache, seconds,
fedavg_seconds, ratio, floor_seconds, floor_ratio (null without a floor), floor_parts (the
floor's median seconds per part), device (+ size, rounds, timed, seconds_all and
floor_ratios: every timed round), cpu_seconds / fedavg_cpu_seconds / floor_cpu_seconds (process CPU time, all
threads) and floor_ratio_cpu (paired, like floor_ratio), threads. ``cache`` is the method's reported cache size
(a MetricRecord key ending in
``cache-size``; 0 for stateless methods). ``--check`` exits 1 when FedPCD's or CRAFT's
floor_ratio exceeds ``--check-limit`` (1.2) at ResNet-18 size: for a person or a script,
not a timed test. ``--device cuda`` runs the strategies with ``server-device=cuda`` and the
floors on the GPU (``benchmarks/gpu_check.sh`` calls it; :func:`run` is the same in Python).
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

from fedcore import flat, keys
from fedcore.config import load_config
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

    ``extra_metrics``: the further metrics a method reads (e.g. FedeRage's β_i), each a
    per-client value in (0, 1).
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


def method_step(strategy, server_round: int, replies):
    """The method's own step on well-formed replies (the gate's checks left out): the round read
    from them (:meth:`strategies.flower.FairStrategy.read_round`) and ``method.aggregate``, whose
    state the strategy keeps. Returns (the new model's ArrayRecord or None, the step's metrics)."""
    round_ = strategy.read_round(server_round, replies, strategy.context)
    step = strategy.method.aggregate(round_, strategy.state)
    strategy.state = step.state
    return strategy.model_record(step, round_), step.metrics


def cache_size(metrics) -> int:
    for key, value in dict(metrics or {}).items():
        if key.endswith("cache-size"):
            return int(value)
    return 0


# -- floors -------------------------------------------------------------------------------------
class Floor:
    """A method's floor (see the module docstring): bare operations on its own buffers,
    timed part by part. ``time(replies, theta, metrics)`` → {part: seconds} for one round."""

    def __init__(self, strategy, spec, device: torch.device) -> None:
        self.strategy, self.spec, self.device = strategy, spec, device
        self.d = spec.dim
        self.host: torch.Tensor | None = None  # (k, d) Δ rows on the host
        self.rows: torch.Tensor | None = None  # the same on the device (= host on the CPU)
        self.vec = torch.empty(self.d, dtype=torch.float32, device=device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, parts: dict, name: str, fn) -> None:
        self._sync()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        self._sync()
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0
        parts["cpu"] = parts.get("cpu", 0.0) + time.process_time() - c0

    def pass_over_replies(self, replies, arrays, theta, parts) -> torch.Tensor:
        k = len(replies)
        if self.host is None or self.host.shape[0] < k:
            self.host = torch.empty(k, self.d, dtype=torch.float32)
            self.rows = self.host if self.device.type == "cpu" else torch.empty(k, self.d, device=self.device)
        records = [r.content[keys.ARRAYS] for r in replies]

        def write():
            flat.record_to_flat(arrays, out=theta)  # θ_t from its record, as every method needs it
            if self.device.type == "cpu":
                flat.records_to_deltas(theta, records, out=self.host[:k])
            else:
                for i, rec in enumerate(records):
                    self.rows[i].copy_(flat.records_to_deltas(theta, [rec], out=self.host[i : i + 1])[0])

        self.timed(parts, "pass", write)
        return self.rows[:k]

    def result(self, theta, parts) -> None:
        # ``theta`` is this round's throwaway copy of θ_t
        self.timed(parts, "result", lambda: flat.flat_to_record(theta.sub_(self.vec.to(theta.device), alpha=0.1),
                                                                 self.spec))

    def time(self, replies, arrays, theta, metrics) -> dict[str, float]:
        """One round's parts; ``theta`` is a (d,) host buffer that θ_t is written into."""
        parts: dict[str, float] = {}
        rows = self.pass_over_replies(replies, arrays, theta, parts)
        self.maths(rows, metrics, parts)
        self.result(theta, parts)
        return parts

    def maths(self, rows, metrics, parts) -> None:
        raise NotImplementedError


class FedPCDFloor(Floor):
    """Gram rows of the k new entries against the m' cached ones, direction over the a active."""

    def maths(self, rows, metrics, parts) -> None:
        m_cache, active = int(metrics["fedpcd-cache-size"]), int(metrics["fedpcd-active"])
        entries = self.strategy.state.cache.store[:m_cache]  # the method's cache: right shape, real memory
        self.timed(parts, "gram_rows", lambda: rows @ entries.T)
        if active:
            coef = torch.rand(active, device=self.device)
            self.timed(parts, "direction", lambda: torch.mv(entries[:active].T, coef, out=self.vec))


class CraftFloor(Floor):
    """Per-group m × m Grams (the faster of torch and numpy/syrk) and one m × d product."""

    def maths(self, rows, metrics, parts) -> None:
        groups = self.strategy.method.groups(self.spec)
        options = {}
        t_parts: dict[str, float] = {}
        n_parts: dict[str, float] = {}
        self.timed(t_parts, "gram", lambda: [rows[:, a:b] @ rows[:, a:b].T for a, b in groups])
        options["torch"] = t_parts["gram"]
        if self.device.type == "cpu":
            arr = rows.numpy()
            self.timed(n_parts, "gram", lambda: [arr[:, a:b] @ arr[:, a:b].T for a, b in groups])
            options["numpy"] = n_parts["gram"]
        best = min(options, key=options.get)
        parts["gram"] = options[best]
        parts["cpu"] = parts.get("cpu", 0.0) + (t_parts if best == "torch" else n_parts)["cpu"]
        coef = torch.rand(rows.shape[0], device=self.device)
        self.timed(parts, "direction",
                   lambda: [torch.mv(rows[:, a:b].T, coef, out=self.vec[a:b]) for a, b in groups])


FLOORS = {"fedpcd": FedPCDFloor, "craft": CraftFloor}


def floor_for(method: str, strategy, spec, device):
    """The method's :class:`Floor`, or None (no floor defined; FedPCD with a 16-bit cache,
    whose products convert chunks: its floor would be a different computation)."""
    if method not in FLOORS:
        return None
    if method == "fedpcd" and strategy.state.cache.dtype != torch.float32:
        return None
    return FLOORS[method](strategy, spec, device)


def run(method: str, size: str, args) -> dict:
    """One method at one size (``args``: the parsed command line); the JSON row."""
    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

    from client_app.models import initial_model

    arrays = model_record(size)
    spec = flat.spec_of(arrays)
    theta = flat.record_to_flat(arrays)
    lr = 0.05
    cfg = load_config({"method": method, "num-clients": args.clients,
                       "fraction-train": args.replies / args.clients, "lr": lr, "server-device": args.device,
                       **SIZE_CONFIGS[size], **dict(args.set)})
    strategy = registry.build(cfg, model=initial_model(cfg))  # the model: CRAFT's layer groups, as the app
    device = strategy.device
    floor = floor_for(method, strategy, spec, device)
    flower = FlowerFedAvg(train_metrics_aggr_fn=lambda *_: None)
    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(50, 500, size=args.clients)
    pool = reply_pool(theta, spec, args.replies, args.seed, lr)
    extras = tuple(strategy.method.reads.records)
    metric_keys = tuple(k for k in strategy.method.reads.metrics if k not in _BASE_METRICS)
    ours, theirs, floors, metrics = [], [], [], None
    ours_cpu, theirs_cpu = [], []

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for rnd in range(1, args.rounds + 1):
        pids = np.sort(rng.choice(args.clients, size=args.replies, replace=False))
        replies = build_replies(pool, pids, sizes, extras, spec, metric_keys)
        strategy.set_model(arrays)
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = method_step(strategy, rnd, replies)[1]
        sync()
        t1, c1 = time.perf_counter(), time.process_time()
        if rnd > args.rounds - args.timed:
            ours.append(t1 - t0)
            ours_cpu.append(c1 - c0)
            plain = replies if not extras else build_replies(pool, pids, sizes, (), spec)
            t2, c2 = time.perf_counter(), time.process_time()
            flower.aggregate_train(rnd, plain)
            theirs.append(time.perf_counter() - t2)
            theirs_cpu.append(time.process_time() - c2)
            if floor is not None:
                floors.append(floor.time(replies, arrays, theta.clone(), dict(metrics)))
        elif floor is not None and rnd == args.rounds - args.timed:  # warm-up: the floor's buffers
            floor.time(replies, arrays, theta.clone(), dict(metrics))
        del replies
    sec, ref = statistics.median(ours), statistics.median(theirs)
    row = {"strategy": method, "size": size, "params": spec.dim, "replies": args.replies,
           "cache": cache_size(metrics), "rounds": args.rounds, "timed": args.timed, "device": str(device),
           "seconds": sec, "fedavg_seconds": ref, "ratio": sec / ref, "seconds_all": ours,
           "cpu_seconds": statistics.median(ours_cpu), "fedavg_cpu_seconds": statistics.median(theirs_cpu),
           "threads": torch.get_num_threads(),
           "floor_seconds": None, "floor_ratio": None, "floor_ratios": None, "floor_parts": None,
           "floor_cpu_seconds": None, "floor_ratio_cpu": None}
    if floors:
        cpu = [f.pop("cpu") for f in floors]
        totals = [sum(f.values()) for f in floors]
        row.update(floor_seconds=statistics.median(totals),
                   floor_ratio=statistics.median(s / f for s, f in zip(ours, totals)),
                   floor_ratios=[s / f for s, f in zip(ours, totals)],
                   floor_parts={k: statistics.median(f.get(k, 0.0) for f in floors) for k in floors[0]},
                   floor_cpu_seconds=statistics.median(cpu),
                   floor_ratio_cpu=statistics.median(s / f for s, f in zip(ours_cpu, cpu)))
    del strategy, pool, floor
    gc.collect()
    return row


def check(rows: list[dict], limit: float) -> list[str]:
    """The rows that fail ``--check``: FedPCD's or CRAFT's floor_ratio above ``limit`` at ResNet-18 size."""
    return [f"{r['strategy']} at {r['size']}: floor_ratio {r['floor_ratio']:.2f} > {limit}"
            for r in rows if r["strategy"] in ("fedpcd", "craft") and r["size"] == "resnet18"
            and r["floor_ratio"] is not None and r["floor_ratio"] > limit]


@torch.no_grad()  # not torch.set_grad_enabled(False): main() is also called from tests
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="", help="comma-separated (default: every registered method)")
    parser.add_argument("--sizes", default="cnn,resnet18", help=f"comma-separated of {', '.join(SIZE_CONFIGS)}")
    parser.add_argument("--replies", type=int, default=10, help="replies per round")
    parser.add_argument("--clients", type=int, default=100, help="client population N")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per method (warm-up + timed)")
    parser.add_argument("--timed", type=int, default=5, help="last rounds that are timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"),
                        help="server-device of the strategies and the device of the floors (default cpu)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra run-config value (e.g. fedpcd-cache-dtype=bfloat16); repeatable")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when FedPCD's or CRAFT's floor_ratio exceeds --check-limit at ResNet-18 size")
    parser.add_argument("--check-limit", type=float, default=1.2)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch and BLAS threads (0 = their defaults); 1 makes CPU seconds the work itself")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(args.threads)  # numpy's BLAS (CRAFT's Gram matrices)
        except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
            print("warning: threadpoolctl missing: numpy's BLAS keeps its threads", file=sys.stderr)
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
              f"{'seconds':>8} {'fedavg_s':>8} {'ratio':>6} {'floor_s':>8} {'floor_ratio':>11}")
    rows = []
    for size in sizes:
        for method in methods:
            row = run(method, size, args)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                fs = "-" if row["floor_seconds"] is None else f"{row['floor_seconds']:.3f}"
                fr = "-" if row["floor_ratio"] is None else f"{row['floor_ratio']:.2f}"
                print(f"{row['strategy']:<12} {row['size']:<9} {row['params']:>10} {row['replies']:>7} "
                      f"{row['cache']:>5} {row['seconds']:>8.3f} {row['fedavg_seconds']:>8.3f} "
                      f"{row['ratio']:>6.2f} {fs:>8} {fr:>11}", flush=True)
    failed = check(rows, args.check_limit) if args.check else []
    for line in failed:
        print(f"check failed: {line}", file=sys.stderr)
    return 1 if failed else 0


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
