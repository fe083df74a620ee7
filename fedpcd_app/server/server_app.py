"""The ServerApp: a validated setup → membership → rounds → evaluation → results.

The round loop is this app's own (not ``Strategy.start``) because fairness experiments
need what Flower's loop does not keep: a seeded sampler over *partition ids* (so every
method under one seed sees the same clients in the same rounds), scoring of *every*
client each evaluation round, per-round records and checkpoints on disk. The strategies
are the same Flower-native objects a foreign app starts with ``strategy.start(...)``: the
loop calls their ``configure_train`` and ``train_outcome`` (reply validation included; the
round's :class:`strategies.gate.RoundOutcome` returned, whatever the exchange: in the clear
or under SecAgg+, :mod:`fedpcd_app.server.exchange`) and, for federated evaluation,
``configure_evaluate`` / ``evaluate_outcome``, each given the app's
:class:`strategies.requests.RunContext` (its sampler, the run config, the reply bounds).

An exception inside the strategy's aggregation is recorded in the round's record; with
``on-aggregation-error = "stop"`` (the default) the run then writes a checkpoint and a
summary with ``complete: false`` and stops with :class:`AggregationStopped` (one line naming
the method, the round and the exception); with ``"keep"`` it logs the exception, keeps the
model and goes on. ``summary.json`` says whether the run is complete and, if not, why.

Parts, one job each: :mod:`fedpcd_app.server.config` (validation, once), :mod:`fedpcd_app.server.membership`
(node ↔ partition), :class:`fedpcd_app.server.evaluation.Evaluator`, :mod:`fedpcd_app.server.results` and
:mod:`fedpcd_app.server.checkpoint`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from client_app import attacks, local_data
from fedcore.config import ConfigError, RunConfig, resolve
from fedcore.flat import spec_of
from fedpcd_app.server import checkpoint, divergence, faults, node_data, report_process, secagg
from fedpcd_app.server.config import Setup, check, validate
from fedpcd_app.server.evaluation import Evaluator, averaged, reply_limits, summary_fields
from fedpcd_app.server.exchange import PlainExchange, resolve_round_timeout
from fedpcd_app.server.gpus import visible_gpus
from fedpcd_app.server.logs import ONE_LINE_ERRORS, AggregationStopped, one_line_report, set_log_method, setup_logging
from fedpcd_app.server.membership import (
    Membership,
    PartitionRouter,
    route_partitions,
    routing_wanted,
    wait_for_stable_nodes,
)
from fedpcd_app.server.results import ResultsWriter, last_recorded_round, write_json_atomic
from fedpcd_app.server.run_state import RunState
from fedpcd_app.server.tracking import tracker_for
from strategies.base import find
from strategies.defences import UpdateClip
from strategies.gate import RoundOutcome
from strategies.health import NoTrainingError
from strategies.privacy import CentralDP
from strategies.registry import weighting_of
from strategies.requests import RunContext, addressees

log = logging.getLogger("fedpcd")


class Experiment:
    """One federated run on a Grid: ``run()`` does everything; the round and the evaluation
    are methods so that tests and the checkpoint logic can drive them one by one. What the run
    carries from round to round is one :class:`~fedpcd_app.server.run_state.RunState`
    (``self.state``, checkpointed whole): :meth:`train_round` takes it and returns the next one,
    which :meth:`keep` makes the run's once the round is recorded. The other attributes are the
    run's setting (config, grid, strategy, evaluator, writer) and the round in progress."""

    def __init__(self, grid: Grid, setup: Setup | RunConfig, membership: Membership | None = None) -> None:
        if isinstance(setup, RunConfig):
            setup = validate(setup.as_dict())
        # round-timeout 0 = auto: no timeout in simulation, a finite one in deployment (exchange.py)
        self.grid, self.setup, self.cfg = grid, setup, resolve_round_timeout(setup.cfg, grid)
        set_log_method(self.cfg.method)  # the log prefix names the method
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
        self.evaluator = Evaluator(self.cfg, self.strategy, setup.model)
        self.state = RunState.new(ArrayRecord(setup.model.state_dict()), self.cfg.num_clients,
                                  strategy=self.strategy.state, averaged=self.evaluator.averages)
        # What the strategy's calls are given: the seeded sampler over partition ids, the run config
        # sent with every request, counts bounded by the partitions' sizes the server knows; each
        # round's adds the run state's trust and drop streak (round_context).
        self.context = RunContext(select=self.membership.select, run_config=self.cfg.as_dict(),
                                  limits=reply_limits(self.cfg, self.evaluator.data, self.membership))
        self.stop_on_error = self.cfg.on_aggregation_error == "stop"
        self.aggregation_exception: Exception | None = None
        self.classes = divergence.num_classes(setup.model)
        self.watch = divergence.Watch(self.cfg, self.classes)
        self.last_valid: list = []  # the last round's validated replies (the watch reads their losses)
        self.initial_norm = divergence.model_norm(self.state.arrays)  # the collapse check's reference (completeness)
        if self.cfg.checkpoint_every or setup.cfg.resume_from:
            checkpoint.checkpoint_key()  # an empty FEDPCD_CHECKPOINT_KEY is an error now, not after the rounds
        # every check and the whole restore before any file is opened for writing
        rolled_back = self.resume(setup.cfg.resume_from) if setup.cfg.resume_from else None
        self.start_round = self.state.start_round  # the loop's first round
        self.writer = ResultsWriter(self.cfg, history=self.state.history)
        if setup.cfg.resume_from:
            setup_logging()
            log.info("resumed from round %d of %s", self.start_round - 1, setup.cfg.resume_from)
            if rolled_back:
                log.warning("%s", rolled_back)
        self.tracker = tracker_for(self.cfg, self.writer.dir)  # TensorBoard and/or W&B (tracking.py)
        # the round's train exchange: in the clear, or under SecAgg+; either returns the round's outcome
        self.exchange = (secagg.SecureAggregator(self.cfg, self.strategy, spec_of(self.state.arrays), self.context)
                         if secagg.enabled(self.cfg) else PlainExchange(self.strategy, self.context,
                                                                         self.cfg.round_timeout or None))
        self.replies_in = 0.0  # when the latest round's replies were in (waiting())
        self.signals = divergence.Interrupts()
        # the round trained but not yet kept: (the next run state, its record); an interrupt keeps it
        self.trained: tuple[RunState, dict[str, Any]] | None = None
        self.finished = False  # finish() wrote the summary

    # -- the whole run: one screen ------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        # the report's process, started now: its imports (matplotlib) overlap the rounds
        self.drawer = report_process.start_report_drawer() if self.draws_report() else None
        try:
            with self.signals:  # SIGINT/SIGTERM: a checkpoint and an incomplete summary (interrupted())
                return self._run()
        except KeyboardInterrupt as exc:
            with divergence.signals_ignored():  # a second Ctrl-C does not cut the saving short
                self.interrupted(exc)
            raise
        except Exception as exc:  # a summary saying so, one line (fedpcd_app.server.faults)
            interrupt = faults.interrupt_behind(exc)
            if interrupt is not None:  # raised while a SIGINT/SIGTERM unwound the round: the interrupt
                with divergence.signals_ignored():
                    self.interrupted(interrupt)
                raise interrupt from exc
            failure = faults.ended_by(self, exc)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            self.writer.lock.release()  # on any exit (finish() has released it on a normal one)
            drawer, self.drawer = self.drawer, None
            if drawer is not None:  # not used (an error, an interrupted run): ended, nothing drawn
                drawer.kill()
                drawer.wait()

    def _run(self) -> dict[str, Any]:
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
        t_first = time.perf_counter()  # end of the run's first round (set below)
        for server_round in range(self.start_round, cfg.num_server_rounds + 1):
            # SIGINT/SIGTERM end the run at once while it waits for clients or evaluates (run() then
            # checkpoints the rounds done); inside deferred() they wait for the block's end.
            state, record = self.train_round(self.state, server_round)  # self.trained: interrupted() keeps it
            diverged = self.watch.observe(record, self.last_valid, state.watch)
            stop = diverged is not None or ("aggregation_error" in record and (
                self.stop_on_error or isinstance(self.aggregation_exception, NoTrainingError)))
            if stop or self.is_eval_round(server_round):
                record["eval"] = state.last_eval = self.evaluator.evaluate(
                    server_round, state.arrays, self.grid, self.round_context(state), state.average)
            with self.signals.deferred():
                self.keep(state, record)
                # The ETA leaves the first round out: it carries the start-up (data, workers, actors).
                now = time.perf_counter()
                if server_round == self.start_round:
                    t_first = now
                done = server_round - self.start_round
                self.log_round(record, (now - t_first) / done if done else None)
                if diverged is not None:
                    return self.diverged(server_round, diverged)
                if stop:
                    self.stop(server_round, record["aggregation_error"])
            self.after_round(server_round)
        with self.signals.deferred():
            return self.finish()

    def keep(self, state: RunState, record: dict[str, Any]) -> None:
        """The round's next run state made the run's, with its record (its warnings, rounds.jsonl,
        the trackers)."""
        self.watch_round(state, record)
        state.history.append(record)
        state.round = record["round"]
        self.state, self.trained = state, None
        self.writer.round(record)
        if self.tracker is not None:
            self.tracker.round(record)

    def keep_trained(self) -> None:
        """A round trained but not kept (an interrupt or an error cut its evaluation or bookkeeping): kept."""
        if self.trained is not None and self.trained[0].round < self.trained[1]["round"]:
            self.keep(*self.trained)
        self.trained = None

    def interrupted(self, exc: KeyboardInterrupt) -> None:
        """SIGINT/SIGTERM: the rounds done so far checkpointed (whatever checkpoint-every says)
        and an incomplete summary, ``incomplete_reason: "interrupted at round N ..."``; the
        folder is then continued by ``resume-from``. A round whose replies had not all arrived
        never happened (the run state is the previous round's: its draws are redone on resume); a
        trained round whose evaluation was cut is kept."""
        setup_logging()
        if self.finished:  # the signal came as the run ended: its summary stands
            return
        self.keep_trained()
        done = self.state.round
        what = getattr(exc, "signal_name", "SIGINT")
        if done:
            self.save_checkpoint(done)
            how = f"rounds 1-{done} are saved: continue with resume-from='{self.writer.dir}'"
        else:
            how = f"no round finished: rerun with overwrite=true to start again in {self.writer.dir}"
        reason = f"interrupted at round {done + 1} ({what}); {how}"
        log.warning("%s", reason)
        self.finish(reason, report=False)

    def stop(self, server_round: int, error: str) -> None:
        """A failed aggregation ends the run: a checkpoint, a summary saying so, one line."""
        self.save_checkpoint(server_round)
        line = f"aggregation failed: method '{self.cfg.method}', round {server_round}: {error}"
        keep = "" if isinstance(self.aggregation_exception, NoTrainingError) else \
            " (on-aggregation-error='keep' would log it and keep the model)"
        log.error("%s; the run stops%s", line, keep)
        self.finish(f"stopped after round {server_round} of {self.cfg.num_server_rounds}: {line}")
        raise AggregationStopped(line) from self.aggregation_exception

    def diverged(self, server_round: int, why: str) -> dict[str, Any]:
        """A diverged run ends (fedpcd_app.server.divergence): one line, no checkpoint of this round,
        the summary saying so; the model is the last finite one."""
        reason = f"{divergence.PREFIX} {server_round}: {why}"
        log.error("%s; the run stops (the model is the last finite one; diverge-patience=%d)", reason,
                  self.watch.patience)
        return self.finish(reason)

    # -- one training round ----------------------------------------------------------------------
    def train_round(self, state: RunState, server_round: int) -> tuple[RunState, dict[str, Any]]:
        """The run state after round ``server_round`` from the one before it, and the round's
        record: sample → requests → replies → validation and aggregation. ``state`` stays as it
        was (but for the method's buffers, :mod:`fedpcd_app.server.run_state`)."""
        t0 = time.perf_counter()
        state = state.successor()
        self.strategy.state = state.strategy  # the method goes on from the run state's
        context = self.round_context(state)
        msgs = self.requests(state, server_round, context)
        with self.signals.deferred():  # aggregation and the record: an interrupt waits for them (not in waiting())
            outcome = self.exchange.exchange(self.grid, msgs, server_round, self.waiting, context)
            record = self.round_record(server_round, list(addressees(msgs).values()), outcome)
            self.take(state, outcome, record, aggregate_seconds=time.perf_counter() - self.replies_in)
            record["train_seconds"] = self.replies_in - t0
            state.strategy = self.strategy.state
            state.average = averaged(state.average, state.arrays)  # eval-averaged-iterate: θ̄_t includes θ_t
            record["round_seconds"] = time.perf_counter() - t0  # the whole training round
            self.trained = (state, record)  # before any interrupt can land: run() keeps it
            return state, record

    def round_context(self, state: RunState) -> RunContext:
        """What the strategy's calls get this round: the run's context with ``state``'s trust and drop streak."""
        return dataclasses.replace(self.context, trust=state.trust, streak=state.streak)

    def requests(self, state: RunState, server_round: int, context: RunContext) -> list:
        """The round's train requests to the sampled clients a node serves now, each counted in
        ``state.times_sampled`` (a Bernoulli availability round can be empty: nothing is sent)."""
        if self.membership.sampler is not None:
            self.membership.refresh(self.grid, server_round)  # nodes that left or (re)joined
            for pid in self.membership.moved:  # a new node: the client's node-side state is gone
                self.strategy.node_changed(pid)
        msgs = self.strategy.configure_train(server_round, state.arrays, ConfigRecord(), self.grid, context)
        state.times_sampled[list(addressees(msgs).values())] += 1  # rounds a partition was asked
        return msgs

    @contextlib.contextmanager
    def waiting(self):
        """The exchange waits for the clients in here: an interrupt ends the run at once, before
        this round (its count undone); when the replies are in is the end of the round's training."""
        with self.signals.interruptible():
            yield
        self.replies_in = time.perf_counter()

    def round_record(self, server_round: int, pids: list[int], outcome: RoundOutcome) -> dict[str, Any]:
        """Who was asked, who was served, whose reply was aggregated and which were dropped."""
        record: dict[str, Any] = {"round": server_round, "sampled": pids}
        if self.membership.unserved:  # drawn, but no node serves them now: nothing was sent
            record["unserved"] = list(self.membership.unserved)
            log.warning("round %d: partition(s) %s drawn but served by no node: not asked", server_round,
                        record["unserved"])
        return {**record,
                "replied": outcome.replied,  # partitions whose reply was aggregated (clients.csv times_replied)
                "num_replies": len(outcome.replied),
                "dropped": [d.as_dict() for d in outcome.dropped],
                "num_dropped": len(outcome.dropped),
                "lr": self.strategy.round_lr(server_round)}

    def take(self, state: RunState, outcome: RoundOutcome, record: dict[str, Any], aggregate_seconds: float) -> None:
        """The round's outcome into the record, and its model (when finite) as ``state``'s global model."""
        self.last_valid = outcome.client_replies  # the divergence watch reads their losses
        if outcome.error is not None:
            if not self.stop_on_error:
                log.error("round %d: aggregation failed; the model stays as it was", record["round"],
                          exc_info=outcome.error)
            self.aggregation_exception = outcome.error
        if outcome.error is not None:
            record["aggregation_error"] = f"{type(outcome.error).__name__}: {outcome.error}".splitlines()[0]
        if not outcome.valid:
            return
        record.update(_train_losses(outcome.valid, self.strategy.want_loss_before))
        record["aggregate_seconds"] = aggregate_seconds
        if outcome.arrays is not None and not divergence.is_finite(outcome.arrays):
            record["diverged"] = "the global model became non-finite (rolled back to the previous round's)"
        elif outcome.arrays is not None:
            state.arrays = outcome.arrays
        if outcome.metrics is not None:
            record["strategy"] = dict(outcome.metrics)
        record.update(outcome.defence)  # update_norms, update_clip, privacy (validation's and the wrappers' reports)

    def draws_report(self) -> bool:
        """``figures = "auto"``: report.md and the run's figures when the run ends."""
        return self.cfg.figures == "auto"

    def is_eval_round(self, server_round: int) -> bool:
        every = self.cfg.eval_every
        return server_round == self.cfg.num_server_rounds or (every > 0 and server_round % every == 0)

    def evaluate(self, server_round: int) -> dict[str, Any]:
        """The run state's model scored now (kept as its last evaluation)."""
        state = self.state
        state.last_eval = self.evaluator.evaluate(server_round, state.arrays, self.grid, self.round_context(state),
                                                  state.average)
        return state.last_eval

    # -- checkpoints (fedpcd_app.server.checkpoint) ---------------------------------------------------
    def after_round(self, server_round: int) -> None:
        """Called after each round's record is written: the checkpoint, when due."""
        every = self.setup.cfg.checkpoint_every
        if every and (server_round % every == 0 or server_round == self.cfg.num_server_rounds):
            self.save_checkpoint(server_round)

    def save_checkpoint(self, server_round: int) -> None:
        """The run state whole (:class:`~fedpcd_app.server.run_state.RunState`) and what a resume checks it against."""
        ckpt = checkpoint.Checkpoint(
            **{**self.state.saved(), "round": server_round},
            method=self.cfg.method, seed=self.cfg.seed, num_clients=self.cfg.num_clients,
            params=self.strategy.params.to_run_config(), config=self.cfg.as_dict())
        path = checkpoint.write(self.writer.dir, ckpt, keep=self.setup.cfg.checkpoint_keep)
        log.info("round %d: checkpoint %s", server_round, path)

    def resume(self, folder: str) -> str | None:
        """Continue from the latest valid checkpoint in ``folder`` (an earlier run's output-dir):
        every check and the whole restore in memory, before the writer opens any file (a refused
        resume changes nothing on disk); the writer then starts rounds.jsonl with its history.
        Returns the line saying the checkpoint is older than the folder's last recorded round (a
        newer one was damaged, deleted or replaced: the rounds after it run again), None when it is
        not; the line is kept in the run's warnings, and every resume in summary.json's ``resumes``."""
        ckpt = checkpoint.latest(folder)
        allow = checkpoint.allowed_changes(self.cfg.resume_allow_changes)
        checkpoint.check_compatible(ckpt, self.cfg.method, self.cfg.seed, self.cfg.num_clients,
                                    {k: v.numpy() for k, v in self.state.arrays.items()},
                                    self.strategy.params.to_run_config(), allow)
        checkpoint.check_rounds_left(folder, ckpt.round, self.cfg.num_server_rounds)
        checkpoint.check_config(ckpt, self.cfg.as_dict(), allow)
        if (ckpt.averaged_iterate is not None) != self.evaluator.averages:
            raise ConfigError(f"run-config key 'eval-averaged-iterate' = {self.evaluator.averaged} but the checkpoint "
                              f"of round {ckpt.round} in {folder} was written with the other value: resume with "
                              "the same eval-averaged-iterate")
        state = RunState.restored(ckpt)  # every field, the method's state as saved
        self.strategy.state = state.strategy  # rebuilt by the method (central DP's clipping norm included)
        self.strategy.restored()  # e.g. SCAFFOLD re-sends the mirrored client control variates
        state.strategy = self.strategy.state
        recorded = last_recorded_round(folder)
        line = None
        if recorded is not None and recorded > ckpt.round:
            line = (f"resumed from the checkpoint of round {ckpt.round} although {folder} recorded rounds up to "
                    f"{recorded}: the newer checkpoints were damaged, deleted or replaced; rounds {ckpt.round + 1}-"
                    f"{recorded} run again and their records are replaced")
            state.warnings.append(line)
        state.resumes.append({"from": str(folder), "round": ckpt.round, "last_recorded_round": recorded,
                              "rolled_back": line is not None})
        self.state = state
        return line

    # -- results ---------------------------------------------------------------------------------
    def log_round(self, rec: dict[str, Any], seconds_per_round: float | None) -> None:
        """One line per round; ``seconds_per_round``: the mean of the rounds after the run's
        first (None in the first round: no ETA yet)."""
        r = rec["round"]
        if r % self.cfg.log_every and "eval" not in rec and r != self.cfg.num_server_rounds:
            return
        line = f"round {r:4d}/{self.cfg.num_server_rounds}: {rec['num_replies']} replies"
        if rec["num_dropped"]:
            line += f" ({rec['num_dropped']} dropped)"
        if "train_loss" in rec:
            line += f", train loss {rec['train_loss']:.4f}"
        if "eval" in rec:
            e = rec["eval"]
            line += f" | mean acc {e['mean_acc']:.4f}, worst-10% {e['worst10_acc']:.4f}, jain {e['jain']:.4f}"
        if seconds_per_round is None:
            line += f" [{rec['round_seconds']:.2f} s]"
        else:
            line += f" [{rec['round_seconds']:.2f} s, ETA {seconds_per_round * (self.cfg.num_server_rounds - r):.0f} s]"
        log.info(line)

    def watch_round(self, state: RunState, record: dict[str, Any]) -> None:
        """The round's warnings (logged and kept in ``state`` for summary.json): an evaluation far
        below the previous one, and accepted updates near the size bound in several rounds."""
        r = record["round"]

        def warn(text: str) -> None:
            state.warnings.append(text)
            log.warning("%s", text)

        faults.watch(state.history, record, warn)  # errors and time-outs of most clients
        if "eval" in record:
            earlier = [h for h in state.history if "eval" in h]
            now, before = record["eval"].get("mean_acc"), earlier[-1]["eval"].get("mean_acc") if earlier else None
            if now is not None and before is not None and before - now >= divergence.SUDDEN_DROP:
                warn(f"round {r}: mean accuracy fell from {before:.4f} (round {earlier[-1]['round']}) to {now:.4f}")
        # Accepted updates near the size bound in several rounds (poisoning under the bound): counted
        # once, in the reply trust (strategies.gate), whose one warning the round's update_norms carry.
        if (text := (record.get("update_norms") or {}).get("warning")) and text not in state.warnings:
            state.warnings.append(text)  # logged where it was made

    def finish(self, stopped: str | None = None, report: bool = True) -> dict[str, Any]:
        """clients.csv, the final model and summary.json; ``stopped``: why the run ended early;
        ``report``: draw report.md and the figures (figures = auto)."""
        cfg, final, data = self.cfg, self.state.last_eval or _no_evaluation(self.cfg.num_clients), self.evaluator.data
        reported = node_data.sizes(self.membership) if self.node_data else {}  # (train, test) rows per node
        replied = _times_replied(self.state.history, cfg.num_clients)
        rows = [{
            "partition_id": pid,
            "num_train": len(data.train_idx[pid]) if data else reported.get(pid, ("", ""))[0],
            "num_test": len(data.test_idx[pid]) if data else reported.get(pid, ("", ""))[1],
            "times_sampled": int(self.state.times_sampled[pid]),
            "times_replied": int(replied[pid]),
            "final_acc": final["client_acc"][pid],
            "final_loss": final["client_loss"][pid],
        } for pid in range(cfg.num_clients)]
        self.writer.clients(rows)
        # The final global model: a plain state_dict (torch.load(path, weights_only=True) reads it).
        self.writer.model(self.state.arrays.to_torch_state_dict())
        summary = {
            "method": cfg.method,
            "seed": cfg.seed,
            "rounds": cfg.num_server_rounds,
            **{k: final[k] for k in ("mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain",
                                     "mean_loss", "max_loss")},
            "central_acc": final.get("central_acc"),
            "central_loss": final.get("central_loss"),
            "client_acc": final["client_acc"],
            **summary_fields(final, [r["eval"] for r in self.state.history if "eval" in r],
                             self.evaluator.scored_iterate),
            "num_dropped_replies": sum(r["num_dropped"] for r in self.state.history),
            "aggregation_errors": sum(1 for r in self.state.history if "aggregation_error" in r),
            "evaluated_round": next((r["round"] for r in reversed(self.state.history) if "eval" in r), None),
            **self.completeness(stopped),
            "warnings": list(self.state.warnings),
            "resumes": list(self.state.resumes),  # each resume: from which folder and round, and whether it rolled back
            **self.hostile_summary(final),
            "weighting": weighting_of(cfg.method, cfg.as_dict()),  # how the method weights clients (registry)
            "config": cfg.as_dict(),
            "output_dir": str(self.writer.dir),
            "gpus": visible_gpus(),  # physical ids of the GPUs this run's process could use ([] on the CPU)
            **_execution(self.grid),  # the local engine's rows-or-loop and threads (fedpcd_app.runtime.execution)
        }
        self.writer.summary(summary)
        self.writer.close()
        if self.tracker is not None:
            self.tracker.summary(summary)
            self.tracker.close()
        if report and self.draws_report():  # report.md and the run's figures
            drawer, self.drawer = getattr(self, "drawer", None), None
            report_process.draw_report(self.writer.dir, drawer)
        if self.state.last_eval:
            log.info("done: mean acc %.4f, worst-10%% %.4f, jain %.4f, central %.4f -> %s",
                     summary["mean_acc"], summary["worst10_acc"], summary["jain"],
                     summary["central_acc"] if summary["central_acc"] is not None else float("nan"), self.writer.dir)
        self.finished = True
        return summary

    def completeness(self, stopped: str | None) -> dict[str, Any]:
        """``complete`` and, when false, ``incomplete_reason``. A *collapsed* final model
        (:func:`fedpcd_app.server.divergence.collapse`: its evaluation kept under a third of the
        best earlier evaluation's gain over chance) makes the run incomplete (``incomplete_reason``
        "collapsed at round N: ...", and a ``collapsed`` field with the rounds and accuracies):
        incomplete rather than a flag beside ``complete: true``, because whatever reads only
        ``complete`` (the reports, the sweeps' tables) must not score a collapsed model as the
        method's result; so does a final model outside the norm bounds
        (:func:`~fedpcd_app.server.divergence.norm_outside`) and, after 20 rounds or more, one still
        at chance (:func:`~fedpcd_app.server.divergence.at_chance`). Else: a run that stopped early, one
        whose aggregation failed in some round (the model kept, on-aggregation-error=keep), or
        one in which a node could not load its data (a ``DataError`` reply: that client never
        trained, unlike a node that dropped out for a while), or one that ended inside a streak of
        rounds whose every arrived reply was dropped (shorter than ``diverge-patience``: measured, a
        round whose attackers were the majority let a huge update through and the next rounds'
        replies were all refused; the final model is then not to be trusted)."""
        failed = [r for r in self.state.history if "aggregation_error" in r]
        reason = stopped
        if reason is None and failed:
            reason = (f"aggregation failed in {len(failed)} round(s), first round {failed[0]['round']}: "
                      f"{failed[0]['aggregation_error']}; on-aggregation-error='keep' kept the previous model")
        bad_data = [d for r in self.state.history for d in r.get("dropped", ()) if "DataError" in str(d.get("reason"))]
        if reason is None and bad_data:
            pids = sorted({d["partition"] for d in bad_data if d.get("partition") is not None})
            reason = (f"partition(s) {pids} could not load their data ({len(bad_data)} dropped train repl(ies)), "
                      f"first: {bad_data[0]['reason']}")
        reason = reason or faults.incomplete_reason(self.state.history)  # most clients failing (faults.py)
        streak = self.state.watch.refused_rounds
        if reason is None and streak:
            reason = (f"the last {streak} round(s) dropped every reply that arrived (diverge-patience = "
                      f"{self.watch.patience} was not reached before the run ended): the final model may have "
                      "diverged or been poisoned")
        out: dict[str, Any] = {}
        # the validation split when the run has one (divergence.selection_acc): these checks decide selection
        evals = [(r["round"], divergence.selection_acc(r["eval"])) for r in self.state.history if "eval" in r]
        if (collapsed := divergence.collapse(evals, self.classes)) is not None:
            out["collapsed"] = collapsed
            if reason is None:
                c = collapsed
                reason = (f"collapsed at round {c['round']}: the final mean accuracy {c['mean_acc']:.4f} kept under "
                          f"{divergence.COLLAPSE_KEEP:.0%} of the gain over chance ({c['chance']:.3g}) of the best "
                          f"evaluation, {c['best_mean_acc']:.4f} at round {c['best_round']}: the final model is not "
                          "this run's result")
        if reason is None and (why := divergence.norm_outside(divergence.model_norm(self.state.arrays),
                                                              self.initial_norm)) is not None:
            reason = f"final model out of bounds: {why}"
        rounds = self.state.history[-1]["round"] if self.state.history else 0
        if reason is None and self.state.last_eval and (why := divergence.at_chance(
                divergence.selection_acc(self.state.last_eval), self.classes, rounds)) is not None:
            reason = f"at chance at round {rounds}: {why}"
        return {"complete": reason is None, "incomplete_reason": reason, **out}

    def hostile_summary(self, final: dict[str, Any]) -> dict[str, Any]:
        """The attack and the attacked partitions, the honest clients' metrics, the defences."""
        out: dict[str, Any] = {"attack": attacks.Params.from_run_config(self.cfg.params).kind,
                               "attacked_partitions": list(self.evaluator.attacked)}
        if "honest" in final:
            out["honest"] = final["honest"]
        if (clip := find(self.strategy.method, UpdateClip)) is not None:
            out["update_clip"] = {"c": clip.c, "num_clipped": sum(
                r.get("update_clip", {}).get("num_clipped", 0) for r in self.state.history)}
        if (dp := find(self.strategy.method, CentralDP)) is not None:
            out["privacy"] = dp.describe(dp_state(self.strategy.method, self.strategy.state))
        return out


