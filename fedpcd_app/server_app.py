"""The ServerApp: a validated setup → membership → rounds → evaluation → results.

The round loop is this app's own (not ``Strategy.start``) because fairness experiments
need what Flower's loop does not keep: a seeded sampler over *partition ids* (so every
method under one seed sees the same clients in the same rounds), scoring of *every*
client each evaluation round, per-round records and checkpoints on disk. The strategies
are the same Flower-native objects a foreign app starts with ``strategy.start(...)``:
the loop calls their ``configure_train`` / ``aggregate_train`` (reply validation included)
and, for federated evaluation, ``configure_evaluate`` / ``aggregate_evaluate``.

An exception inside the strategy's aggregation is recorded in the round's record; with
``on-aggregation-error = "stop"`` (the default) the run then writes a checkpoint and a
summary with ``complete: false`` and stops with :class:`AggregationStopped` (one line naming
the method, the round and the exception); with ``"keep"`` it logs the exception, keeps the
model and goes on. ``summary.json`` says whether the run is complete and, if not, why.

Parts, one job each: :mod:`fedpcd_app.config` (validation, once), :mod:`fedpcd_app.membership`
(node ↔ partition), :class:`fedpcd_app.evaluation.Evaluator`, :mod:`fedpcd_app.results` and
:mod:`fedpcd_app.checkpoint`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from client_app import local_data
from fedcore.config import ConfigError, RunConfig, resolve
from fedpcd_app import checkpoint, node_data, secagg
from fedpcd_app.config import Setup, check, validate
from fedpcd_app.evaluation import Evaluator, summary_fields
from fedpcd_app.exchange import resolve_round_timeout, send_and_receive
from fedpcd_app.membership import Membership
from fedpcd_app.results import ResultsWriter, write_json_atomic
from fedpcd_app.tracking import tracker_for
from strategies.privacy import CentralDP
from strategies.wrappers import UpdateClip, find_wrapper

log = logging.getLogger("fedpcd")


class AggregationStopped(RuntimeError):
    """A strategy's aggregation raised and ``on-aggregation-error`` = stop (one-line message)."""


