"""Scoring the global model on every client's local test split, and on the central test set.

Two paths give the same numbers:

* ``eval-mode=server`` (simulation default): the server rebuilds the partition (the data
  code is deterministic in the config) and scores all clients' test splits in one batched
  pass: one forward over the concatenated splits, then per-client segment sums. No
  messages, no model copies per client.
* ``eval-mode=federated`` (deployment, personalised methods): an EVALUATE message to every
  node; each scores its own split with :func:`client_app.training.evaluate`. A client that
  does not answer is left out of the fairness metrics: the record lists it under
  ``unscored_clients`` (and a warning says so); ``num_scored`` is the number of clients the
  metrics were computed over. The only path when the nodes bring their own data
  (``client-data = "node"``): the server then holds no dataset, and its central test set is
  ``central-test-path`` if given (else no ``central_acc``).

With a validation split (``val-fraction`` > 0) every evaluation also scores it: the same
metrics prefixed ``val_`` (``val_mean_acc``, ``val_worst10_acc``, ..., ``val_client_acc``),
which hyperparameter selection reads (``fedpcd_app.analysis.report``) instead of the test numbers.
:func:`summary_fields` adds to ``summary.json`` the final evaluation's ``num_scored``,
``unscored_clients`` and ``val_*`` metrics, and the means over the final ten evaluations
(``final10_*``, as FedeRage's Table I reads its last ten rounds), for any method.

Which iterate is scored (``eval-averaged-iterate``, every method). ``false`` (default): the
global model θ_t of the round (what the method's ``evaluation_arrays`` returns: θ_t for every
method except AFL). ``true``: the running average θ̄_t = (1/t) Σ_{s=1..t} θ_s of the global
models after rounds 1..t (:func:`averaged`, kept in the run state; a round without a valid reply counts with
the unchanged model), FedeRage's Algorithm 1 output, so that every method can be scored on the
same iterate. AFL's own output is already an averaged iterate (the mean of θ_0..θ_t, its
paper's reported model, ``strategies.afl``): AFL is scored on it with either value of the key
(the key changes nothing for AFL). ``summary.json`` says what was scored: ``scored_iterate``
(``"last"`` or ``"averaged"``) and ``scored_split`` (``"test"``: the headline metrics and
``final10_*``; ``val_*`` are the validation split's). The average is checkpointed and resumed.

The last iterate beside the averaged one (issue 52). When the averaged iterate is scored
(``eval-averaged-iterate = true``, a method other than AFL) on the server path, every
evaluation also scores the round's global model θ_t on the same splits and records it under
``iterate_scores`` → ``last`` (the same metric keys as the evaluation itself: the fairness
metrics, ``central_acc``, ``client_acc``, ``val_*``), and :func:`summary_fields` adds the final
evaluation's (and the final ten's means, ``final10_*``) as ``summary.json``'s
``iterate_scores.last``. So one sweep gives a page both columns: the iterate a method's paper
scores (the last model θ_T, FedPCD's and CRAFT's papers) and the averaged one θ̄_T (FedeRage's
Algorithm 2). The headline fields keep their meaning (the ``scored_iterate``'s numbers); the
extra scoring reads θ_t after the headline's, so those numbers are unchanged. AFL (its own output
is the average) and the federated path (personalised methods: Ditto's personal models) add none.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch.nn import functional as F

from client_app.data import FederatedData
from client_app.training import evaluate
from fedcore import flat

log = logging.getLogger("fedpcd")

# The metrics of an evaluation that summary.json repeats, and those averaged over the final ten.
FAIRNESS_KEYS = ("mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain", "mean_loss", "max_loss")
FINAL_MEAN_KEYS = ("mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain", "central_acc",
                   "val_mean_acc", "val_worst10_acc")
FINAL_EVALS = 10


@torch.no_grad()
def score_clients(model: torch.nn.Module, data: FederatedData, batch_size: int = 128,
                  split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """(accuracy, mean loss) per client on its ``split`` (``test`` or ``val``), in
    partition-id order, in one batched pass."""
    dev = next(model.parameters()).device
    model.eval()
    sets = data.test_idx if split == "test" else data.val_idx
    idx = np.concatenate(sets)
    sizes = np.array([len(t) for t in sets])
    x, y = data.x[torch.from_numpy(idx)], data.y[torch.from_numpy(idx)]
    correct = np.empty(len(idx), dtype=np.float64)
    losses = np.empty(len(idx), dtype=np.float64)
    for start in range(0, len(idx), batch_size):
        xb, yb = x[start : start + batch_size].to(dev), y[start : start + batch_size].to(dev)
        logits = model(xb)
        losses[start : start + len(yb)] = F.cross_entropy(logits, yb, reduction="none").double().cpu().numpy()
        correct[start : start + len(yb)] = (logits.argmax(dim=1) == yb).double().cpu().numpy()
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    acc = np.add.reduceat(correct, starts) / sizes
    loss = np.add.reduceat(losses, starts) / sizes
    return acc, loss


def score_central(model: torch.nn.Module, data: FederatedData, batch_size: int = 128) -> tuple[float, float]:
    """(accuracy, loss) on the central test set."""
    return evaluate(model, data.x_central, data.y_central, batch_size)


ITERATES = ("last", "averaged")


def averaged(average: dict | None, arrays) -> dict | None:
    """The running mean after one more global model: θ̄_t = θ̄_{t-1} + (θ_t − θ̄_{t-1}) / t (float64,
    flat), from ``average`` = ``{"mean": θ̄_{t-1}, "count": t − 1}`` (``{}`` before the first round);
    a new dict, ``average`` unchanged. None stays None (the run does not average)."""
    if average is None:
        return None
    x = flat.record_to_flat(arrays, dtype=torch.float64)
    count = int(average.get("count", 0))
    mean = x.clone() if not average or count == 0 else average["mean"] + (x - average["mean"]) / (count + 1)
    return {"mean": mean, "count": count + 1}


def strategy_averages(strategy) -> bool:
    """Whether the method's own evaluation model is an averaged iterate (AFL)."""
    return strategy.method.evaluated_iterate == "averaged"


