"""Many registered clients, a fixed number per round: is a round flat in the registered count?

    flock /tmp/fedpcd-heavy.lock python -m benchmarks.load_clients \
        --clients 1000,10000 --per-round 100 --rounds 3 --model logreg [--repeat 3] [--json]

Every setting is a real ``python -m fedpcd_app.simulate --workers 0`` run (FedAvg, the default
config otherwise) in a child process whose process tree is sampled from /proc every 0.2 s.

Data (generated, written once per model under ``--work``): every client holds the SAME number of
examples at every registered count (``--per-client``, default 20), so a round's own work (100
clients × 20 examples) is identical at 1k and 10k registered clients and only what the app does per
*registered* client can differ. One file per model serves every count: it holds as many writers as
the largest count (``writer_id`` column; ``dataset-path`` parquet), and ``partitioner='writer'``
makes one client of each of ``num-clients`` writers drawn from it, so the data read is the same
file at every count (``data MB``: its float32 features):

* ``logreg``: Synthetic(1, 1) (the FedProx / q-FFL generator's recipe, client_app/data/synthetic.py)
  with a fixed n_k instead of the lognormal sizes: per user u_k, B_k ~ N(0, 1), v_k ~ N(B_k, 1),
  W_k, b_k ~ N(u_k, 1), x ~ N(v_k, diag(j^-1.2)), y = argmax(W_kᵀx + b_k); the 60 features are
  stored as a 6×10 "image". (The app's own ``dataset='synthetic'`` draws lognormal(4, 2) sizes:
  10,000 users ask for ~4.4 M examples, above its 1 M memory bound, so it cannot be used here.)
* ``mlp``: scikit-learn's digits (8×8) in its nine one-pixel shifts; each writer draws its examples
  from that pool (seeded, with replacement across writers).

Printed per registered count (medians over ``--repeat`` runs): wall time; round 1 (train, from
``rounds.jsonl``); the mean of the later rounds' train + aggregate time (the steady round);
``setup_s`` = wall − rounds − eval (imports, data build, the QUERY of every registered node,
report); the final evaluation over EVERY client's test split (the fairness contract: it grows
with the registered count by design; ``eval-every`` sets how often it runs, 0 = only after the
last round); the peak RSS of the process tree; and the dataset file's float32 features (the same
at every count). The last row is the ratio of the largest count to the smallest, measured in
the same invocation. ``uptime``'s load is printed beside the table: timings on a shared machine move;
memory does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

PROJECT = Path(__file__).resolve().parent.parent
MODELS = ("logreg", "mlp")


def _write(folder: Path, images: np.ndarray, labels: np.ndarray, writers: np.ndarray, n_test: int) -> Path:
    """train.parquet (with writer ids) and a central test.parquet of the first ``n_test`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    h, w = images.shape[1:]

    def table(x: np.ndarray, y: np.ndarray, wid: np.ndarray | None) -> pa.Table:
        rows = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1).astype(np.float32)), w)
        image = pa.FixedSizeListArray.from_arrays(rows, h)
        cols = {"image": image, "label": pa.array(y.astype(np.int64))}
        if wid is not None:
            cols["writer_id"] = pa.array(wid.astype(np.int64))
        return pa.table(cols)

    pq.write_table(table(images, labels, writers), folder / "train.parquet")
    pq.write_table(table(images[:n_test], labels[:n_test], None), folder / "test.parquet")
    return folder


def synthetic_images(clients: int, per_client: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic(1, 1) with n_k = ``per_client``: (clients·per_client, 6, 10) float32, labels."""
    rs = np.random.RandomState(seed)
    d, c = 60, 10
    sd = np.arange(1, d + 1) ** -0.6  # sqrt of diag(j^-1.2)
    u = rs.normal(0, 1.0, clients)
    b_mean = rs.normal(0, 1.0, clients)
    xs, ys = [], []
    for k in range(clients):
        v = rs.normal(b_mean[k], 1, d)
        w_k, b_k = rs.normal(u[k], 1, (d, c)), rs.normal(u[k], 1, c)
        x = v + sd * rs.normal(size=(per_client, d))
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w_k + b_k, axis=1))
    return np.concatenate(xs).reshape(-1, 6, 10), np.concatenate(ys)


def digits_images(clients: int, per_client: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``per_client`` examples per writer drawn from digits' nine one-pixel shifts."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = x.reshape(-1, 8, 8).astype(np.float32) / 16.0
    pool = np.concatenate([np.roll(x, (dy, dx), axis=(1, 2)) for dy in (-1, 0, 1) for dx in (-1, 0, 1)])
    labels = np.tile(y, 9)
    pick = np.random.default_rng(seed).integers(0, len(labels), clients * per_client)
    return pool[pick], labels[pick]


def write_dataset(folder: Path, model: str, clients: int, per_client: int, seed: int = 0) -> Path:
    """The generated ``dataset-path`` folder for ``model`` (module docstring); reused when present."""
    if (folder / "train.parquet").exists() and (folder / "test.parquet").exists():
        return folder
    make = synthetic_images if model == "logreg" else digits_images
    images, labels = make(clients, per_client, seed)
    writers = np.repeat(np.arange(clients), per_client)
    return _write(folder, images, labels, writers, n_test=min(len(labels), 2000))


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


def run(model: str, clients: int, per_round: int, rounds: int, per_client: int, data: Path, out: Path,
        extra: str = "", pool: int = 0) -> dict:
    """One simulate run; its timings from ``rounds.jsonl`` and its peak RSS."""
    overrides = (f"model='{model}' num-clients={clients} fraction-train={per_round / clients!r} "
                 f"num-server-rounds={rounds} partitioner='writer' min-partition-size={per_client} "
                 f"dataset-path='{data}' eval-every=0 checkpoint-every=0 output-dir='{out}' {extra}")
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "fedpcd_app.simulate", "--workers", "0",
                             "--run-config", overrides],
                            cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0, 0]

    def sample() -> None:
        while proc.poll() is None:
            driver, tree = _tree_rss(proc.pid)
            peak[0], peak[1] = max(peak[0], driver), max(peak[1], tree)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = proc.communicate()[0]
    wall = time.perf_counter() - t0
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{log[-4000:]}")
    with open(out / "rounds.jsonl") as fh:
        recs = [json.loads(line) for line in fh]
    later = [r["train_seconds"] + r.get("aggregate_seconds", 0.0) for r in recs[1:]]
    eval_s = recs[-1]["eval"]["eval_seconds"]
    rounds_s = sum(r["round_seconds"] for r in recs)
    return {"model": model, "clients": clients, "per_round": per_round, "rounds": rounds, "wall_s": wall,
            "first_round_s": recs[0]["train_seconds"],
            "round_s": float(np.mean(later)) if later else float("nan"),
            "eval_s": eval_s, "setup_s": wall - rounds_s - eval_s,
            "driver_mb": peak[0] / 2**20, "tree_mb": peak[1] / 2**20,
            "data_mb": pool * (60 if model == "logreg" else 64) * 4 / 2**20,
            "replies": [r["num_replies"] for r in recs]}


FIELDS = ("wall_s", "first_round_s", "round_s", "eval_s", "setup_s", "tree_mb", "data_mb")


def median_row(runs: list[dict]) -> dict:
    row = dict(runs[0])
    for key in (k for k in FIELDS + ("driver_mb",) if k in row):
        row[key] = statistics.median(r[key] for r in runs)
    row["runs"] = len(runs)
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'model':>6} {'clients':>7} {'/rnd':>4} {'wall s':>7} {'round1 s':>8} {'round s':>8} "
            f"{'eval s':>7} {'setup s':>7} {'tree MB':>8} {'data MB':>8}  replies")
    lines = [head]
    for r in rows:
        lines.append(f"{r['model']:>6} {r['clients']:>7} {r['per_round']:>4} {r['wall_s']:7.2f} "
                     f"{r['first_round_s']:8.3f} {r['round_s']:8.3f} {r['eval_s']:7.2f} {r['setup_s']:7.2f} "
                     f"{r['tree_mb']:8.0f} {r['data_mb']:8.1f}  {r['replies']}")
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    for model, rs in by_model.items():
        lo, hi = min(rs, key=lambda r: r["clients"]), max(rs, key=lambda r: r["clients"])
        if lo is hi:
            continue
        ratio = {k: hi[k] / lo[k] if lo[k] else float("nan") for k in FIELDS}
        label = f"{hi['clients']}/{lo['clients']}"
        lines.append(f"{model:>6} {label:>7} {'':>4} "
                     f"{ratio['wall_s']:7.2f} {ratio['first_round_s']:8.2f} {ratio['round_s']:8.2f} "
                     f"{ratio['eval_s']:7.2f} {ratio['setup_s']:7.2f} {ratio['tree_mb']:8.2f} "
                     f"{ratio['data_mb']:8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1000,10000", help="registered counts, comma-separated")
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--per-client", type=int, default=20, help="examples per client (every count)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="logreg", help="logreg | mlp | logreg,mlp")
    parser.add_argument("--repeat", type=int, default=1, help="runs per setting; medians reported")
    parser.add_argument("--set", default="", help="extra run-config overrides for every run")
    parser.add_argument("--work", default="/tmp/fedpcd-load")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not counts or min(counts) < args.per_round:
        parser.error(f"--model one of {MODELS} and every --clients >= --per-round ({bad or counts})")
    work = Path(args.work)
    rows = []
    for model in models:
        data = write_dataset(work / f"{model}-{max(counts)}x{args.per_client}", model, max(counts), args.per_client)
        for clients in counts:
            runs = [run(model, clients, args.per_round, args.rounds, args.per_client, data,
                        work / f"out-{model}-{clients}-{i}", args.set,
                        pool=max(counts) * args.per_client) for i in range(args.repeat)]
            rows.append(median_row(runs))
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"rows": rows, "load": load}, indent=1))
    else:
        print(table(rows))
        print(f"load average (1, 5, 15 min) at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
