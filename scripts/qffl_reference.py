"""The q-FFL authors' training loop on Synthetic(α, β), re-implemented in numpy, to tell
what the protocol gives from what this project's Flower pipeline gives.

    python scripts/qffl_reference.py --seeds 0 1 2 3 4 --q 0 1 --lr 0.1 --rounds 2000 \
        [--clients-per-round 10] [--batch-size 10] [--epochs 1] [--sampling size|uniform] \
        [--loss-before train|batch] [--json out.json]
    python scripts/qffl_reference.py --report out.json ...   # markdown table and curves of saved runs

It follows ``litian96/fair_flearn`` (read, not copied): ``flearn/trainers/qffedavg.py``
(the round), ``flearn/trainers/fedbase.py`` (``select_clients``: ``np.random.seed(round + 4)``,
``sampling = 2``: ``choice(N, m, replace=False, p = n_k / Σ n)``; ``aggregate2``),
``flearn/models/synthetic/mclr.py`` (one dense layer 60 → 10, Glorot-uniform kernel, zero
bias, softmax cross-entropy; its ``l2_regularizer`` is never added to the loss it
minimises), ``flearn/models/client.py`` and ``flearn/utils/model_utils.batch_data`` (each
local solve is ``epochs`` passes of mini-batch SGD in order, after shuffling the client's
arrays in place with ``np.random.seed(100)``: the same permutation again at every call).
Per round, for every drawn client k::

    F_k   = mean cross-entropy of θ_t on k's whole training split (before training)
    Δw_k  = (θ_t − θ_k) / lr                               (L = 1/lr)
    Δ_k   = (F_k + 1e-10)^q Δw_k
    h_k   = q (F_k + 1e-10)^(q−1) ‖Δw_k‖² + (1/lr)(F_k + 1e-10)^q
    θ_t+1 = θ_t − Σ Δ_k / Σ h_k        (q = 0: the uniform mean of the drawn models)

and the final per-client test accuracies give the authors' statistics (``plot_fairness.py``):
average, worst 10 % and best 10 % (mean of the ⌊0.1 N⌋ lowest / highest), and variance
``np.var(acc) · 10⁴`` (population variance in %²).

The data are this project's (:func:`client_app.data.synthetic.synthetic_users`, the same arrays a
run with ``dataset = 'synthetic'`` and the same ``seed`` uses), so a difference between this
script and a Flower run is the pipeline's, not the data's. ``--loss-before batch`` replaces F_k
by the loss on the client's first mini-batch (an ablation: how much the whole-split loss
matters); ``--sampling uniform`` draws clients uniformly (the authors' ``sampling = 1``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from client_app.data.synthetic import synthetic_users  # noqa: E402

EPS = 1e-10


def softmax_ce(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and the softmax probabilities of ``x @ w + b``."""
    z = x @ w + b
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    loss = -float(np.mean(np.log(p[np.arange(len(y)), y] + 1e-30)))
    return loss, p


def local_solve(w, b, x, y, order, perm, lr, epochs, batch_size):
    """``epochs`` passes of mini-batch SGD; ``order`` is permuted by ``perm`` first (in place,
    as ``batch_data``'s seeded shuffle of the client's lists)."""
    order[:] = order[perm]
    w, b = w.copy(), b.copy()
    xs, ys = x[order], y[order]
    for _ in range(epochs):
        for i in range(0, len(ys), batch_size):
            xb, yb = xs[i:i + batch_size], ys[i:i + batch_size]
            _, p = softmax_ce(w, b, xb, yb)
            p[np.arange(len(yb)), yb] -= 1.0
            p /= len(yb)
            w -= lr * (xb.T @ p)
            b -= lr * p.sum(axis=0)
    return w, b


def authors_step(diffs: np.ndarray, losses: np.ndarray, q: float, lr: float) -> np.ndarray:
    """``aggregate2`` of the authors' q-FedAvg: Σ Δ_k / Σ h_k for rows ``diffs`` = θ_t − θ_k
    and ``losses`` = F_k (θ_{t+1} = θ_t − the result)."""
    deltas, hs = [], []
    for diff, f in zip(diffs, losses):
        dw = diff / lr  # L (θ_t − θ_k), L = 1/lr
        fq = np.float_power(f + EPS, q)
        deltas.append(fq * dw)
        hs.append(q * np.float_power(f + EPS, q - 1) * float(dw @ dw) + fq / lr)
    return np.sum(deltas, axis=0) / np.sum(hs)


