"""The ServerApp: run config → sampler → strategy → evaluation → results.

The round loop is this app's own (not ``Strategy.start``) because fairness experiments
need what Flower's loop does not give: a seeded sampler over *partition ids* (so every
method under one seed sees the same clients in the same rounds), validation that drops a
bad reply instead of crashing, scoring of *every* client each evaluation round, and
per-round records on disk. Strategies still implement Flower's ``aggregate_train``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from client_app.data import load_federated_data
from client_app.models import initial_model
from client_app.training import device
from fedcore import keys
from fedpcd_app import checkpoint, secagg
from fedcore.config import ConfigError, RunConfig, parse_run_config, resolve
from fedpcd_app.evaluation import score_central, score_clients
from fedpcd_app.metrics import fairness_metrics
from fedcore.replies import validate_train_replies
from fedpcd_app.results import ResultsWriter, write_json_atomic
from fedpcd_app.sampler import build_sampler
from fedpcd_app.tracking import tracker_for
from strategies import flat, registry

log = logging.getLogger("fedpcd")

def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s [fedpcd] %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class Experiment:
    """One federated run on a Grid. ``run()`` does everything; the parts are methods so
    tests and the checkpoint logic can drive them one by one."""

    def __init__(self, grid: Grid, cfg: RunConfig) -> None:
        self.grid = grid
        self.cfg = cfg
        # Simulation's in-memory grid sleeps 0.1 s between polls for replies; 0.01 s trims
        # the idle tail of every round (docs/performance.md). Other grids lack the attribute.
        if hasattr(grid, "pull_interval"):
            grid.pull_interval = min(grid.pull_interval, 0.01)
        self.strategy = registry.build(cfg)
        self.personal_eval = self.strategy.personalized
        self.eval_mode = "federated" if self.personal_eval else cfg.eval_mode
        if self.eval_mode == "server":
            load_federated_data(cfg)  # a data problem stops the run here, before any training
        model = initial_model(cfg)
        self.arrays = ArrayRecord(model.state_dict())
        self.spec = flat.spec_of(self.arrays)
        self.eval_model = model.to(device()) if self.eval_mode == "server" else None
        self.writer = ResultsWriter(cfg)
        self.tracker = tracker_for(cfg, self.writer.dir)  # TensorBoard, when tensorboard = true
        self.node_of: dict[int, int] = {}  # partition id -> node id
        self.sampler = None
        self.times_sampled = np.zeros(cfg.num_clients, dtype=np.int64)
        self.last_eval: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        self.start_round = 1
        self.secure = secagg.SecureAggregator(cfg, self.strategy, self.spec) if secagg.enabled(cfg) else None
        self.checkpoint_every = cfg.get_int("checkpoint-every", 0, low=0)
        self.checkpoint_keep = cfg.get_int("checkpoint-keep", 2, low=1)
        resume_from = str(cfg.params.get("resume-from", ""))
        if resume_from:
            self.resume(resume_from)

    # -- setup -------------------------------------------------------------------------
    def wait_for_nodes(self, timeout: float = 120.0) -> list[int]:
        """The connected node ids, once ``num-clients`` nodes are there (or after ``timeout``
        seconds with fewer). On a loaded machine the ServerApp can start before the
        simulation engine has registered its nodes: asking at once found none."""
        deadline = time.monotonic() + timeout
        while True:
            ids = list(self.grid.get_node_ids())
            if len(ids) >= self.cfg.num_clients or time.monotonic() > deadline:
                return ids
            time.sleep(0.2)

    def map_nodes(self) -> None:
        """QUERY every node for its partition id (Flower's node ids change every run)."""
        pending = self.wait_for_nodes()
        # A node can fail its first message (e.g. a simulation actor still starting on a
        # loaded machine): ask the silent or failed ones again, a few times.
        for attempt in range(3):
            if not pending:
                break
            if attempt:
                log.warning("asking %d node(s) again for their partition id", len(pending))
            msgs = [
                Message(RecordDict({keys.CONFIG: ConfigRecord({"query": "partition-id"})}), dst_node_id=n,
                        message_type=MessageType.QUERY)
                for n in pending
            ]
            answered: set[int] = set()
            for reply in self.grid.send_and_receive(msgs, timeout=self.cfg.round_timeout or None):
                node = int(reply.metadata.src_node_id)
                if reply.has_error():
                    log.warning("node %s did not report its partition: %s", node, reply.error.reason)
                    continue
                answered.add(node)
                pid = int(reply.content[keys.METRICS][keys.PARTITION_ID])
                if not 0 <= pid < self.cfg.num_clients:
                    raise ValueError(
                        f"node {node} reports partition-id {pid}, outside 0..{self.cfg.num_clients - 1}: "
                        "set num-clients to the number of partitions of the federation"
                    )
                self.node_of.setdefault(pid, node)
            pending = [n for n in pending if n not in answered]
        if not self.node_of:
            raise RuntimeError("no node reported a partition id: is the federation running?")
        missing = self.cfg.num_clients - len(self.node_of)
        if missing:
            log.warning("%d of %d partitions have no node: sampling among the %d present",
                        missing, self.cfg.num_clients, len(self.node_of))
        self.sampler = build_sampler(self.cfg, sorted(self.node_of))
        write_json_atomic(self.writer.dir / "availability.json", self.sampler.profile())

    # -- one round -----------------------------------------------------------------------
    def request_config(self, server_round: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        conf = dict(self.cfg.as_dict())
        conf.update({
            keys.SERVER_ROUND: server_round,
            keys.ROUND_LR: self.cfg.lr_at(server_round),
            "client-method": self.strategy.client_method,
            keys.WANT_LOSS_BEFORE: self.want_loss_before,
        })
        conf.update(extra)
        return conf

    @property
    def want_loss_before(self) -> bool:
        """Whether clients compute loss-before F_i(θ_t): a forward pass over their train split
        that only some methods use (``client-loss-before=always`` asks for it every round)."""
        return self.cfg.client_loss_before == "always" or keys.LOSS_BEFORE in self.required_metrics

    @property
    def required_metrics(self) -> tuple[str, ...]:
        return tuple(getattr(self.strategy, "required_metrics", ()))

    def train_round(self, server_round: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        pids = self.sampler.sample(server_round)
        self.times_sampled[pids] += 1
        plan = self.strategy.begin_round(server_round, self.arrays)
        base = self.request_config(server_round, plan.config)
        msgs, expected = [], {}
        for pid in pids:
            node = self.node_of[pid]
            expected[node] = pid
            content = RecordDict({
                keys.ARRAYS: self.arrays,
                keys.CONFIG: ConfigRecord({**base, keys.PARTITION_ID: pid}),
                **plan.records,
                **plan.client_records.get(pid, {}),
            })
            msgs.append(Message(content, dst_node_id=node, message_type=MessageType.TRAIN,
                                group_id=str(server_round)))
        if self.secure is not None:  # SecAgg+: one reply holding the clients' weighted mean
            valid, dropped = self.secure.exchange(self.grid, msgs, expected, server_round)
            t_train = time.perf_counter() - t0
        else:
            # A Bernoulli availability round can be empty: nothing to send, the model stays.
            replies = list(self.grid.send_and_receive(msgs, timeout=self.cfg.round_timeout or None)) if msgs else []
            t_train = time.perf_counter() - t0
            valid, dropped = validate_train_replies(
                replies, expected, self.spec,
                (*self.required_metrics, *((keys.LOSS_BEFORE,) if self.want_loss_before else ())),
                getattr(self.strategy, "required_records", ()),
            )
            # Replies arrive in whatever order the nodes finish: sort by partition id so that
            # float sums (and so every result) do not depend on arrival order.
            valid.sort(key=lambda r: expected[int(r.metadata.src_node_id)])
            answered = {int(r.metadata.src_node_id) for r in replies}
            for node, pid in expected.items():
                if node not in answered:
                    dropped.append(_no_reply(pid, node))
        for d in dropped:
            log.warning("round %d: dropped reply of partition %s: %s", server_round, d.partition, d.reason)
        record: dict[str, Any] = {
            "round": server_round,
            "sampled": pids,
            "num_replies": self.secure.num_contributors if self.secure is not None else len(valid),
            "dropped": [d.as_dict() for d in dropped],
            "num_dropped": len(dropped),
            "lr": self.cfg.lr_at(server_round),
        }
        if valid:
            metrics = [r.content[keys.METRICS] for r in valid]
            n = np.array([m[keys.NUM_EXAMPLES] for m in metrics], dtype=np.float64)
            record["train_loss"] = float(np.dot(n, [m[keys.TRAIN_LOSS] for m in metrics]) / n.sum())
            if self.want_loss_before:
                record["loss_before"] = float(np.dot(n, [m[keys.LOSS_BEFORE] for m in metrics]) / n.sum())
            t1 = time.perf_counter()
            try:
                new_arrays, agg_metrics = self.strategy.aggregate_train(server_round, valid)
            except Exception as exc:  # noqa: BLE001 - a failed aggregation keeps the model
                log.exception("round %d: aggregation failed; the model stays as it was", server_round)
                new_arrays, agg_metrics = None, None
                record["aggregation_error"] = f"{type(exc).__name__}: {exc}"
            record["aggregate_seconds"] = time.perf_counter() - t1
            if new_arrays is not None:
                self.arrays = new_arrays
            if agg_metrics is not None:
                record["strategy"] = dict(agg_metrics)
        else:
            log.warning("round %d: no valid reply; the model stays as it was", server_round)
        record["train_seconds"] = t_train
        # The whole training round: sampling, requests, replies, validation, aggregation.
        record["round_seconds"] = time.perf_counter() - t0
        return record

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self, server_round: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        arrays = self.strategy.evaluation_arrays(self.arrays)
        model = self.eval_model
        if model is None:
            model = initial_model(self.cfg).to(device())
        model.load_state_dict(arrays.to_torch_state_dict())
        out: dict[str, Any] = {}
        if self.eval_mode == "server":
            data = load_federated_data(self.cfg)
            acc, loss = score_clients(model, data, self.cfg.eval_batch_size)
            out["central_acc"], out["central_loss"] = score_central(model, data, self.cfg.eval_batch_size)
        else:
            acc, loss = self.federated_scores(server_round, arrays)
            if self.cfg.dataset == "digits" or self.cfg.dataset_path:
                data = load_federated_data(self.cfg)
                out["central_acc"], out["central_loss"] = score_central(model, data, self.cfg.eval_batch_size)
        present = ~np.isnan(acc)
        out.update(fairness_metrics(acc[present], loss[present]))
        out["num_scored"] = int(present.sum())
        out["client_acc"] = acc.tolist()
        out["client_loss"] = loss.tolist()
        out["eval_seconds"] = time.perf_counter() - t0
        self.last_eval = out
        return out

    def federated_scores(self, server_round: int, arrays: ArrayRecord) -> tuple[np.ndarray, np.ndarray]:
        conf = ConfigRecord(self.request_config(server_round, {}))
        msgs, pid_of = [], {}
        for pid, node in self.node_of.items():
            pid_of[node] = pid
            msgs.append(Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: conf}), dst_node_id=node,
                                message_type=MessageType.EVALUATE, group_id=f"eval-{server_round}"))
        acc = np.full(self.cfg.num_clients, np.nan)
        loss = np.full(self.cfg.num_clients, np.nan)
        for reply in self.grid.send_and_receive(msgs, timeout=self.cfg.round_timeout or None):
            node = int(reply.metadata.src_node_id)
            if reply.has_error() or node not in pid_of:
                log.warning("evaluation reply of node %s dropped: %s", node,
                            reply.error.reason if reply.has_error() else "unexpected node")
                continue
            m = reply.content[keys.METRICS]
            acc[pid_of[node]], loss[pid_of[node]] = float(m[keys.EVAL_ACC]), float(m[keys.EVAL_LOSS])
        return acc, loss

    def is_eval_round(self, server_round: int) -> bool:
        every = self.cfg.eval_every
        return server_round == self.cfg.num_server_rounds or (every > 0 and server_round % every == 0)

    # -- the whole run -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.sampler is None:
            self.map_nodes()
        log.info("%s on %s/%s: %d clients (%s), %d rounds -> %s", cfg.method, cfg.dataset_path or cfg.dataset,
                 cfg.model, cfg.num_clients, self.sampler.describe(), cfg.num_server_rounds, self.writer.dir)
        for server_round in range(self.start_round, cfg.num_server_rounds + 1):
            record = self.train_round(server_round)
            if self.is_eval_round(server_round):
                record["eval"] = self.evaluate(server_round)
            self.history.append(record)
            self.writer.round(record)
            if self.tracker is not None:
                self.tracker.round(record)
            self.log_round(record)
            self.after_round(server_round)
        return self.finish()

    def after_round(self, server_round: int) -> None:
        """Hook called after each round's record is written: the checkpoint, when due."""
        every = self.checkpoint_every
        if every and (server_round % every == 0 or server_round == self.cfg.num_server_rounds):
            self.save_checkpoint(server_round)

    # -- checkpoints (fedpcd_app.checkpoint) ---------------------------------------------
    def save_checkpoint(self, server_round: int) -> None:
        ckpt = checkpoint.Checkpoint(
            round=server_round, method=self.cfg.method, seed=self.cfg.seed, num_clients=self.cfg.num_clients,
            arrays={k: v.numpy() for k, v in self.arrays.items()}, strategy=self.strategy.state_dict(),
            times_sampled=self.times_sampled.copy(), history=list(self.history), last_eval=dict(self.last_eval),
        )
        path = checkpoint.write(self.writer.dir, ckpt, keep=self.checkpoint_keep)
        log.info("round %d: checkpoint %s", server_round, path)

    def resume(self, folder: str) -> None:
        """Continue from the latest valid checkpoint in ``folder`` (an earlier run's output-dir);
        its history is copied into this run's rounds.jsonl first."""
        ckpt = checkpoint.latest(folder)
        checkpoint.check_compatible(ckpt, self.cfg.method, self.cfg.seed, self.cfg.num_clients,
                                    {k: v.numpy() for k, v in self.arrays.items()})
        if ckpt.round >= self.cfg.num_server_rounds:
            raise ConfigError(
                f"run-config key 'num-server-rounds' = {self.cfg.num_server_rounds}: the checkpoint in "
                f"{folder} is already at round {ckpt.round}; set num-server-rounds above {ckpt.round}"
            )
        self.arrays = ArrayRecord({k: Array(v) for k, v in ckpt.arrays.items()})
        self.strategy.load_state_dict(ckpt.strategy)
        self.times_sampled = np.asarray(ckpt.times_sampled, dtype=np.int64).copy()
        self.history = list(ckpt.history)
        self.last_eval = dict(ckpt.last_eval)
        self.start_round = ckpt.round + 1
        for record in self.history:
            self.writer.round(record)
        _setup_logging()
        log.info("resumed from round %d of %s", ckpt.round, folder)

    def log_round(self, rec: dict[str, Any]) -> None:
        r = rec["round"]
        if r % self.cfg.log_every and "eval" not in rec:
            return
        line = f"round {r:4d}/{self.cfg.num_server_rounds}: {rec['num_replies']} replies"
        if rec["num_dropped"]:
            line += f" ({rec['num_dropped']} dropped)"
        if "train_loss" in rec:
            line += f", train loss {rec['train_loss']:.4f}"
        if "eval" in rec:
            e = rec["eval"]
            line += f" | mean acc {e['mean_acc']:.4f}, worst-10% {e['worst10_acc']:.4f}, jain {e['jain']:.4f}"
        log.info(line)

    def finish(self) -> dict[str, Any]:
        cfg = self.cfg
        final = self.last_eval
        data = load_federated_data(cfg) if (self.eval_mode == "server" or cfg.dataset == "digits") else None
        rows = []
        for pid in range(cfg.num_clients):
            rows.append({
                "partition_id": pid,
                "num_train": len(data.train_idx[pid]) if data else "",
                "num_test": len(data.test_idx[pid]) if data else "",
                "times_sampled": int(self.times_sampled[pid]),
                "final_acc": final["client_acc"][pid],
                "final_loss": final["client_loss"][pid],
            })
        self.writer.clients(rows)
        dropped = sum(r["num_dropped"] for r in self.history)
        summary = {
            "method": cfg.method,
            "seed": cfg.seed,
            "rounds": cfg.num_server_rounds,
            **{k: final[k] for k in ("mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain",
                                     "mean_loss", "max_loss")},
            "central_acc": final.get("central_acc"),
            "central_loss": final.get("central_loss"),
            "client_acc": final["client_acc"],
            "num_dropped_replies": dropped,
            "aggregation_errors": sum(1 for r in self.history if "aggregation_error" in r),
            "config": cfg.as_dict(),
            "output_dir": str(self.writer.dir),
        }
        self.writer.summary(summary)
        self.writer.close()
        if self.tracker is not None:
            self.tracker.close()
        log.info("done: mean acc %.4f, worst-10%% %.4f, jain %.4f, central %.4f -> %s",
                 summary["mean_acc"], summary["worst10_acc"], summary["jain"],
                 summary["central_acc"] if summary["central_acc"] is not None else float("nan"), self.writer.dir)
        return summary


def _no_reply(pid: int, node: int):
    from fedcore.replies import Dropped

    return Dropped(pid, node, "no reply (timeout or lost)")


def run_experiment(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    _setup_logging()
    return Experiment(grid, cfg).run()


def make_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp; with ``overrides`` it ignores ``context.run_config`` (in-process runs,
    where Flower leaves the run config empty) and uses pyproject defaults + overrides."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        raw = resolve(overrides) if overrides is not None else dict(context.run_config)
        run_experiment(grid, parse_run_config(raw))

    return server_app


app = make_server_app()

__all__ = ["app", "make_server_app", "run_experiment", "Experiment"]