class Evaluator:
    """Scores the global model on every client (server-side batched, or federated through
    the strategy's ``configure_evaluate``/``evaluate_outcome``) and on the central test set;
    when partitions attack (:mod:`client_app.attacks`), the fairness metrics over the honest
    clients only too (``honest``)."""

    def __init__(self, cfg, strategy, model: torch.nn.Module) -> None:
        from client_app import local_data
        from client_app.attacks import attacked_partitions
        from client_app.data import load_federated_data
        from client_app.training import device

        self.cfg, self.strategy = cfg, strategy
        self.attacked = attacked_partitions(cfg.as_dict())  # fairness is also given without them
        self.mode = "federated" if strategy.method.personalized else cfg.eval_mode
        self.model = model
        self._data = None
        self.central = None  # (x, y): the central test set of a run whose nodes bring their own data
        if local_data.is_node_mode(cfg):  # no dataset on the server; a central test set if given
            self.central = local_data.load_central_test(cfg)
        elif self.mode == "server" or cfg.dataset == "digits" or cfg.dataset_path:
            self._data = load_federated_data(cfg)  # a data problem stops the run here, before training
        self.model = model.to(device())
        self.averaged = cfg.eval_averaged_iterate
        # AFL averages its own iterate: it is scored on that (see the module doc)
        self.averages = bool(self.averaged and not strategy_averages(strategy))  # the run state keeps θ̄_t

    @property
    def scored_iterate(self) -> str:
        """``"averaged"`` or ``"last"``: what :meth:`evaluate` scores."""
        return "averaged" if self.averaged or strategy_averages(self.strategy) else "last"

    @staticmethod
    def scored_arrays(arrays, average: dict | None = None):
        """The arrays handed to the strategy's ``evaluation_arrays``: θ̄_t (``average``, the run
        state's) with eval-averaged-iterate once a round has run, else θ_t."""
        if average:
            return flat.flat_to_record(average["mean"], flat.spec_of(arrays))
        return arrays

    @property
    def data(self):
        return self._data

    def evaluate(self, server_round: int, arrays, grid, context, average: dict | None = None) -> dict:
        """The scores of every client and the fairness metrics; ``context``: the strategy's calls'
        (:class:`strategies.requests.RunContext`) for federated evaluation; ``average``: the run
        state's θ̄_t (eval-averaged-iterate)."""
        import time

        t0 = time.perf_counter()
        last = arrays  # θ_t: scored beside θ̄_t under eval-averaged-iterate (iterate_scores, module doc)
        arrays = self.scored_arrays(arrays, average)
        self.model.load_state_dict(self.strategy.evaluation_arrays(arrays).to_torch_state_dict())
        out: dict = {}
        val, reasons = None, {}
        if self.mode == "server":
            acc, loss = score_clients(self.model, self._data, self.cfg.eval_batch_size)
            if self._data.has_validation:
                val = score_clients(self.model, self._data, self.cfg.eval_batch_size, split="val")
        else:
            acc, loss, val, reasons = self.federated_scores(server_round, arrays, grid, context)
        if self._data is not None:
            out["central_acc"], out["central_loss"] = score_central(self.model, self._data, self.cfg.eval_batch_size)
        elif self.central is not None:
            out["central_acc"], out["central_loss"] = evaluate(self.model, *self.central, self.cfg.eval_batch_size)
        if self.mode == "server" and self.averages:
            out["iterate_scores"] = {"last": self.server_scores(last)}
        present = ~np.isnan(acc)
        out.update(_fairness(acc, loss))
        honest = present.copy()
        honest[self.attacked] = False
        if self.attacked and honest.any():  # the same metrics over the honest clients only
            out["honest"] = _fairness(acc[honest], loss[honest])
        out["num_scored"] = int(present.sum())
        out["unscored_clients"] = np.flatnonzero(~present).tolist()
        if reasons:  # replies that failed validation (fedcore.replies.check_eval_reply)
            out["unscored_reasons"] = {str(pid): why for pid, why in sorted(reasons.items())}
        if out["unscored_clients"]:
            log.warning("round %d: %d of %d clients did not answer the evaluation and are left out of the "
                        "fairness metrics: %s", server_round, len(out["unscored_clients"]), len(acc),
                        out["unscored_clients"])
        out["client_acc"] = acc.tolist()
        out["client_loss"] = loss.tolist()
        if val is not None:
            out.update({f"val_{k}": v for k, v in _fairness(*val).items()})
            out["val_client_acc"] = val[0].tolist()
        out["eval_seconds"] = time.perf_counter() - t0
        return out

    def server_scores(self, arrays) -> dict:
        """The server path's scores of ``arrays`` (the method's evaluation view of them): the
        fairness metrics, the central test set's, every client's accuracy and loss, and the
        validation split's (``val_*``) when there is one; no message is sent."""
        self.model.load_state_dict(self.strategy.evaluation_arrays(arrays).to_torch_state_dict())
        acc, loss = score_clients(self.model, self._data, self.cfg.eval_batch_size)
        out: dict = {}
        out["central_acc"], out["central_loss"] = score_central(self.model, self._data, self.cfg.eval_batch_size)
        out.update(_fairness(acc, loss))
        out["client_acc"], out["client_loss"] = acc.tolist(), loss.tolist()
        if self._data.has_validation:
            val = score_clients(self.model, self._data, self.cfg.eval_batch_size, split="val")
            out.update({f"val_{k}": v for k, v in _fairness(*val).items()})
            out["val_client_acc"] = val[0].tolist()
        return out

    def federated_scores(self, server_round: int, arrays, grid,
                         context) -> tuple[np.ndarray, np.ndarray, tuple | None, dict[int, str]]:
        """(accuracy, loss, (validation accuracy, loss) or None) per client, NaN where a client
        was not scored, and why each unscored reply was not used."""
        from flwr.app import ConfigRecord

        from fedpcd_app.server.exchange import send_and_receive  # errors attributed to the request's node

        msgs = self.strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid, context)
        replies = send_and_receive(grid, msgs, timeout=self.cfg.round_timeout or None)
        outcome = self.strategy.evaluate_outcome(server_round, replies, context)
        n = self.cfg.num_clients
        acc, loss = np.full(n, np.nan), np.full(n, np.nan)
        for pid, score in outcome.scores.items():
            if 0 <= pid < n:
                acc[pid], loss[pid] = score["accuracy"], score["loss"]
        if self.cfg.val_fraction <= 0:
            return acc, loss, None, outcome.unscored
        val_acc, val_loss = np.full(n, np.nan), np.full(n, np.nan)
        for pid, (v_acc, v_loss) in outcome.val.items():
            if 0 <= pid < n:
                val_acc[pid], val_loss[pid] = v_acc, v_loss
        return acc, loss, (val_acc, val_loss), outcome.unscored