def run(seed: int, q: float, lr: float, rounds: int, m: int, batch_size: int, epochs: int,
        sampling: str, loss_before: str, alpha: float, beta: float, num_users: int, eval_every: int) -> dict:
    users = synthetic_users(num_users, alpha, beta, False, seed)
    xtr = [x.astype(np.float64) for x in users.x_train]
    ytr = users.y_train
    xte = [x.astype(np.float64) for x in users.x_test]
    yte = users.y_test
    n = np.array([len(y) for y in ytr], dtype=np.float64)
    d, c = xtr[0].shape[1], 10
    init = np.random.RandomState(123 + seed)
    limit = np.sqrt(6.0 / (d + c))
    w, b = init.uniform(-limit, limit, (d, c)), np.zeros(c)
    orders = [np.arange(len(y)) for y in ytr]
    perms = [np.random.RandomState(100).permutation(len(y)) for y in ytr]
    curve = []

    def accuracies():
        return np.array([np.mean(np.argmax(x @ w + b, axis=1) == y) for x, y in zip(xte, yte)])

    for t in range(rounds):
        if eval_every and t % eval_every == 0:
            a = accuracies()
            curve.append((t, float(a.mean()), float(np.mean(np.sort(a)[: int(0.1 * len(a))]))))
        np.random.seed(t + 4)
        p = n / n.sum() if sampling == "size" else None
        chosen = np.random.choice(len(n), min(m, len(n)), replace=False, p=p)
        diffs, losses = [], []
        for k in chosen:
            if loss_before == "train":
                f = softmax_ce(w, b, xtr[k], ytr[k])[0]
            else:
                first = orders[k][perms[k]][:batch_size]
                f = softmax_ce(w, b, xtr[k][first], ytr[k][first])[0]
            wk, bk = local_solve(w, b, xtr[k], ytr[k], orders[k], perms[k], lr, epochs, batch_size)
            diffs.append(np.concatenate([(w - wk).ravel(), b - bk]))
            losses.append(f)
        step = authors_step(np.array(diffs), np.array(losses), q, lr)
        w = w - step[: d * c].reshape(d, c)
        b = b - step[d * c:]
        if not np.all(np.isfinite(w)):
            return {"seed": seed, "q": q, "lr": lr, "diverged_at": t}
    a = accuracies()
    k = int(0.1 * len(a))
    s = np.sort(a)
    curve.append((rounds, float(a.mean()), float(s[:k].mean())))
    return {"seed": seed, "q": q, "lr": lr, "rounds": rounds, "average": float(a.mean()),
            "worst10": float(s[:k].mean()), "best10": float(s[-k:].mean()), "variance": float(np.var(a) * 1e4),
            "accuracies": a.tolist(), "curve": curve}


def report(paths: list[str]) -> str:
    """Markdown: one row per (file, lr, q) with the statistics over its seeds, and the curves."""
    lines = ["| sampling | batch | lr | rounds | q | seeds | average | worst 10 % | best 10 % | variance "
             "| clients at 0 % |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    curves = []
    for path in paths:
        d = json.loads(Path(path).read_text())
        a = d["args"]
        for lr in a["lr"]:
            for q in a["q"]:
                ok = [r for r in d["runs"] if r["lr"] == lr and r["q"] == q and "average" in r]
                if not ok:
                    continue
                cells = []
                for k in ("average", "worst10", "best10", "variance"):
                    v = np.array([r[k] for r in ok]) * (1 if k == "variance" else 100)
                    d0 = 0 if k == "variance" else 2
                    cells.append(f"{v.mean():.{d0}f}" + (f" ± {v.std(ddof=1):.{d0}f}" if len(v) > 1 else ""))
                zeros = np.mean([np.sum(np.array(r["accuracies"]) == 0) for r in ok])
                lines.append(f"| {a['sampling']} | {a['batch_size']} | {lr} | {a['rounds']} | {q:g} | "
                             f"{' '.join(str(r['seed']) for r in ok)} | " + " | ".join(cells) + f" | {zeros:.1f} |")
                if ok[0].get("curve") and len(ok[0]["curve"]) > 2:
                    pts = np.array([[p[1] for p in r["curve"]] for r in ok]) * 100
                    wst = np.array([[p[2] for p in r["curve"]] for r in ok]) * 100
                    ts = [p[0] for p in ok[0]["curve"]]
                    curves.append(f"{a['sampling']}, batch {a['batch_size']}, lr {lr}, q = {q:g} (mean over "
                                  f"{len(ok)} seed(s)), round: average / worst 10 % — " + ", ".join(
                                      f"{t}: {m:.1f} / {w:.1f}" for t, m, w in zip(ts, pts.mean(0), wst.mean(0))))
    return "\n".join(lines) + "\n\n" + "\n\n".join(f"* {c}" for c in curves) + "\n"


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--report":
        print(report(sys.argv[2:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--q", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--lr", type=float, nargs="+", default=[0.1])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--clients-per-round", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--sampling", choices=("size", "uniform"), default="size")
    ap.add_argument("--loss-before", choices=("train", "batch"), default="train")
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--beta", type=float, default=1.0)
    ap.add_argument("--num-users", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    results = []
    for lr in args.lr:
        for q in args.q:
            for seed in args.seeds:
                t0 = time.time()
                r = run(seed, q, lr, args.rounds, args.clients_per_round, args.batch_size, args.epochs,
                        args.sampling, args.loss_before, args.alpha, args.beta, args.num_users, args.eval_every)
                r["seconds"] = time.time() - t0
                results.append(r)
                if "diverged_at" in r:
                    print(f"lr {lr} q {q} seed {seed}: diverged at round {r['diverged_at']}", flush=True)
                else:
                    print(f"lr {lr} q {q} seed {seed}: avg {100 * r['average']:.2f} worst10 {100 * r['worst10']:.2f} "
                          f"best10 {100 * r['best10']:.2f} var {r['variance']:.0f} ({r['seconds']:.0f} s)", flush=True)
            ok = [r for r in results if r["lr"] == lr and r["q"] == q and "average" in r]
            if len(ok) > 1:
                stats = {k: np.array([r[k] for r in ok]) for k in ("average", "worst10", "best10", "variance")}
                print(f"== lr {lr} q {q} over {len(ok)} seeds: " + ", ".join(
                    f"{k} {v.mean() * (1 if k == 'variance' else 100):.2f} "
                    f"± {v.std(ddof=1) * (1 if k == 'variance' else 100):.2f}"
                    for k, v in stats.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