def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s [fedpcd] %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class Experiment:
    """One federated run on a Grid: ``run()`` does everything; the round and the evaluation
    are methods so that tests and the checkpoint logic can drive them one by one."""

    def __init__(self, grid: Grid, setup: Setup | RunConfig, membership: Membership | None = None) -> None:
        if isinstance(setup, RunConfig):
            setup = validate(setup.as_dict())
        # round-timeout 0 = auto: no timeout in simulation, a finite one in deployment (exchange.py)
        self.grid, self.setup, self.cfg = grid, setup, resolve_round_timeout(setup.cfg, grid)
        self.node_data = local_data.settings(self.cfg).node  # the nodes bring their own data
        if self.node_data and not local_data.settings(self.cfg).complete:
            raise ConfigError("client-data='node': input-shape, num-classes, data-mean and data-std must be known "
                              "before the run: run_experiment() learns them from the nodes (or declare them)")
        # Simulation's in-memory grid sleeps 0.1 s between polls for replies; 0.01 s trims
        # the idle tail of every round (docs/performance.md). Other grids lack the attribute.
        if hasattr(grid, "pull_interval"):
            grid.pull_interval = min(grid.pull_interval, 0.01)
        self.strategy = setup.strategy
        self.membership_given = membership is not None  # discovered already (run_experiment)
        self.membership = membership if membership is not None else Membership(self.cfg)
        self.membership.cfg = self.cfg
        self.strategy.select = self.membership.select
        self.strategy.run_config = self.cfg.as_dict()
        self.arrays = ArrayRecord(setup.model.state_dict())
        self.evaluator = Evaluator(self.cfg, self.strategy, setup.model)
        self.writer = ResultsWriter(self.cfg)
        self.tracker = tracker_for(self.cfg, self.writer.dir)  # TensorBoard, when tensorboard = true
        self.secure = secagg.SecureAggregator(self.cfg, self.strategy, self.strategy.spec or
                                              _spec(self.arrays)) if secagg.enabled(self.cfg) else None
        self.times_sampled = np.zeros(self.cfg.num_clients, dtype=np.int64)
        self.history: list[dict[str, Any]] = []
        self.last_eval: dict[str, Any] = {}
        self.stop_on_error = self.cfg.params.get("on-aggregation-error", "stop") == "stop"
        self.aggregation_exception: Exception | None = None
        self.start_round = 1
        if setup.resume_from:
            self.resume(setup.resume_from)

    # -- the whole run: one screen ------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.membership.sampler is None or self.membership_given:
            sampler = self.membership.sampler or self.membership.discover(self.grid)
            write_json_atomic(self.writer.dir / "availability.json", sampler.profile())
            self.membership_given = False
        if self.node_data:  # every node's data checked against the others and the run config
            node_data.complete(cfg.as_dict(), self.membership)
        source = "the nodes' own data" if self.node_data else cfg.dataset_path or cfg.dataset
        log.info("%s on %s/%s: %d clients (%s), %d rounds -> %s", cfg.method, source,
                 cfg.model, cfg.num_clients, self.membership.sampler.describe(), cfg.num_server_rounds,
                 self.writer.dir)
        t_start = time.perf_counter()
        for server_round in range(self.start_round, cfg.num_server_rounds + 1):
            record = self.train_round(server_round)
            stop = self.stop_on_error and "aggregation_error" in record
            if stop or self.is_eval_round(server_round):
                record["eval"] = self.last_eval = self.evaluator.evaluate(server_round, self.arrays, self.grid)
            self.history.append(record)
            self.writer.round(record)
            if self.tracker is not None:
                self.tracker.round(record)
            self.log_round(record, (time.perf_counter() - t_start) / (server_round - self.start_round + 1))
            if stop:
                self.stop(server_round, record["aggregation_error"])
            self.after_round(server_round)
        return self.finish()

    def stop(self, server_round: int, error: str) -> None:
        """A failed aggregation ends the run: a checkpoint, a summary saying so, one line."""
        self.save_checkpoint(server_round)
        line = f"aggregation failed: method '{self.cfg.method}', round {server_round}: {error}"
        log.error("%s; the run stops (on-aggregation-error='keep' would log it and keep the model)", line)
        self.finish(f"stopped after round {server_round} of {self.cfg.num_server_rounds}: {line}")
        raise AggregationStopped(line) from self.aggregation_exception

    # -- one training round ----------------------------------------------------------------------
    def train_round(self, server_round: int) -> dict[str, Any]:
        """Sample → requests → replies → validation and aggregation → the round's record."""
        t0 = time.perf_counter()
        if self.membership.sampler is not None:
            self.membership.refresh(self.grid, server_round)  # nodes that left or (re)joined
            for pid in self.membership.moved:  # a new node: the client's node-side state is gone
                self.strategy.on_node_changed(pid)
        msgs = self.strategy.configure_train(server_round, self.arrays, ConfigRecord(), self.grid)
        expected = dict(self.strategy.expected)  # node → partition id
        pids = list(expected.values())
        self.times_sampled[pids] += 1  # rounds a partition was asked: sampled and served by a node
        # A Bernoulli availability round can be empty: nothing to send, the model stays.
        if self.secure is not None:  # SecAgg+: one reply holding the clients' weighted mean
            valid, dropped = self.secure.exchange(self.grid, msgs, expected, server_round) if msgs else ([], [])
            aggregate = (lambda: self.strategy.aggregate_valid(server_round, valid)) if valid else None
        else:
            replies = send_and_receive(self.grid, msgs, timeout=self.cfg.round_timeout or None)
            aggregate = lambda: self.strategy.aggregate_train(server_round, replies)  # noqa: E731
        t_train = time.perf_counter() - t0
        record: dict[str, Any] = {"round": server_round, "sampled": pids}
        if self.membership.unserved:  # drawn, but no node serves them now: nothing was sent
            record["unserved"] = list(self.membership.unserved)
            log.warning("round %d: partition(s) %s drawn but served by no node: not asked", server_round,
                        record["unserved"])
        t1 = time.perf_counter()
        new_arrays, agg_metrics, error = None, None, None
        if aggregate is not None:
            try:
                new_arrays, agg_metrics = aggregate()
            except Exception as exc:  # noqa: BLE001 - recorded; run() stops unless on-aggregation-error=keep
                if not self.stop_on_error:
                    log.exception("round %d: aggregation failed; the model stays as it was", server_round)
                self.aggregation_exception = exc
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if self.secure is None:
            valid, dropped = self.strategy.last_train.valid, self.strategy.last_train.dropped
            replied = sorted(expected[int(r.metadata.src_node_id)] for r in valid)  # validated senders
        else:
            for d in dropped:
                log.warning("round %d: dropped reply of partition %s: %s", server_round, d.partition, d.reason)
            gone = {d.partition for d in dropped}  # the one valid reply: the mean of the others
            replied = sorted(p for p in pids if p not in gone) if valid else []
        record.update({
            "replied": replied,  # partitions whose reply was aggregated (clients.csv times_replied)
            "num_replies": self.secure.num_contributors if self.secure is not None else len(valid),
            "dropped": [d.as_dict() for d in dropped],
            "num_dropped": len(dropped),
            "lr": self.strategy.round_lr(server_round),
        })
        if valid:
            record.update(_train_losses(valid, self.strategy.want_loss_before))
            record["aggregate_seconds"] = time.perf_counter() - t1
            if error is not None:
                record["aggregation_error"] = error
            if new_arrays is not None:
                self.arrays = new_arrays
            if agg_metrics is not None:
                record["strategy"] = dict(agg_metrics)
            if self.secure is None:
                record.update(self.strategy.last_train.defence)  # update_clip, privacy (the wrappers' reports)
        else:
            log.warning("round %d: no valid reply; the model stays as it was", server_round)
        record["train_seconds"] = t_train
        record["round_seconds"] = time.perf_counter() - t0  # the whole training round
        return record

    def is_eval_round(self, server_round: int) -> bool:
        every = self.cfg.eval_every
        return server_round == self.cfg.num_server_rounds or (every > 0 and server_round % every == 0)

    def evaluate(self, server_round: int) -> dict[str, Any]:
        self.last_eval = self.evaluator.evaluate(server_round, self.arrays, self.grid)
        return self.last_eval

    # -- checkpoints (fedpcd_app.checkpoint) ---------------------------------------------------
    def after_round(self, server_round: int) -> None:
        """Called after each round's record is written: the checkpoint, when due."""
        every = self.setup.checkpoint_every
        if every and (server_round % every == 0 or server_round == self.cfg.num_server_rounds):
            self.save_checkpoint(server_round)

    def save_checkpoint(self, server_round: int) -> None:
        ckpt = checkpoint.Checkpoint(
            round=server_round, method=self.cfg.method, seed=self.cfg.seed, num_clients=self.cfg.num_clients,
            arrays={k: v.numpy() for k, v in self.arrays.items()}, strategy=self.strategy.state,
            params=self.strategy.params.to_run_config(),
            times_sampled=self.times_sampled.copy(), history=list(self.history), last_eval=dict(self.last_eval),
            privacy=dp.dp_state if (dp := find_wrapper(self.strategy, CentralDP)) is not None else None,
        )
        path = checkpoint.write(self.writer.dir, ckpt, keep=self.setup.checkpoint_keep)
        log.info("round %d: checkpoint %s", server_round, path)

    def resume(self, folder: str) -> None:
        """Continue from the latest valid checkpoint in ``folder`` (an earlier run's output-dir);
        its history is copied into this run's rounds.jsonl first."""
        ckpt = checkpoint.latest(folder)
        checkpoint.check_compatible(ckpt, self.cfg.method, self.cfg.seed, self.cfg.num_clients,
                                    {k: v.numpy() for k, v in self.arrays.items()},
                                    self.strategy.params.to_run_config())
        if ckpt.round >= self.cfg.num_server_rounds:
            raise ConfigError(
                f"run-config key 'num-server-rounds' = {self.cfg.num_server_rounds}: the checkpoint in "
                f"{folder} is already at round {ckpt.round}; set num-server-rounds above {ckpt.round}"
            )
        self.arrays = ArrayRecord({k: Array(v) for k, v in ckpt.arrays.items()})
        self.strategy.state = ckpt.strategy
        if (dp := find_wrapper(self.strategy, CentralDP)) is not None and ckpt.privacy is not None:
            dp.dp_state = ckpt.privacy  # the adaptive clipping norm
        self.strategy.on_restored()  # e.g. SCAFFOLD re-sends the mirrored client control variates
        self.times_sampled = np.asarray(ckpt.times_sampled, dtype=np.int64).copy()
        self.history = list(ckpt.history)
        self.last_eval = dict(ckpt.last_eval)
        self.start_round = ckpt.round + 1
        for record in self.history:
            self.writer.round(record)
        _setup_logging()
        log.info("resumed from round %d of %s", ckpt.round, folder)

    # -- results ---------------------------------------------------------------------------------
    def log_round(self, rec: dict[str, Any], seconds_per_round: float) -> None:
        r = rec["round"]
        if r % self.cfg.log_every and "eval" not in rec and r != self.cfg.num_server_rounds:
            return
        eta = seconds_per_round * (self.cfg.num_server_rounds - r)
        line = f"round {r:4d}/{self.cfg.num_server_rounds}: {rec['num_replies']} replies"
        if rec["num_dropped"]:
            line += f" ({rec['num_dropped']} dropped)"
        if "train_loss" in rec:
            line += f", train loss {rec['train_loss']:.4f}"
        if "eval" in rec:
            e = rec["eval"]
            line += f" | mean acc {e['mean_acc']:.4f}, worst-10% {e['worst10_acc']:.4f}, jain {e['jain']:.4f}"
        line += f" [{rec['round_seconds']:.2f} s, ETA {eta:.0f} s]"
        log.info(line)

    def finish(self, stopped: str | None = None) -> dict[str, Any]:
        """clients.csv, the final model and summary.json; ``stopped``: why the run ended early."""
        cfg, final, data = self.cfg, self.last_eval, self.evaluator.data
        reported = node_data.sizes(self.membership) if self.node_data else {}  # (train, test) rows per node
        replied = _times_replied(self.history, cfg.num_clients)
        rows = [{
            "partition_id": pid,
            "num_train": len(data.train_idx[pid]) if data else reported.get(pid, ("", ""))[0],
            "num_test": len(data.test_idx[pid]) if data else reported.get(pid, ("", ""))[1],
            "times_sampled": int(self.times_sampled[pid]),
            "times_replied": int(replied[pid]),
            "final_acc": final["client_acc"][pid],
            "final_loss": final["client_loss"][pid],
        } for pid in range(cfg.num_clients)]
        self.writer.clients(rows)
        # The final global model: a plain state_dict (torch.load(path, weights_only=True) reads it).
        torch.save(self.arrays.to_torch_state_dict(), self.writer.dir / "final_model.pt")
        summary = {
            "method": cfg.method,
            "seed": cfg.seed,
            "rounds": cfg.num_server_rounds,
            **{k: final[k] for k in ("mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain",
                                     "mean_loss", "max_loss")},
            "central_acc": final.get("central_acc"),
            "central_loss": final.get("central_loss"),
            "client_acc": final["client_acc"],
            **summary_fields(final, [r["eval"] for r in self.history if "eval" in r]),
            "num_dropped_replies": sum(r["num_dropped"] for r in self.history),
            "aggregation_errors": sum(1 for r in self.history if "aggregation_error" in r),
            **self.completeness(stopped),
            **self.hostile_summary(final),
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

    def completeness(self, stopped: str | None) -> dict[str, Any]:
        """``complete`` and, when false, ``incomplete_reason``: a run that stopped early, one
        whose aggregation failed in some round (the model kept, on-aggregation-error=keep), or
        one in which a node could not load its data (a ``DataError`` reply: that client never
        trained, unlike a node that dropped out for a while)."""
        failed = [r for r in self.history if "aggregation_error" in r]
        reason = stopped
        if reason is None and failed:
            reason = (f"aggregation failed in {len(failed)} round(s), first round {failed[0]['round']}: "
                      f"{failed[0]['aggregation_error']}; on-aggregation-error='keep' kept the previous model")
        bad_data = [d for r in self.history for d in r.get("dropped", ()) if "DataError" in str(d.get("reason"))]
        if reason is None and bad_data:
            pids = sorted({d["partition"] for d in bad_data if d.get("partition") is not None})
            reason = (f"partition(s) {pids} could not load their data ({len(bad_data)} dropped train repl(ies)), "
                      f"first: {bad_data[0]['reason']}")
        return {"complete": reason is None, "incomplete_reason": reason}

    def hostile_summary(self, final: dict[str, Any]) -> dict[str, Any]:
        """The attack and the attacked partitions, the honest clients' metrics, the defences."""
        out: dict[str, Any] = {"attack": self.cfg.params.get("attack", "none"),
                               "attacked_partitions": list(self.evaluator.attacked)}
        if "honest" in final:
            out["honest"] = final["honest"]
        if (clip := find_wrapper(self.strategy, UpdateClip)) is not None:
            out["update_clip"] = {"c": clip.c, "num_clipped": sum(
                r.get("update_clip", {}).get("num_clipped", 0) for r in self.history)}
        if (dp := find_wrapper(self.strategy, CentralDP)) is not None:
            out["privacy"] = dp.describe()
        return out


def _times_replied(history: list[dict[str, Any]], num_clients: int) -> np.ndarray:
    """Per partition: the rounds whose aggregation had its reply (records before ``replied``
    existed: asked and not dropped)."""
    out = np.zeros(num_clients, dtype=np.int64)
    for rec in history:
        if "replied" in rec:
            out[rec["replied"]] += 1
        else:
            dropped = {d["partition"] for d in rec.get("dropped", ())}
            out[[p for p in rec["sampled"] if p not in dropped]] += 1
    return out


def _spec(arrays: ArrayRecord):
    from fedcore.flat import spec_of

    return spec_of(arrays)


def _train_losses(valid, want_loss_before: bool) -> dict[str, float]:
    """The round's example-weighted train loss (and loss-before, when the clients computed it)."""
    from fedcore import keys

    metrics = [r.content[keys.METRICS] for r in valid]
    n = np.array([m[keys.NUM_EXAMPLES] for m in metrics], dtype=np.float64)
    out = {"train_loss": float(np.dot(n, [m[keys.TRAIN_LOSS] for m in metrics]) / n.sum())}
    if want_loss_before:
        out["loss_before"] = float(np.dot(n, [m[keys.LOSS_BEFORE] for m in metrics]) / n.sum())
    return out


def run_experiment(grid: Grid, setup: Setup | Mapping[str, Any]) -> dict[str, Any]:
    """One run on ``grid``: a :class:`Setup`, or a full flat run config validated here. With
    ``client-data = "node"`` the nodes are asked first (one QUERY: partition and data) and
    what the run config leaves unknown (input shape, classes, normalisation) is filled from
    their replies before the model is built (:mod:`fedpcd_app.node_data`)."""
    _setup_logging()
    membership = None
    if not isinstance(setup, Setup):
        raw = dict(setup)
        if local_data.is_node_mode(raw):
            membership = Membership(resolve_round_timeout(check(raw), grid))
            membership.discover(grid)
            raw = node_data.complete(raw, membership)
        setup = validate(raw)
    return Experiment(grid, setup, membership).run()


def make_server_app(setup: Setup | Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp. With a :class:`Setup` (or overrides, validated here) it ignores
    ``context.run_config`` (in-process runs, where Flower leaves it empty); without, it
    validates ``context.run_config`` once when the run starts. Overrides with
    ``client-data = "node"`` are checked here and completed from the nodes at the start."""
    server_app = ServerApp()
    if setup is not None and not isinstance(setup, Setup):
        raw = resolve(setup)
        if local_data.is_node_mode(raw):
            check(raw)  # every key now; the model once the nodes have reported their data
            setup = raw
        else:
            setup = validate(raw)

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run_experiment(grid, setup if setup is not None else dict(context.run_config))

    return server_app


app = make_server_app()

__all__ = ["app", "make_server_app", "run_experiment", "Experiment"]
