"""Wall time of this app on both engines next to a plain PyTorch loop (the floor), and end to end.

    flock /tmp/fedpcd-heavy.lock python benchmarks/simulation.py            # everything, both engines
    python benchmarks/simulation.py --settings cnn --engines local --rounds 9 --no-e2e --json out.json
    python benchmarks/simulation.py --settings cnn --device cuda --workers 4 --num-cpus 4 --ray-num-gpus 0.25
    python benchmarks/simulation.py --settings digits --engines vectorised --rounds 9 --no-e2e --json out.json
    python benchmarks/simulation.py --settings digits,cnn --per-round 10,50,100 --engines local,vectorised --workers 0
    python benchmarks/simulation.py --training-only cnn:50:500:3072:128 --device cuda --conv-form grouped
    python benchmarks/simulation.py --rows-table OUT_DIR     # gpu_check.sh's rows table from its files

**Per round.** For each setting the app runs through :func:`fedpcd_app.runtime.simulate.simulate` on
each engine of ``--engines`` (``local``: this project's engine, ``--workers`` worker processes;
``ray``: ``flwr run`` on Flower's Ray engine, ``--num-cpus``/``--ray-num-gpus`` per actor;
``vectorised``: the local engine with ``client-execution = 'vectorised'``, each process's clients
of a round trained at once — :mod:`client_app.vectorised`; ``default``: the local engine at the
run config's default ``client-execution = 'auto'``, the path :mod:`fedpcd_app.runtime.execution`
chooses; ``local`` and ``ray`` run the per-client loop, ``client-execution = 'loop'``), and
the per-round times are read from its ``rounds.jsonl`` (the server's ``round_seconds`` [+
``eval_seconds``]; round 1 carries the engine's start-up and is excluded). Then, in this
process, the floor replays the very same rounds on ``--device``: for each sampled client of
each round (the ``sampled`` lists of the app's run, the same on both engines) it loads the
round's global weights into one model, computes ``loss-before`` when the app's clients did,
runs :func:`local_sgd` with the app's seeded batch order, and averages the local models
(FedAvg); on evaluation rounds it scores every client's test split and the central set with
the app's batched scorer. Each floor round starts from the first engine's global model of
that round (the checkpoints of an untimed re-run of it with ``checkpoint-every = 1``, which must
give the same rounds; the timed runs keep the setting's own checkpoint interval), so train
losses agree to float rounding: both sides provably
do the same work. Ratios > 1 are the engine's overhead (messages, serialisation, dispatch,
per-message model handling); < 1 means the app's parallel clients beat the one-process loop.
Both sides' **CPU time** per training round (process CPU time, every thread) is reported too where
the app ran in this process (``--workers 0``, or ``auto`` choosing it): on a machine shared with
other jobs wall times move with the load and CPU times much less (the ``no_eval_cpu`` medians).

**End to end** (unless ``--no-e2e``): ``python -m fedpcd_app.simulate`` as a user types it,
timed from the command to the process's exit (and to ``summary.json`` being written), for a
3-round digits FedPCD run and the 60-round default experiment (FedPCD, pyproject defaults),
on each engine (the local one with the default workers and with ``--workers 0``).

Settings (``--settings``):

* ``cnn``: FedPCD's CIFAR-10 CNN on CIFAR-10-shaped data generated here (``--train-images``
  32×32×3 uint8 images with class-dependent means, written as ``dataset-path`` parquet),
  100 clients, 10 per round, 1 local epoch, batch 128.
* ``digits``: the project's default digits MLP (sklearn digits, 20 clients, 5 per round,
  batch 16).
* ``synthetic``: logistic regression (``model = 'logreg'``) on the Synthetic dataset, 100 clients
  per round (all of them), batch 10 (needs the dataset and model of the issue "Numbers a
  researcher can trust").

``--per-round N1,N2,...`` runs each setting at N clients per round (``fraction-train`` =
N / ``num-clients``, ``num-clients`` raised to the largest N where it is smaller, the same for
every N of the setting), named ``setting@N``.

**Client training alone** (``--training-only``): one round's local training of the same jobs by
the per-client routine and by the rows (:func:`client_app.vectorised.run_entries`), on
``--device``, with the rows' convolutions as the device does them or as ``--conv-form`` says.

**The rows table** (``--rows-table DIR``): ``benchmarks/gpu_check.sh``'s rows files in DIR
(``rows_app.json``, this script's ``--json`` of the per-round runs; ``rows_training.jsonl``, one
``--training-only`` result a line) as the markdown table of docs/performance-archive.md §4 "Rows on
the GPU", and the models whose rows' round was faster than the loop's at every clients-per-round
measured: what ``AUTO_MODELS`` of :mod:`client_app.vectorised` may name for the device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from client_app.data import load_federated_data  # noqa: E402
from client_app.models import initial_model  # noqa: E402
from client_app.training import evaluate, local_sgd  # noqa: E402
from fedcore.config import load_config  # noqa: E402
from fedcore.seeding import numpy_rng, torch_generator  # noqa: E402
from fedpcd_app.server.evaluation import score_central, score_clients  # noqa: E402
from fedpcd_app.server.results import read_rounds  # noqa: E402

PROJECT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


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
        # Nested fixed-size lists H×W×C: the numeric-array form client_app/data/parquet.py reads.
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
            "dirichlet-alpha": 0.3, "min-partition-size": 10, "eval-batch-size": args.eval_batch_size,
        },
        "digits": {"method": "fedavg"},  # the pyproject defaults are the digits MLP setting
        "synthetic": {"method": "fedavg", "dataset": "synthetic", "partitioner": "natural", "model": "logreg",
                      "num-clients": 100,
                      "fraction-train": 1.0, "batch-size": 10, "lr": 0.05},
    }

ENGINES = ("local", "ray", "vectorised", "default")
# each engine's client-execution; "default": the local engine as a user runs it (client-execution
# 'auto': rows or the loop, and the threads, by fedpcd_app.runtime.execution's rule)
EXECUTION = {"local": "loop", "ray": "loop", "vectorised": "vectorised", "default": "auto"}


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
    from fedpcd_app.server import checkpoint

    names = [n for n, _ in model.named_parameters()]
    start = {1: torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()}
    for rec in rounds[:-1]:
        arrays = checkpoint.load(checkpoint.path_for(out_dir, rec["round"])).arrays
        start[rec["round"] + 1] = torch.cat([torch.from_numpy(np.ascontiguousarray(arrays[n])).reshape(-1).float()
                                             for n in names])
    return start


def floor_run(overrides: dict, rounds: list[dict], starts: dict[int, torch.Tensor],
              device: torch.device = CPU) -> list[dict]:
    """Replay the app's rounds as a plain in-process PyTorch loop; per-round seconds.

    Each round starts from the app's own global model of that round (``starts``), so the
    two sides train from identical weights every round and their train losses agree to
    float rounding; the floor's own average is computed (and timed) all the same."""
    cfg = load_config(overrides)
    data = load_federated_data(cfg)
    model = initial_model(cfg).to(device)
    params = list(model.parameters())
    out = []
    for rec in rounds:
        r = rec["round"]
        theta = starts[r].to(device)
        t0, c0 = time.perf_counter(), time.process_time()
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
        w = torch.tensor(sizes, dtype=torch.float32, device=device)
        theta = (w / w.sum()) @ torch.stack(locals_)
        if device.type == "cuda":
            torch.cuda.synchronize()
        work, work_cpu = time.perf_counter() - t0, time.process_time() - c0
        # The floor's FedAvg result vs the app's next global model (None after the last round).
        gap = float((theta.cpu() - starts[r + 1]).abs().max()) if r + 1 in starts else None
        ev = 0.0
        if "eval" in rec:
            t1 = time.perf_counter()
            load_vector(theta, params)
            score_clients(model, data, cfg.eval_batch_size)
            score_central(model, data, cfg.eval_batch_size)
            if device.type == "cuda":
                torch.cuda.synchronize()
            ev = time.perf_counter() - t1
        n = np.asarray(sizes, dtype=np.float64)
        out.append({"round": r, "work": work, "work_cpu": work_cpu, "eval": ev, "model_gap": gap,
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
            timed("loss-before pass", lambda model=model, x=x, y=y: evaluate(model, x, y, cfg.eval_batch_size))
        timed("local training", lambda model=model, x=x, y=y, pid=pid: local_sgd(
            model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            generator=torch_generator(cfg.seed, "batches", pid, rec["round"])))
        reply = timed("reply ArrayRecord", lambda model=model: ArrayRecord(model.state_dict()))
        request = RecordDict({"arrays": arrays, "config": ConfigRecord({**raw, "partition-id": pid})})
        timed("pickle request + reply",
              lambda request=request, reply=reply: [pickle.loads(pickle.dumps(c, protocol=5))
                                                    for c in (request, RecordDict({"arrays": reply}))])
    return parts


@contextlib.contextmanager
def round_cpu_seconds(into: dict[int, float]) -> Iterator[None]:
    """Record this process's CPU seconds (every thread's) of each training round the server runs
    in the block (``Experiment.train_round``, the span ``round_seconds`` times), by round."""
    from fedpcd_app.server.server_app import Experiment

    plain = Experiment.train_round

    def timed(self, state, server_round: int):
        c0 = time.process_time()
        try:
            return plain(self, state, server_round)
        finally:
            into[server_round] = time.process_time() - c0

    Experiment.train_round = timed
    try:
        yield
    finally:
        Experiment.train_round = plain


def run_app(overrides: dict, args, out_dir: Path, engine: str) -> tuple[Path, float, dict[int, float] | None]:
    """One run of the app on ``engine``; (its output folder, its wall seconds in this process,
    each round's CPU seconds in this process when every client ran in it, else None)."""
    from fedpcd_app.runtime.simulate import simulate

    cpu: dict[int, float] = {}
    t0 = time.perf_counter()
    with round_cpu_seconds(cpu):
        out = simulate({**overrides, "output-dir": str(out_dir), "client-execution": EXECUTION[engine]},
                       engine="ray" if engine == "ray" else "local", workers=args.workers,
                       num_cpus=args.num_cpus, num_gpus=args.ray_num_gpus)
    in_process = engine != "ray" and engine_label(engine, args, overrides).endswith("(in-process)")
    return out, time.perf_counter() - t0, cpu if in_process else None


def engine_label(engine: str, args, overrides: dict | None = None) -> str:
    if engine == "ray":
        return f"ray ({args.num_cpus:g} CPU{', %g GPU' % args.ray_num_gpus if args.ray_num_gpus else ''}/actor)"
    from fedpcd_app.runtime.pool import usable_cores
    from fedpcd_app.runtime.simulate import auto_workers

    workers = args.workers
    if workers is None:  # --workers auto, decided as simulate decides it
        workers = auto_workers(load_config(overrides), usable_cores()) if overrides is not None else usable_cores()
    return f"{engine} ({workers} worker{'s' if workers != 1 else ''})" if workers else f"{engine} (in-process)"


def per_round(overrides: dict, clients: int, most: int) -> dict:
    """The setting at ``clients`` clients per round (``most``: the largest of the sweep, so that
    every size of the sweep partitions the data over the same clients)."""
    total = max(int(overrides.get("num-clients", load_config(overrides).num_clients)), most)
    return {**overrides, "num-clients": total, "fraction-train": clients / total}


def bench_setting(name: str, overrides: dict, args, workdir: Path) -> list[dict]:
    """Per-round seconds of each engine next to the floor (replayed once, from the first engine's run)."""
    overrides = {**overrides, "num-server-rounds": args.rounds, "eval-every": args.eval_every,
                 "seed": args.seed, "client-loss-before": args.loss_before,
                 # no end-of-run figures: their drawing process (fedpcd_app/server/report_process.py,
                 # ~4 s of CPU) ran beside the next engine's rounds and inflated them (every engine
                 # after the first measured ~10 ms a digits round of waiting beyond its CPU time)
                 "figures": "none"}
    # The floor's starts: every round's global model on disk, from an untimed run of the first
    # engine with checkpoint-every = 1, run first. The timed runs then keep the setting's own
    # checkpoints (the run config's checkpoint-every: one written after every round made each next
    # digits round ~0.8 ms slower, its writes evicting the caches the round works in), and each
    # runs in a process that has run once already, as the floor (which runs last) always did (the
    # first run in a fresh process measured 0.2-0.3x the floor slower a round than the same engine
    # run later, whichever engine came first: the page faults of a heap trimmed at every round, which
    # a process that had imported torch._dynamo -- the loop's optimizer, the floor's -- no longer
    # paid; the run's process now keeps its freed memory, fedpcd_app.runtime.node.keep_freed_memory).
    # The first timed run must give the checkpointed run's rounds.
    first, _, _ = run_app({**overrides, "checkpoint-every": 1, "checkpoint-keep": args.rounds}, args,
                          workdir / f"run-{name}-{args.engines[0]}-checkpoints", args.engines[0])
    rounds0 = read_rounds(first)
    runs = {e: run_app(overrides, args, workdir / f"run-{name}-{e}", e) for e in args.engines}
    if [(r["sampled"], r["train_loss"]) for r in read_rounds(runs[args.engines[0]][0])] != \
            [(r["sampled"], r["train_loss"]) for r in rounds0]:
        raise RuntimeError("the timed run gave other rounds than the run with every round's checkpoint")
    # The floor runs several passes, alternating torch's default thread count and one
    # thread (small batches and a busy machine favour one), and each round keeps its
    # fastest pass: this favours the floor, so the ratio is if anything pessimistic.
    device = torch.device(args.device)
    starts = app_global_models(first, rounds0, initial_model(load_config(overrides)))
    default_threads, floors = torch.get_num_threads(), []
    for i in range(args.floor_repeats):
        torch.set_num_threads(default_threads if i % 2 == 0 else 1)
        floors.append(floor_run(overrides, rounds0, starts, device))
    torch.set_num_threads(default_threads)
    # per round: the pass of the fastest wall time, and the least CPU time of any pass
    floor = [{**min(fs, key=lambda f: f["work"] + f["eval"]), "work_cpu": min(f["work_cpu"] for f in fs)}
             for fs in zip(*floors)]
    parts = breakdown(overrides, rounds0[1])
    return [engine_result(name, engine, read_rounds(out), total, floor, parts, args, overrides, cpu)
            for engine, (out, total, cpu) in runs.items()]


def engine_result(name: str, engine: str, rounds: list[dict], total: float, floor: list[dict], parts: dict,
                  args, overrides: dict | None = None, cpu: dict[int, float] | None = None) -> dict:
    """One engine's row: per-round wall seconds against the floor's (and CPU seconds, when ``cpu``
    holds the app's rounds as :func:`run_app` timed them in process)."""
    rows = []
    for rec, fl in zip(rounds, floor):
        work, ev = round_seconds(rec)
        rows.append({"round": rec["round"], "eval_round": "eval" in rec, "app_work": work,
                     "app_eval": ev, "floor_work": fl["work"], "floor_eval": fl["eval"],
                     "app_work_cpu": cpu.get(rec["round"]) if cpu else None, "floor_work_cpu": fl.get("work_cpu"),
                     "loss_diff": abs(rec["train_loss"] - fl["train_loss"]), "model_gap": fl["model_gap"]})
    body = [r for r in rows if r["round"] > 1]  # round 1 carries the engine's start-up
    plain = [r for r in body if not r["eval_round"]]

    def ratio(rs, with_eval):
        app = sum(r["app_work"] + (r["app_eval"] if with_eval else 0.0) for r in rs)
        fl = sum(r["floor_work"] + (r["floor_eval"] if with_eval else 0.0) for r in rs)
        return app / len(rs), fl / len(rs), app / fl

    a_ne, f_ne, r_ne = ratio(plain, False)
    a_we, f_we, r_we = ratio(body, True)
    cpu_ne = None  # the training rounds' CPU time (rounds without evaluation), medians
    if plain and all(r["app_work_cpu"] is not None and r["floor_work_cpu"] is not None for r in plain):
        a_c = statistics.median(r["app_work_cpu"] for r in plain)
        f_c = statistics.median(r["floor_work_cpu"] for r in plain)
        cpu_ne = {"app_median_s": a_c, "floor_median_s": f_c, "ratio": a_c / f_c}
    evals = [r for r in body if r["eval_round"]]
    return {
        "setting": name, "engine": engine, "engine_label": engine_label(engine, args, overrides),
        "client_execution": EXECUTION[engine],
        "model": load_config(overrides).model if overrides is not None else None,
        "clients_per_round": len(rounds[-1].get("sampled", ())),
        "rounds": args.rounds, "eval_every": args.eval_every,
        "first_round_seconds": rows[0]["app_work"] + rows[0]["app_eval"],
        "app_total_seconds": total,
        "no_eval": {"rounds": len(plain), "app_s": a_ne, "floor_s": f_ne, "ratio": r_ne,
                    "app_median_s": statistics.median(r["app_work"] for r in plain),
                    "floor_median_s": statistics.median(r["floor_work"] for r in plain)},
        "no_eval_cpu": cpu_ne,
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


# -- client training alone: the per-client routine vs the rows, same jobs ---------------------------
def training_only(model_name: str, clients: int, examples: int, features: int, classes: int, batch_size: int,
                  repeats: int, seed: int = 0, device: str = "cpu", conv_form: str = "") -> dict:
    """Seconds (process CPU time, and wall) of one round's local training of ``clients`` clients,
    by the per-client routine (``local_sgd``, one client after the other) and by
    :func:`client_app.vectorised.run_entries` (rows), on the same jobs (data drawn here: Gaussian
    features, random labels; ``model_name`` 'logreg' = flatten + one Linear), the models on
    ``device`` (the data on the host, as a client's; CUDA synchronised before each clock reading).
    ``conv_form`` 'grouped' or 'unrolled' overrides how the rows batch convolutions on that
    device ('' = the device's own choice, :data:`client_app.row_forward.UNROLLED_CONVOLUTIONS`).
    The fastest of ``repeats`` each (after one warm-up), and the largest train-loss difference."""
    from flwr.app import ArrayRecord, RecordDict

    from client_app import row_forward, vectorised
    from client_app.methods import LocalTraining, TrainJob, get_client_method
    from client_app.models import build_model

    torch.manual_seed(seed)
    shape = (features,)
    if model_name == "logreg":
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(features, classes))
    else:
        shape = {64: (1, 8, 8), 3072: (3, 32, 32)}.get(features, (features,))
        model = build_model(model_name, shape, classes)
    arrays = ArrayRecord(model.state_dict())
    settings = LocalTraining(local_epochs=1, batch_size=batch_size)
    gen = torch_generator(seed, "training-only-data")
    data = [(torch.randn(examples, *shape, generator=gen), torch.randint(0, classes, (examples,), generator=gen))
            for _ in range(clients)]

    import copy

    # One model object per client, reused by every pass and both routines, its weights reset to
    # the start before each pass (untimed): the ClientApp reuses its model objects across
    # messages the same way (client_app.client_app.model_for), and the rows' per-object facts
    # (client_app.row_forward.model_info) are worked out once per object, as in a run.
    dev = torch.device(device)
    models = [copy.deepcopy(model).to(dev) for _ in data]
    start = model.state_dict()
    kind = dev.type
    unrolled = row_forward.UNROLLED_CONVOLUTIONS
    if conv_form:
        others = tuple(k for k in unrolled if k != kind)
        row_forward.UNROLLED_CONVOLUTIONS = others + (kind,) if conv_form == "unrolled" else others
        row_forward._FORWARDS.clear()

    def clock():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.process_time(), time.perf_counter()

    def jobs():
        for m in models:
            m.load_state_dict(start)
        return [TrainJob(cfg=settings, server_round=1, partition_id=i, lr=0.05, model=models[i],
                         global_arrays=arrays, x=x, y=y, generator=torch_generator(seed, "batches", i, 1),
                         request=RecordDict(), state=RecordDict(), config={}) for i, (x, y) in enumerate(data)]

    sgd = get_client_method("sgd")
    out = {"loop": [], "rows": []}
    losses = {}
    try:
        form = "unrolled" if row_forward.unrolled_on(models[0]) else "grouped"
        for r in range(repeats + 1):
            for how in ("loop", "rows"):
                js = jobs()
                c0, w0 = clock()
                if how == "loop":
                    res = [sgd.train(j) for j in js]
                else:
                    entries = [vectorised.Entry(sgd, j) for j in js]
                    vectorised.run_entries(entries, "vectorised")
                    res = [e.outcome for e in entries]
                c1, w1 = clock()
                if r:  # the first pass warms up (torch's lazy imports on the first optimizer, cuDNN's choices)
                    out[how].append((c1 - c0, w1 - w0))
                losses[how] = [o.train_loss for o in res]
    finally:
        row_forward.UNROLLED_CONVOLUTIONS = unrolled
        row_forward._FORWARDS.clear()
    best = {h: (min(c for c, _ in v), min(w for _, w in v)) for h, v in out.items()}
    return {"model": model_name, "clients": clients, "examples_per_client": examples, "features": features,
            "batch_size": batch_size, "repeats": repeats, "device": device,
            "conv_form": form if any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()) else None,
            "loop_cpu_s": best["loop"][0], "rows_cpu_s": best["rows"][0],
            "loop_wall_s": best["loop"][1], "rows_wall_s": best["rows"][1],
            "speedup_cpu": best["loop"][0] / best["rows"][0], "speedup_wall": best["loop"][1] / best["rows"][1],
            "max_train_loss_diff": max(abs(a - b) for a, b in zip(losses["loop"], losses["rows"]))}


# -- the rows table: gpu_check.sh's measurement as docs/performance-archive.md §4's table ---------------
def rows_table(app: list[dict], training: list[dict], meta: dict) -> str:
    """Markdown: where it was measured (``meta``: the per-round runs' ``--json`` meta); per model
    and clients per round, the app's round with the loop and with the rows (the local and
    vectorised engines' rows of :func:`engine_result`) and the plain loop's (the floor, on the
    benchmark's ``--device``); then client training alone (:func:`training_only`); then the models
    whose rows' round beat the loop's at every size measured. Figures taken without a GPU
    (``GPU_CHECK_SMOKE=1``) are said to be no GPU figures, and name no model for CUDA."""
    on_gpu = str(meta.get("device", "")).startswith("cuda") and bool(meta.get("gpu"))
    head = (f"Measured on {meta['gpu']} ({meta.get('date', '')}, torch {meta.get('torch', '')})." if on_gpu else
            "**Not measured here: no GPU.** These figures were taken on the CPU (the script's steps at a tiny "
            "size); they say nothing of the GPU.")
    by = {}
    for r in app:
        by.setdefault((r["model"], r["clients_per_round"]), {})[r["engine"]] = r
    out = [head, "", "| model | clients/round | loop app s/round | rows app s/round | plain loop s/round "
           "| **rows / plain loop** | rows / loop app |", "|---|---:|---:|---:|---:|---:|---:|"]
    faster: dict[str, bool] = {}
    for (model, n), engines in sorted(by.items()):
        loop, rows = engines.get("local"), engines.get("vectorised")
        if rows is None:
            continue
        floor = rows["no_eval"]["floor_s"]
        cells = [f"{loop['no_eval']['app_s']:.3f}" if loop else "—", f"{rows['no_eval']['app_s']:.3f}", f"{floor:.3f}",
                 f"**{rows['no_eval']['app_s'] / floor:.2f}**",
                 f"{rows['no_eval']['app_s'] / loop['no_eval']['app_s']:.2f}" if loop else "—"]
        out.append(f"| {model} | {n} | " + " | ".join(cells) + " |")
        won = loop is not None and rows["no_eval"]["app_s"] < loop["no_eval"]["app_s"]
        faster[model] = faster.get(model, True) and won
    if training:
        out += ["", "| model | clients | device | conv form | loop s | rows s | **loop / rows** | max Δ train loss |",
                "|---|---:|---|---|---:|---:|---:|---:|"]
        for t in training:
            out.append(f"| {t['model']} | {t['clients']} | {t['device']} | {t.get('conv_form') or '—'} | "
                       f"{t['loop_wall_s']:.4f} | {t['rows_wall_s']:.4f} | **{t['speedup_wall']:.2f}×** | "
                       f"{t['max_train_loss_diff']:.1e} |")
    chosen = tuple(m for m, ok in sorted(faster.items()) if ok)
    if on_gpu:
        out += ["", f"Rows' round faster than the loop's at every size measured: {', '.join(chosen) or 'none'} "
                f"(`AUTO_MODELS['cuda'] = {chosen!r}` in client_app/vectorised.py)."]
    else:
        out += ["", "No GPU: `AUTO_MODELS['cuda']` in client_app/vectorised.py stays as it is."]
    return "\n".join(out) + "\n"


# -- end to end: the command a user types, to the process's exit ------------------------------------
E2E_RUNS = {"fedpcd 3 rounds": "method='fedpcd' num-server-rounds=3",
            "fedpcd 60 rounds (default experiment)": "method='fedpcd'"}


def end_to_end(args, workdir: Path) -> list[dict]:
    """``python -m fedpcd_app.simulate`` timed from the command to exit, per run and engine."""
    variants = [("local", None), ("local", 0), ("ray", None)] if args.workers is None else \
        [("local", args.workers), ("ray", None)]
    out = []
    for what, run_config in E2E_RUNS.items():
        for engine, workers in variants:
            if engine not in args.engines:
                continue
            folder = workdir / f"e2e-{len(out)}"
            cmd = [sys.executable, "-m", "fedpcd_app.simulate", "--engine", engine,
                   "--run-config", f"{run_config} output-dir='{folder}'"]
            if engine == "local" and workers is not None:
                cmd += ["--workers", str(workers)]
            if engine == "ray":
                cmd += ["--num-cpus", f"{args.num_cpus:g}", "--num-gpus", f"{args.ray_num_gpus:g}"]
            t0 = time.time()
            proc = subprocess.run(cmd, cwd=PROJECT, capture_output=True, text=True)
            wall = time.time() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
            written = (folder / "summary.json").stat().st_mtime - t0
            from fedcore.config import parse_overrides

            label = engine_label(engine, argparse.Namespace(**{**vars(args), "workers": workers}),
                                 parse_overrides(run_config))
            out.append({"run": what, "engine": engine, "engine_label": label, "workers": workers,
                        "wall_s": wall, "summary_written_s": written, "exit_after_summary_s": wall - written,
                        "deprecation_banner": "deprecat" in (proc.stdout + proc.stderr).lower()})
    return out


def print_tables(meta: dict, results: list[dict], e2e: list[dict]) -> None:
    print(f"# {meta['date']}  {meta['machine']}  {meta['cpus']} CPUs, torch {meta['torch']}, floor on "
          f"{meta['device']}, cnn data {meta['train_images']}/{meta['test_images']} train/test images, "
          f"client-loss-before={meta['client_loss_before']}")
    print(f"{'setting':8} {'engine':28} {'rounds':>6} {'app s/rnd':>10} {'floor s/rnd':>12} {'ratio':>6}   "
          f"{'+eval app':>10} {'+eval floor':>12} {'ratio':>6}   {'round 1 s':>9}  {'max |Δloss|':>11}  "
          f"{'max |Δθ|':>9}")
    for r in results:
        ne, we = r["no_eval"], r["with_eval"]
        print(f"{r['setting']:8} {r['engine_label']:28} {ne['rounds']:>6} {ne['app_s']:>10.3f} {ne['floor_s']:>12.3f} "
              f"{ne['ratio']:>6.2f}   {we['app_s']:>10.3f} {we['floor_s']:>12.3f} {we['ratio']:>6.2f}   "
              f"{r['first_round_seconds']:>9.2f}  {r['max_train_loss_diff']:>11.2e}  {r['max_model_gap']:>9.2e}")
    cpus = [r for r in results if r.get("no_eval_cpu")]
    if cpus:
        print("\nCPU time of a training round without evaluation (median; this process's threads, app in process):")
        print(f"{'setting':8} {'engine':28} {'app CPU s':>10} {'floor CPU s':>12} {'ratio':>6}")
        for r in cpus:
            c = r["no_eval_cpu"]
            print(f"{r['setting']:8} {r['engine_label']:28} {c['app_median_s']:>10.4f} {c['floor_median_s']:>12.4f} "
                  f"{c['ratio']:>6.2f}")
    firsts = {r["setting"]: r for r in results if r["engine"] == "ray"}
    for r in results:
        ray = firsts.get(r["setting"])
        if r["engine"] == "local" and ray is not None:
            print(f"  {r['setting']}: local / ray per round {r['no_eval']['app_s'] / ray['no_eval']['app_s']:.2f} "
                  f"(with eval {r['with_eval']['app_s'] / ray['with_eval']['app_s']:.2f}); whole run "
                  f"{r['app_total_seconds']:.1f} s vs {ray['app_total_seconds']:.1f} s")
    seen = {}
    for r in results:
        seen.setdefault(r["setting"], r)
    if seen:
        print("\nwhere a training round's time goes (seconds per round, in this process, summed over the"
              " round's clients):")
        names = list(next(iter(seen.values()))["breakdown_s"]) + ["server aggregation"]
        print(f"{'piece':26}" + "".join(f"{s:>10}" for s in seen))
        for n in names:
            vals = [r["aggregate_s"] if n == "server aggregation" else r["breakdown_s"][n] for r in seen.values()]
            print(f"{n:26}" + "".join(f"{v:>10.4f}" for v in vals))
    if e2e:
        print("\nend to end: `python -m fedpcd_app.simulate`, from the command to the process's exit")
        print(f"{'run':40} {'engine':28} {'wall s':>7} {'summary at s':>12} {'exit lag s':>10}  banner")
        for e in e2e:
            print(f"{e['run']:40} {e['engine_label']:28} {e['wall_s']:>7.1f} {e['summary_written_s']:>12.1f} "
                  f"{e['exit_after_summary_s']:>10.2f}  {'DEPRECATION' if e['deprecation_banner'] else 'none'}")
        rays = {e["run"]: e for e in e2e if e["engine"] == "ray"}
        for e in e2e:
            if e["engine"] == "local" and e["run"] in rays:
                print(f"  {e['run']}, {e['engine_label']}: "
                      f"{rays[e['run']]['wall_s'] / e['wall_s']:.1f}× faster than ray")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="cnn,digits",
                   help="comma list of: cnn, digits, synthetic ('' = end to end only)")
    p.add_argument("--engines", default="local,ray",
                   help="comma list of: local, ray, vectorised, default (the first one feeds the floor)")
    p.add_argument("--workers", type=int, default=None,
                   help="local and vectorised engines' workers (default: --workers auto, as simulate decides)")
    p.add_argument("--num-cpus", type=float, default=1.0, help="ray engine: client-resources-num-cpus")
    p.add_argument("--ray-num-gpus", type=float, default=0.0, help="ray engine: client-resources-num-gpus")
    p.add_argument("--device", default="cpu", help="the floor's device (cpu, cuda); the app's clients use CUDA "
                                                   "whenever it is present")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--eval-every", type=int, default=3)
    p.add_argument("--eval-batch-size", type=int, default=128, help="cnn setting's eval-batch-size")
    p.add_argument("--train-images", type=int, default=50000,
                   help="generated train images (default: CIFAR-10's 50,000, ~500 per client)")
    p.add_argument("--test-images", type=int, default=10000, help="generated test images (CIFAR-10: 10,000)")
    p.add_argument("--loss-before", choices=("auto", "always"), default="auto",
                   help="client-loss-before: FedAvg does not use it (auto); 'always' adds the pass to both sides")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--floor-repeats", type=int, default=2)
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end command timings")
    p.add_argument("--json", default="", help="also write the results to this file")
    p.add_argument("--training-only", default="",
                   help="instead: client training alone, loop vs rows: MODEL:CLIENTS:EXAMPLES:FEATURES:BATCH "
                        "(e.g. logreg:100:60:60:10, the Synthetic logreg shape)")
    p.add_argument("--repeats", type=int, default=3, help="--training-only: timed passes (fastest kept)")
    p.add_argument("--conv-form", choices=("", "grouped", "unrolled"), default="",
                   help="--training-only: how the rows batch convolutions ('' = the device's own choice)")
    p.add_argument("--per-round", default="",
                   help="comma list of clients per round: each setting at each (named setting@N)")
    p.add_argument("--rows-table", default="", metavar="DIR",
                   help="instead: the rows table from gpu_check.sh's rows files in DIR (writes DIR/rows_table.md)")
    args = p.parse_args(argv)
    if args.rows_table:
        folder = Path(args.rows_table)
        app = json.loads((folder / "rows_app.json").read_text())
        lines = (folder / "rows_training.jsonl").read_text().splitlines() if (folder / "rows_training.jsonl").exists() \
            else []
        text = rows_table(app["results"], [json.loads(line) for line in lines if line.strip()], app["meta"])
        (folder / "rows_table.md").write_text(text)
        print(text)
        return 0
    if args.training_only:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            p.error(f"--device {args.device}: no CUDA device here")
        model_name, clients, examples, features, batch = args.training_only.split(":")
        res = training_only(model_name, int(clients), int(examples), int(features), 10, int(batch), args.repeats,
                            device=args.device, conv_form=args.conv_form)
        res["load_average"] = os.getloadavg() if hasattr(os, "getloadavg") else None
        res["torch_threads"] = torch.get_num_threads()
        print(json.dumps(res, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        return 0
    args.engines = [e for e in args.engines.split(",") if e]
    if not args.engines or set(args.engines) - set(ENGINES):
        p.error(f"--engines: a comma list of {', '.join(ENGINES)}")
    if args.rounds < 3:
        p.error("--rounds must be >= 3 (round 1 is excluded as the engine's start-up)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here")
    names = [n for n in args.settings.split(",") if n]
    sizes = [int(n) for n in args.per_round.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="fedpcd-bench-") as tmp:
        tmp = Path(tmp)
        data_dir = write_cifar_like(tmp / "cifar-like", args.train_images, args.test_images, args.seed) \
            if "cnn" in names else tmp
        table = settings(args, data_dir)
        results = []
        for name in names:
            if name not in table:
                p.error(f"unknown setting {name!r}: use cnn, digits and/or synthetic")
            for size in sizes or [None]:
                over = table[name] if size is None else per_round(table[name], size, max(sizes))
                results.extend(bench_setting(name if size is None else f"{name}@{size}", over, args, tmp))
        e2e = [] if args.no_e2e else end_to_end(args, tmp)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": args.device, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "engines": args.engines, "workers": args.workers, "num_cpus_per_actor": args.num_cpus,
            "num_gpus_per_actor": args.ray_num_gpus, "train_images": args.train_images,
            "test_images": args.test_images, "client_loss_before": args.loss_before,
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}
    print_tables(meta, results, e2e)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results, "end_to_end": e2e}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
