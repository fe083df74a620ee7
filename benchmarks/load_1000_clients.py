"""Load: 1000 clients, 100 per round (CRAFT's setting) on digits, through Flower's simulation.

    flock /tmp/fedpcd-heavy.lock python benchmarks/load_1000_clients.py [--rounds 3]

scikit-learn's digits has 1437 pool examples: too few for 1000 clients with the >= 2
examples each that a local train/test split needs. The script therefore writes a local
copy (``dataset-path``) whose training pool is digits' 80 % pool in its nine one-pixel
shifts (dx, dy in {-1, 0, 1}: 12,942 images, ~13 per client), split near-iid by a Dirichlet
partitioner with alpha = 100 and min-partition-size = 2 (the foundation's iid partitioner
fails: it assigns the dataset to the flwr-datasets partitioner twice) and whose test
set is digits' 20 % hold-out; everything else is the default config.

Each setting runs in a child process; its process tree (driver, Ray's daemons, actors)
is sampled from /proc every 0.5 s. Printed: wall time, the first round (includes Ray
start-up), the mean train time of the later rounds, evaluation time, and the peak RSS
of the driver and of the whole tree, with ratios to a 100-client / 10-per-round
reference measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

PROJECT = Path(__file__).resolve().parent.parent


def write_dataset(folder: Path, seed: int = 0) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits

    folder.mkdir(parents=True, exist_ok=True)
    x, y = load_digits(return_X_y=True)
    x = x.reshape(-1, 8, 8).astype(np.float32) / 16.0
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(0.2 * len(y)))
    test, pool = perm[:n_test], perm[n_test:]
    shifts = [np.roll(x[pool], (dy, dx), axis=(1, 2)) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    splits = {"train": (np.concatenate(shifts), np.tile(y[pool], len(shifts))), "test": (x[test], y[test])}
    for name, (images, labels) in splits.items():
        table = pa.table({"image": [im.tolist() for im in images], "label": labels.astype(np.int64)})
        pq.write_table(table, folder / f"{name}.parquet")
    return folder


def _tree_rss(root: int) -> tuple[int, int]:
    """(RSS of ``root``, RSS summed over ``root`` and all its descendants), bytes."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            ppid, pages = int(fields[1]), int(fields[21])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
        rss[int(entry)] = pages * os.sysconf("SC_PAGE_SIZE")
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return rss.get(root, 0), total


def run(clients: int, per_round: int, rounds: int, data: Path, out: Path) -> dict:
    overrides = (f"num-clients={clients} fraction-train={per_round / clients} num-server-rounds={rounds} "
                 f"partitioner='dirichlet' dirichlet-alpha=100.0 min-partition-size=2 dataset-path='{data}' "
                 f"eval-every=0 checkpoint-every=0 output-dir='{out}'")
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "fedpcd_app.simulate", "--run-config", overrides],
                            cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0, 0]

    def sample() -> None:
        while proc.poll() is None:
            driver, tree = _tree_rss(proc.pid)
            peak[0], peak[1] = max(peak[0], driver), max(peak[1], tree)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = proc.communicate()[0]
    wall = time.perf_counter() - t0
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{log[-4000:]}")
    recs = [json.loads(line) for line in open(out / "rounds.jsonl")]
    later = [r["train_seconds"] + r.get("aggregate_seconds", 0.0) for r in recs[1:]]
    return {"clients": clients, "per_round": per_round, "rounds": rounds, "wall_s": wall,
            "first_round_s": recs[0]["train_seconds"], "round_s": float(np.mean(later)) if later else float("nan"),
            "eval_s": recs[-1]["eval"]["eval_seconds"], "driver_gb": peak[0] / 2**30, "tree_gb": peak[1] / 2**30,
            "replies": [r["num_replies"] for r in recs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default="/tmp/fedpcd-load")
    args = parser.parse_args()
    work = Path(args.work)
    data = write_dataset(work / "digits-shifted")
    ref = run(100, 10, args.rounds, data, work / "ref")
    big = run(args.clients, args.per_round, args.rounds, data, work / "load")
    print(f"{'setting':>16} {'wall s':>8} {'round 1 s':>9} {'later round s':>13} {'eval s':>7} "
          f"{'driver GB':>9} {'tree GB':>8}  replies")
    for r in (ref, big):
        print(f"{r['clients']:>5} / {r['per_round']:>3} /rnd {r['wall_s']:8.1f} {r['first_round_s']:9.2f} "
              f"{r['round_s']:13.2f} {r['eval_s']:7.2f} {r['driver_gb']:9.2f} {r['tree_gb']:8.2f}  {r['replies']}")
    print(f"{'ratio':>16} {big['wall_s'] / ref['wall_s']:8.2f} {big['first_round_s'] / ref['first_round_s']:9.2f} "
          f"{big['round_s'] / ref['round_s']:13.2f} {big['eval_s'] / ref['eval_s']:7.2f} "
          f"{big['driver_gb'] / ref['driver_gb']:9.2f} {big['tree_gb'] / ref['tree_gb']:8.2f}")


if __name__ == "__main__":
    main()