def dp_state(method, state):
    """Central DP's state inside the method chain's state (the transforms outside it pass their inner's on)."""
    while not isinstance(method, CentralDP):
        method = method.inner
    return state


def _execution(grid) -> dict[str, Any]:
    """``{"execution": ...}``: how the grid's engine computed the run, when it says (the local engine)."""
    found = getattr(grid, "execution", None) or getattr(getattr(grid, "inner", None), "execution", None)
    return {"execution": dict(found)} if isinstance(found, Mapping) else {}


def _no_evaluation(num_clients: int) -> dict[str, Any]:
    """The final metrics of a run interrupted before its first evaluation: none."""
    keys = ("mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain", "mean_loss", "max_loss")
    return {**dict.fromkeys(keys), "central_acc": None, "central_loss": None, "num_scored": 0,
            "client_acc": [None] * num_clients, "client_loss": [None] * num_clients}


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
    their replies before the model is built (:mod:`fedpcd_app.server.node_data`)."""
    setup_logging()
    membership = None
    set_log_method((setup.cfg.method if isinstance(setup, Setup) else dict(setup).get("method")) or "fedpcd")
    if not isinstance(setup, Setup):
        raw = dict(setup)
        if local_data.is_node_mode(raw):
            membership = Membership(resolve_round_timeout(check(raw), grid))
            membership.discover(grid)
            raw = node_data.complete(raw, membership)
        setup = validate(raw)
    if membership is None:
        grid, membership = routed(grid, setup.cfg)
    return Experiment(grid, setup, membership).run()


def routed(grid: Grid, cfg: RunConfig) -> tuple[Grid, Membership | None]:
    """In a partitioned simulation whose node count is not ``num-clients`` (e.g. Flower's
    default 2 SuperNodes): the grid of one virtual node per partition over the real ones, and
    its membership (:class:`fedpcd_app.server.membership.PartitionRouter`); else ``(grid, None)``."""
    from fedpcd_app.server.exchange import is_simulation

    if local_data.is_node_mode(cfg) or not is_simulation(grid):
        return grid, None
    # a grid whose nodes all exist when it is built (the local engine's LocalGrid) declares
    # nodes_fixed = True; Flower's simulation grid is waited on until its node set is stable
    fixed = getattr(grid, "nodes_fixed", False) is True
    nodes = list(grid.get_node_ids()) if fixed else wait_for_stable_nodes(grid)
    if not routing_wanted(cfg, grid, nodes):
        return grid, None
    router = PartitionRouter(grid, cfg.num_clients, nodes)
    return router, route_partitions(resolve_round_timeout(cfg, grid), router)


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
        try:
            run_experiment(grid, setup if setup is not None else dict(context.run_config))
        except ONE_LINE_ERRORS as exc:
            one_line_report(exc)  # Flower's report of it ends with the app's one line
            raise

    return server_app


app = make_server_app()

__all__ = ["app", "make_server_app", "run_experiment", "Experiment", "AggregationStopped"]
