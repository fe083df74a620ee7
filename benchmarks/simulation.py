"""Per-round wall time of this app in Flower's simulation vs a plain PyTorch loop (the floor).

    flock /tmp/fedpcd-heavy.lock python benchmarks/simulation.py            # both settings
    python benchmarks/simulation.py --settings cnn --rounds 9 --json out.json

For each setting the app runs through :func:`fedpcd_app.simulate.simulate` (Ray actors,
the in-memory grid, ArrayRecord messages, the ClientApp) and the per-round times are read
from its ``rounds.jsonl`` (``train_seconds + aggregate_seconds [+ eval_seconds]``; round 1
carries Ray's start-up and is excluded). Then, in this process, the floor replays the very
same rounds: for each sampled client of each round (the ``sampled`` lists of the app's
run) it loads the global weights into one model, computes ``loss-before`` (the forward pass
over the local train split that every reply carries, needed by q-FFL, AFL and FedFV: the
floor includes it, so both sides do the same arithmetic), runs :func:`local_sgd` with the
app's seeded batch order, and averages the local models (FedAvg); on evaluation rounds it
scores every client's test split and the central set with the app's batched scorer. The
floor's train losses are checked against the app's (same clients, same batches, same
weights: they must agree to float rounding), so the two sides provably do the same work.

Settings (``--settings``):

* ``cnn``: FedPCD's CIFAR-10 CNN on CIFAR-10-shaped data generated here (``--train-images``
  32×32×3 uint8 images with class-dependent means, written as ``dataset-path`` parquet),
  100 clients, 10 per round, 1 local epoch, batch 128.
* ``digits``: the project's default digits MLP (sklearn digits, 20 clients, 5 per round,
  batch 16).

Ratios > 1 are the simulation's overhead (message building, serialisation into Ray's
object store, actor scheduling, grid polling, per-message model construction).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from client_app.data import load_federated_data  # noqa: E402
from client_app.models import initial_model  # noqa: E402
from client_app.training import evaluate, local_sgd  # noqa: E402
from fedcore.config import load_config  # noqa: E402
from fedpcd_app.evaluation import score_central, score_clients  # noqa: E402
from fedpcd_app.results import read_rounds  # noqa: E402
from fedcore.seeding import numpy_rng, torch_generator  # noqa: E402


def write_cifar_like(folder: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """CIFAR-10-shaped parquet data: 32×32×3 uint8 images, 10 classes, learnable.

    Each class has a fixed random mean image; an example is its class mean plus noise,
    so the CNN learns (the loss falls) rather than fitting pure noise.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = numpy_rng(seed, "benchmark-data")
    means = rng.uniform(60, 196, size=(10, 32, 32, 3))
    for split, n in (("train", n_train), ("test", n_test)):
        labels = rng.integers(0, 10, size=n)
        imgs = np.clip(means[labels] + rng.normal(0, 50, size=(n, 32, 32, 3)), 0, 255).astype(np.uint8)
        # Nested fixed-size lists H×W×C: the numeric-array form data.py reads.
        flat = pa.array(imgs.reshape(-1), type=pa.uint8())
        col = pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(flat, 3), 32), 32)
        pq.write_table(pa.table({"image": col, "label": pa.array(labels, type=pa.int64())}),
                       folder / f"{split}.parquet")
    return folder


def settings(args, data_dir: Path) -> dict[str, dict]:
    return {
        "cnn": {
            "method": "fedavg", "model": "cnn", "dataset-path": str(data_dir), "num-clients": 100,
            "fraction-train": 0.1, "local-epochs": 1, "batch-size": 128, "lr": 0.05,
            "dirichlet-alpha": 0.3, "min-partition-size": 10,
        },
        "digits": {"method": "fedavg"},  # the pyproject defaults are the digits MLP setting
    }


def round_seconds(rec: dict) -> tuple[float, float]:
    """(training round seconds, eval seconds) of one app round record: the whole training
    round (sampling, messages, replies, validation, aggregation) as the server timed it."""
    work = rec.get("round_seconds", rec["train_seconds"] + rec.get("aggregate_seconds", 0.0))
    return work, rec.get("eval", {}).get("eval_seconds", 0.0)