def reply_limits(cfg, data: FederatedData | None, membership=None):
    """The bounds on the clients' numbers (:class:`fedcore.replies.ReplyLimits`) from what the
    server knows: with the run's partitions (``data``) every partition's train and test size;
    with ``client-data = "node"`` each node's sizes from its first QUERY report, capped at
    ``max-num-examples``; else (a partitioned run whose server holds no data) ``max-num-examples``
    for every client. ``max-update-ratio`` bounds the update norms."""
    from fedcore.replies import ReplyLimits

    cap = cfg.max_num_examples
    limits = ReplyLimits(max_num_examples=cap,
                         max_update_ratio=cfg.max_update_ratio)
    if data is not None:
        limits.train_sizes = {pid: len(idx) for pid, idx in enumerate(data.train_idx)}
        limits.test_sizes = {pid: len(idx) for pid, idx in enumerate(data.test_idx)}
    elif membership is not None:
        limits.train_sizes = _NodeSizes(membership, "num-train", cap)
        limits.test_sizes = _NodeSizes(membership, "num-test", cap)
    return limits


class _NodeSizes:
    """partition → a split's size from the first QUERY report of the node serving it now
    (``client-data = "node"``), capped at max-num-examples; a report's own number is a
    client's claim, so the cap bounds it too."""

    def __init__(self, membership, key: str, cap: int) -> None:
        self.membership, self.key, self.cap = membership, key, cap

    def get(self, pid: int, default=None):
        node = self.membership.node_of.get(pid)
        value = self.membership.reports.get(node, {}).get(self.key) if node is not None else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
            return default
        return min(int(value), self.cap)


