"""FedPCD's history cache: memory at ResNet-18 size, and what 16-bit storage does to μ.

Two tables, each dtype compared with float32 in the same run:

1. **Memory.** For each ``fedpcd-cache-dtype`` (float32, bfloat16, float16), a fresh
   process drives the real FedPCD strategy (``strategies.fedpcd``) at the ResNet-18 size
   (CIFAR-100 head) for ``--entries / --replies`` rounds with distinct clients, so the
   cache holds exactly ``--entries`` directions. Reported: the cache's own storage (bytes
   of the entries, and of the store: the rows in use), the strategy's other persistent
   buffers, the process's RSS before the strategy and its peak RSS
   (``resource.getrusage``, which includes the replies held by the harness and the
   libraries), and what the strategy added at its peak, ``strategy_peak_mb`` = peak RSS −
   RSS before, also as a multiple of the store (``strategy_peak_x_store``).
2. **Accuracy on real updates.** A plain FedPCD run on the digits task (``--model``,
   default the project's digits MLP): each round the sampled clients really train with
   ``client_app.training.local_sgd`` from the float32 run's θ_t; the same replies go to
   three FedPCD strategies (float32, bfloat16, float16 caches). Per round: the multipliers
   μ of the dual QP and the direction d_t = (θ_t − θ_{t+1})/η_g of each 16-bit run vs
   float32, as max relative differences ‖μ16 − μ32‖∞/‖μ32‖∞ and ‖d16 − d32‖/‖d32‖, plus
   the rounds whose active set differs.

    flock /tmp/fedpcd-heavy.lock python -m benchmarks.cache_memory
    python -m benchmarks.cache_memory --skip-memory --rounds 20 --json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import numpy as np
import torch

from fedcore import flat
from fedcore.config import load_config
from strategies import registry

DTYPES = ("float32", "bfloat16", "float16")


def _rss_mb() -> float:
    """Current resident set size (MB), from /proc (Linux)."""
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


@torch.no_grad()  # not a global switch: tests call this in the pytest process
def memory_row(dtype: str, size: str, entries: int, replies: int, seed: int) -> dict:
    """One dtype's memory figures (call in a fresh process: peak RSS is per process)."""
    from benchmarks.aggregation import SIZE_CONFIGS, build_replies, method_step, model_record, reply_pool

    arrays = model_record(size)
    spec = flat.spec_of(arrays)
    theta = flat.record_to_flat(arrays)
    lr = 0.05
    pool = reply_pool(theta, spec, replies, seed, lr)
    sizes = np.random.default_rng(seed).integers(50, 500, size=entries)
    base_rss = _rss_mb()
    strategy = registry.build(load_config({
        "method": "fedpcd", "num-clients": entries, "fraction-train": replies / entries, "lr": lr,
        "fedpcd-cache-dtype": dtype, **SIZE_CONFIGS[size]}))
    if strategy.state.cache.history < -(-entries // replies) - 1:
        raise SystemExit(f"fedpcd-history={strategy.state.cache.history} keeps fewer than {entries} entries")
    for rnd in range(1, -(-entries // replies) + 1):
        pids = list(range((rnd - 1) * replies, min(rnd * replies, entries)))  # all distinct
        strategy.set_model(arrays)
        method_step(strategy, rnd, build_replies(pool, pids, sizes, (), spec))
    cache = strategy.state.cache
    el = cache.store.element_size()
    buffers = (strategy.method._work, strategy.method._dir, cache._chunk)
    other = strategy.method.writer.nbytes + sum(t.numel() * t.element_size() for t in buffers if t is not None)
    # getrusage's high-water mark can trail /proc's current RSS by a few pages (the kernel
    # syncs per-thread RSS counters lazily): the current RSS is a lower bound of the peak too
    peak = max(_peak_rss_mb(), _rss_mb())
    store_mb = cache.store.numel() * el / 2**20
    return {"dtype": dtype, "size": size, "params": spec.dim, "entries": cache.size,
            "entries_mb": cache.size * spec.dim * el / 2**20,
            "store_mb": store_mb, "capacity": cache.capacity,
            "buffers_mb": other / 2**20, "rss_before_mb": base_rss,
            "peak_rss_mb": peak, "strategy_peak_mb": peak - base_rss,
            "strategy_peak_x_store": (peak - base_rss) / store_mb}


def real_updates_rows(rounds: int, model: str, seed: int) -> list[dict]:
    """Per-round μ and d_t of 16-bit caches vs float32 on genuine digits updates."""
    import strategies.fedpcd as fedpcd
    from benchmarks.aggregation import method_step
    from client_app.client_app import load_arrays
    from client_app.data import load_federated_data
    from client_app.models import initial_model
    from client_app.training import local_sgd
    from fedcore.seeding import derive_seed
    from fedpcd_app.server.sampler import build_sampler
    from tests.helpers import train_reply

    overrides = {"method": "fedpcd", "model": model, "seed": seed}
    cfg = load_config(overrides)
    data = load_federated_data(cfg)
    sampler = build_sampler(cfg)
    arrays = _record(initial_model(cfg))
    runs = {dt: registry.build(load_config({**overrides, "fedpcd-cache-dtype": dt})) for dt in DTYPES}
    captured: list[np.ndarray] = []
    original = fedpcd.dual_multipliers

    def capture(*args):  # records μ of the round's dual QP (called at most once a round)
        out = original(*args)
        captured.append(out[0].copy())
        return out

    fedpcd.dual_multipliers = capture
    rows = []
    try:
        for rnd in range(1, rounds + 1):
            replies = []
            for pid in sampler.sample(rnd):  # genuine local training from θ_t
                net = initial_model(cfg)
                load_arrays(net, arrays)
                x, y = data.client_train(pid)
                gen = torch.Generator().manual_seed(derive_seed(seed, "batches", rnd, pid))
                with torch.enable_grad():
                    res = local_sgd(net, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                                    lr=cfg.lr_at(rnd), generator=gen)
                replies.append(train_reply(_record(net), pid, num_examples=len(y), loss_before=1.0,
                                           train_loss=float(res.train_loss), num_steps=int(res.num_steps)))
            theta = flat.record_to_flat(arrays)
            eta_g = cfg.server_lr or cfg.lr_at(rnd)
            out = {}
            for dt, strat in runs.items():  # the same θ_t and replies for every dtype
                captured.clear()
                strat.set_model(arrays)
                new, metrics = method_step(strat, rnd, replies)
                mu = captured[0] if captured else np.zeros(0)
                out[dt] = (mu, (theta - flat.record_to_flat(new)) / eta_g, dict(metrics), new)
            mu32, d32, m32, arrays = out["float32"]  # the float32 run drives the model
            ref = float(np.abs(mu32).max(initial=0.0))
            row = {"round": rnd, "clients": len(replies), "constraints": int(m32[fedpcd.M_CONSTRAINTS]),
                   "active": int(m32[fedpcd.M_ACTIVE]), "mu_max": ref}
            for dt in DTYPES[1:]:
                mu, d, _, _ = out[dt]
                diff = float(np.abs(mu - mu32).max(initial=0.0)) if mu.shape == mu32.shape else float("inf")
                row[f"mu_rel_{dt}"] = diff / ref if ref > 0 else diff
                row[f"d_rel_{dt}"] = float(torch.linalg.vector_norm(d - d32) / torch.linalg.vector_norm(d32))
                row[f"active_same_{dt}"] = bool(mu.shape == mu32.shape and np.array_equal(mu > 0, mu32 > 0))
            rows.append(row)
    finally:
        fedpcd.dual_multipliers = original
    return rows


def _record(net):
    from flwr.app import ArrayRecord

    return ArrayRecord(net.state_dict())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="resnet18",
                        help="model size of the memory table (benchmarks.aggregation sizes)")
    parser.add_argument("--entries", type=int, default=70, help="cache entries of the memory table")
    parser.add_argument("--replies", type=int, default=10, help="replies per round of the memory table")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the real-update run")
    parser.add_argument("--model", default="mlp", help="model of the real-update run (digits task)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--worker", choices=DTYPES, help=argparse.SUPPRESS)  # one memory row, in-process
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(memory_row(args.worker, args.size, args.entries, args.replies, args.seed)))
        return 0
    if not args.skip_memory:
        mem = []
        for dt in DTYPES:  # a fresh process each: peak RSS is a per-process high-water mark
            cmd = [sys.executable, "-m", "benchmarks.cache_memory", "--worker", dt, "--size", args.size,
                   "--entries", str(args.entries), "--replies", str(args.replies), "--seed", str(args.seed)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            mem.append(json.loads(done.stdout.strip().splitlines()[-1]))
        ref = mem[0]
        for row in mem:
            row["entries_ratio"] = row["entries_mb"] / ref["entries_mb"]
            row["peak_ratio"] = row["peak_rss_mb"] / ref["peak_rss_mb"]
        if args.json:
            for row in mem:
                print(json.dumps({"table": "memory", **row}), flush=True)
        else:
            print(f"{'dtype':<9} {'params':>9} {'entries':>7} {'entries MB':>10} {'store MB':>9} {'capacity':>8} "
                  f"{'buffers MB':>10} {'RSS before':>10} {'peak RSS':>9} {'x f32':>6} {'peak x f32':>10} "
                  f"{'strategy peak':>13} {'x store':>7}")
            for r in mem:
                print(f"{r['dtype']:<9} {r['params']:>9} {r['entries']:>7} {r['entries_mb']:>10.1f} "
                      f"{r['store_mb']:>9.1f} {r['capacity']:>8} {r['buffers_mb']:>10.1f} {r['rss_before_mb']:>10.0f} "
                      f"{r['peak_rss_mb']:>9.0f} {r['entries_ratio']:>6.2f} {r['peak_ratio']:>10.2f} "
                      f"{r['strategy_peak_mb']:>13.0f} {r['strategy_peak_x_store']:>7.2f}", flush=True)
    if not args.skip_accuracy:
        rows = real_updates_rows(args.rounds, args.model, args.seed)
        if args.json:
            for row in rows:
                print(json.dumps({"table": "accuracy", **row}), flush=True)
        else:
            print(f"\n{'round':>5} {'m_prime':>7} {'active':>6} {'max mu':>9} "
                  + " ".join(f"{'mu rel ' + dt:>16} {'d rel ' + dt:>15} {'same set':>8}" for dt in DTYPES[1:]))
            for r in rows:
                print(f"{r['round']:>5} {r['constraints']:>7} {r['active']:>6} {r['mu_max']:>9.3g} "
                      + " ".join(f"{r['mu_rel_' + dt]:>16.2e} {r['d_rel_' + dt]:>15.2e} "
                                 f"{str(r['active_same_' + dt]):>8}" for dt in DTYPES[1:]))
            for dt in DTYPES[1:]:
                solved = [r for r in rows if r["active"] > 0]
                print(f"{dt}: max rel diff of mu {max((r['mu_rel_' + dt] for r in rows), default=0):.2e}, "
                      f"of d_t {max((r['d_rel_' + dt] for r in rows), default=0):.2e} over {len(rows)} rounds "
                      f"({len(solved)} with active constraints); active set differs in "
                      f"{sum(not r['active_same_' + dt] for r in rows)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