@torch.no_grad()
def load_vector(theta: torch.Tensor, params: list[torch.Tensor]) -> None:
    """Copy ``theta`` into the parameters (``vector_to_parameters`` would alias them to it,
    and local training would then overwrite the global model)."""
    start = 0
    for p in params:
        p.copy_(theta[start : start + p.numel()].view_as(p))
        start += p.numel()


def app_global_models(out_dir: Path, rounds: list[dict], model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """The app's global model (its parameters as one vector) at the start of each round:
    round r starts from the checkpoint of round r − 1, round 1 from ``model`` (the initial one)."""
    from fedpcd_app import checkpoint

    names = [n for n, _ in model.named_parameters()]
    start = {1: torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()}
    for rec in rounds[:-1]:
        arrays = checkpoint.load(checkpoint.path_for(out_dir, rec["round"])).arrays
        start[rec["round"] + 1] = torch.cat([torch.from_numpy(np.ascontiguousarray(arrays[n])).reshape(-1).float()
                                             for n in names])
    return start


def floor_run(overrides: dict, rounds: list[dict], starts: dict[int, torch.Tensor]) -> list[dict]:
    """Replay the app's rounds as a plain in-process PyTorch loop; per-round seconds.

    Each round starts from the app's own global model of that round (``starts``), so the
    two sides train from identical weights every round and their train losses agree to
    float rounding; the floor's own average is computed (and timed) all the same."""
    cfg = load_config(overrides)
    data = load_federated_data(cfg)
    model = initial_model(cfg)
    params = list(model.parameters())
    out = []
    for rec in rounds:
        r = rec["round"]
        theta = starts[r]
        t0 = time.perf_counter()
        locals_, sizes, losses = [], [], []
        for pid in rec["sampled"]:
            load_vector(theta, params)
            x, y = data.client_train(pid)
            if "loss_before" in rec:  # the app's clients computed loss-before: so does the floor
                evaluate(model, x, y, cfg.eval_batch_size)
            res = local_sgd(model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                            lr=cfg.lr_at(r), momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                            generator=torch_generator(cfg.seed, "batches", pid, r))
            locals_.append(torch.nn.utils.parameters_to_vector(params).detach().clone())
            sizes.append(len(y))
            losses.append(res.train_loss)
        w = torch.tensor(sizes, dtype=torch.float32)
        theta = (w / w.sum()) @ torch.stack(locals_)
        work = time.perf_counter() - t0
        # The floor's FedAvg result vs the app's next global model (None after the last round).
        gap = float((theta - starts[r + 1]).abs().max()) if r + 1 in starts else None
        ev = 0.0
        if "eval" in rec:
            t1 = time.perf_counter()
            load_vector(theta, params)
            score_clients(model, data, cfg.eval_batch_size)
            score_central(model, data, cfg.eval_batch_size)
            ev = time.perf_counter() - t1
        n = np.asarray(sizes, dtype=np.float64)
        out.append({"round": r, "work": work, "eval": ev, "model_gap": gap,
                    "train_loss": float(np.dot(n, losses) / n.sum())})
    return out


def breakdown(overrides: dict, rec: dict) -> dict[str, float]:
    """Seconds per round of each piece of a TRAIN message's path, measured in this process
    on the clients of one round (``rec``): what the ClientApp adds around the training."""
    import pickle

    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from client_app.client_app import model_for
    from fedcore.config import parse_run_config

    cfg = load_config(overrides)
    data = load_federated_data(cfg)
    arrays = ArrayRecord(initial_model(cfg).state_dict())
    raw = {**cfg.as_dict(), "server-round": rec["round"], "round-lr": cfg.lr}
    parts = dict.fromkeys(("config parse", "model build + load", "loss-before pass", "local training",
                           "reply ArrayRecord", "pickle request + reply"), 0.0)
    import client_app.client_app as ca

    ca._MODELS.clear()  # the first client builds the model, the others reuse it (as an actor does)

    def timed(name, fn):
        t = time.perf_counter()
        out = fn()
        parts[name] += time.perf_counter() - t
        return out

    for pid in rec["sampled"]:
        x, y = data.client_train(pid)
        timed("config parse", lambda: parse_run_config(raw))
        model = timed("model build + load", lambda: model_for(cfg, arrays))
        if "loss_before" in rec:
            timed("loss-before pass", lambda: evaluate(model, x, y, cfg.eval_batch_size))
        timed("local training", lambda: local_sgd(
            model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            generator=torch_generator(cfg.seed, "batches", pid, rec["round"])))
        reply = timed("reply ArrayRecord", lambda: ArrayRecord(model.state_dict()))
        request = RecordDict({"arrays": arrays, "config": ConfigRecord({**raw, "partition-id": pid})})
        timed("pickle request + reply", lambda: [pickle.loads(pickle.dumps(c, protocol=5))
                                                 for c in (request, RecordDict({"arrays": reply}))])
    return parts


def bench_setting(name: str, overrides: dict, args, workdir: Path) -> dict:
    from fedpcd_app.simulate import simulate

    overrides = {**overrides, "num-server-rounds": args.rounds, "eval-every": args.eval_every,
                 "seed": args.seed, "client-loss-before": args.loss_before,
                 # every round's global model on disk: the floor starts each round from it
                 "checkpoint-every": 1, "checkpoint-keep": args.rounds,
                 "output-dir": str(workdir / f"run-{name}")}
    t0 = time.perf_counter()
    out = simulate(overrides, num_cpus=args.num_cpus)
    app_total = time.perf_counter() - t0
    rounds = read_rounds(out)
    # The floor runs several passes, alternating torch's default thread count and one
    # thread (small batches and a busy machine favour one), and each round keeps its
    # fastest pass: this favours the floor, so the ratio is if anything pessimistic.
    starts = app_global_models(out, rounds, initial_model(load_config(overrides)))
    default_threads, floors = torch.get_num_threads(), []
    for i in range(args.floor_repeats):
        torch.set_num_threads(default_threads if i % 2 == 0 else 1)
        floors.append(floor_run(overrides, rounds, starts))
    torch.set_num_threads(default_threads)
    floor = [min(fs, key=lambda f: f["work"] + f["eval"]) for fs in zip(*floors)]
    parts = breakdown(overrides, rounds[1])
    rows = []
    for rec, fl in zip(rounds, floor):
        work, ev = round_seconds(rec)
        rows.append({"round": rec["round"], "eval_round": "eval" in rec, "app_work": work,
                     "app_eval": ev, "floor_work": fl["work"], "floor_eval": fl["eval"],
                     "loss_diff": abs(rec["train_loss"] - fl["train_loss"]), "model_gap": fl["model_gap"]})
    body = [r for r in rows if r["round"] > 1]  # round 1 carries Ray start-up
    plain = [r for r in body if not r["eval_round"]]

    def ratio(rs, with_eval):
        app = sum(r["app_work"] + (r["app_eval"] if with_eval else 0.0) for r in rs)
        fl = sum(r["floor_work"] + (r["floor_eval"] if with_eval else 0.0) for r in rs)
        return app / len(rs), fl / len(rs), app / fl

    a_ne, f_ne, r_ne = ratio(plain, False)
    a_we, f_we, r_we = ratio(body, True)
    evals = [r for r in body if r["eval_round"]]
    return {
        "setting": name, "rounds": args.rounds, "eval_every": args.eval_every,
        "first_round_seconds": rows[0]["app_work"] + rows[0]["app_eval"],
        "app_total_seconds": app_total,
        "no_eval": {"rounds": len(plain), "app_s": a_ne, "floor_s": f_ne, "ratio": r_ne,
                    "app_median_s": statistics.median(r["app_work"] for r in plain),
                    "floor_median_s": statistics.median(r["floor_work"] for r in plain)},
        "with_eval": {"rounds": len(body), "app_s": a_we, "floor_s": f_we, "ratio": r_we},
        "eval_round_cost": {"app_s": statistics.mean(r["app_eval"] for r in evals) if evals else None,
                            "floor_s": statistics.mean(r["floor_eval"] for r in evals) if evals else None},
        "max_train_loss_diff": max(r["loss_diff"] for r in rows),
        "max_model_gap": max(r["model_gap"] for r in rows if r["model_gap"] is not None),
        "aggregate_s": statistics.mean(r.get("aggregate_seconds", 0.0) for r in rounds[1:]),
        "breakdown_round": rounds[1]["round"],
        "breakdown_s": parts,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="cnn,digits", help="comma list of: cnn, digits")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--eval-every", type=int, default=3)
    p.add_argument("--train-images", type=int, default=50000,
                   help="generated train images (default: CIFAR-10's 50,000, ~500 per client)")
    p.add_argument("--test-images", type=int, default=10000, help="generated test images (CIFAR-10: 10,000)")
    p.add_argument("--loss-before", choices=("auto", "always"), default="auto",
                   help="client-loss-before: FedAvg does not use it (auto); 'always' adds the pass to both sides")
    p.add_argument("--num-cpus", type=float, default=1.0, help="client-resources-num-cpus")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--floor-repeats", type=int, default=2)
    p.add_argument("--json", default="", help="also write the results to this file")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be >= 3 (round 1 is excluded as Ray start-up)")
    with tempfile.TemporaryDirectory(prefix="fedpcd-bench-") as tmp:
        tmp = Path(tmp)
        data_dir = write_cifar_like(tmp / "cifar-like", args.train_images, args.test_images, args.seed)
        table = settings(args, data_dir)
        results = []
        for name in args.settings.split(","):
            if name not in table:
                p.error(f"unknown setting {name!r}: use cnn and/or digits")
            results.append(bench_setting(name, table[name], args, tmp))
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "num_cpus_per_client": args.num_cpus, "train_images": args.train_images,
            "test_images": args.test_images, "client_loss_before": args.loss_before}
    print(f"# {meta['date']}  {meta['machine']}  {meta['cpus']} CPUs, torch {meta['torch']}, "
          f"client-resources-num-cpus={args.num_cpus}, cnn data {args.train_images}/{args.test_images} "
          f"train/test images, client-loss-before={args.loss_before}")
    print(f"{'setting':8} {'rounds':>6} {'app s/rnd':>10} {'floor s/rnd':>12} {'ratio':>6}   "
          f"{'+eval app':>10} {'+eval floor':>12} {'ratio':>6}   {'eval app/floor s':>17}  {'max |Δloss|':>11}  {'max |Δθ|':>9}")
    for r in results:
        ne, we, ec = r["no_eval"], r["with_eval"], r["eval_round_cost"]
        ecs = f"{ec['app_s']:.3f}/{ec['floor_s']:.3f}" if ec["app_s"] is not None else "-"
        print(f"{r['setting']:8} {ne['rounds']:>6} {ne['app_s']:>10.3f} {ne['floor_s']:>12.3f} {ne['ratio']:>6.2f}   "
              f"{we['app_s']:>10.3f} {we['floor_s']:>12.3f} {we['ratio']:>6.2f}   {ecs:>17}  "
              f"{r['max_train_loss_diff']:>11.2e}  {r['max_model_gap']:>9.2e}")
    print("\nwhere a training round's time goes (seconds per round, in this process, summed over the"
          " round's clients;\nthe app runs them on parallel Ray actors; grid polling adds 0-0.1 s twice):")
    names = list(results[0]["breakdown_s"]) + ["server aggregation"]
    print(f"{'piece':26}" + "".join(f"{r['setting']:>10}" for r in results))
    for n in names:
        vals = [r["breakdown_s"].get(n, r["aggregate_s"]) if n != "server aggregation" else r["aggregate_s"]
                for r in results]
        print(f"{n:26}" + "".join(f"{v:>10.4f}" for v in vals))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