def _fairness(acc: np.ndarray, loss: np.ndarray) -> dict:
    """The fairness metrics over the clients that were scored (NaN when none was)."""
    from fedpcd_app.server.metrics import fairness_metrics

    present = ~np.isnan(acc)
    if not present.any():
        return dict.fromkeys(FAIRNESS_KEYS, math.nan)
    return fairness_metrics(acc[present], loss[present])


def summary_fields(final: dict, evaluations: list[dict], scored_iterate: str = "last") -> dict:
    """What ``summary.json`` adds to the final metrics: over how many clients they were
    computed (``num_scored``) and which were not scored (with reasons), which iterate and split
    were scored (``scored_iterate``, ``scored_split``), the validation metrics, and the means over
    the final ten evaluations (``final10_*``; ``final10_num_evals`` of them)."""
    out = {"num_scored": final.get("num_scored"), "unscored_clients": final.get("unscored_clients", []),
           "scored_iterate": scored_iterate, "scored_split": "test"}
    if final.get("unscored_reasons"):
        out["unscored_reasons"] = final["unscored_reasons"]
    out.update({k: v for k, v in final.items() if k.startswith("val_")})
    last = evaluations[-FINAL_EVALS:]
    out["final10_num_evals"] = len(last)
    out.update(_final10(last))
    others = final.get("iterate_scores") or {}
    if others:  # the other iterates scored beside this one (the last θ_T beside θ̄_T: module doc)
        out["iterate_scores"] = {}
        for name, scores in others.items():
            tail = [e["iterate_scores"][name] for e in last if name in (e.get("iterate_scores") or {})]
            out["iterate_scores"][name] = {**scores, "final10_num_evals": len(tail), **_final10(tail)}
    return out


def _final10(evaluations: list[dict]) -> dict:
    """``final10_<key>``: the mean over ``evaluations`` (the final ten) of each of :data:`FINAL_MEAN_KEYS`."""
    out = {}
    for key in FINAL_MEAN_KEYS:
        values = [e[key] for e in evaluations if e.get(key) is not None]
        if values:
            out[f"final10_{key}"] = float(np.mean(values))
    return out
