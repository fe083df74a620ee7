"""A run that went wrong says so: the round loop's last line of defence against divergence.

Replies are validated before any method sees them (non-finite arrays, counts, sizes); this
watches what comes out. The run stops, with one line and a summary saying
``complete: false``, ``incomplete_reason: "diverged at round N: <why>"``, when

1. **the global model becomes non-finite** (NaN or ±Inf in any array after an aggregation):
   at once; the model is rolled back to the last finite one (the round's aggregate is not
   kept), and that is the model scored, saved as ``final_model.pt`` and left in memory;
2. **every reply is refused** for ``diverge-patience`` consecutive rounds: rounds in which
   replies came back and all of them were dropped (a round whose drops are all timeouts or
   lost replies is a federation problem, not a divergence, and neither counts nor resets);
3. **the train loss is non-finite, or at chance level or worse without progress**, for
   ``diverge-patience`` consecutive rounds: the *median* of the round's valid replies' train
   losses (a minority of lying clients cannot move it) is ``>= ln(C)`` (the loss of the
   uniform guess over the model's C classes) and no lower than the best median seen so
   far. A run learning slowly near chance makes a new best most rounds and is not stopped;
   a run that learnt and fell back to chance, or whose loss grows from the start, is.

``diverge-patience = 0`` turns criteria 2 and 3 off; criterion 1 always holds (a non-finite
model can only give non-finite scores). The default, 5 rounds, never fires on the golden or
robustness runs (measured: tests/test_golden.py, docs/results/robustness_digits.md's settings).
No checkpoint is written for the diverged round: the latest one on disk is from before it.

After the run, the final model is judged too (``Experiment.completeness``, ``complete: false``
with the reason): :func:`collapse` (the final evaluation kept under a third of the best earlier
one's gain over chance), :func:`norm_outside` (a norm outside 1e-3-1e3 x the initial model's)
and :func:`at_chance` (20+ rounds and still at chance), on the validation split when the run has
one (:func:`selection_acc`: these checks feed selection). The train-loss criterion above reads
the losses *after* local training, which a poisoned model can keep below ln C; these read the
global model's own evaluation. :class:`Interrupts` turns SIGINT/SIGTERM into
:class:`RunInterrupted` at points where the run's state is whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from fedcore import keys, replies
from fedcore.config import RunConfig

PREFIX = "diverged at round"  # contract: summary.json incomplete_reason starts with it
NO_REPLY = "no reply"  # fedcore's reason for a timed-out or lost reply


def num_classes(model: torch.nn.Module) -> int:
    """C: the output width of the model's last linear layer (0 when it has none)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return int(linears[-1].out_features) if linears else 0


def is_finite(arrays) -> bool:
    """Every array of an ArrayRecord (or a mapping of numpy arrays) finite."""
    from fedcore.flat import array_view

    for value in arrays.values():
        # a Flower Array read in place (its .npy header parsed once per shape), not np.load's copy
        a = array_view(value) if hasattr(value, "numpy") else np.asarray(value)
        if a.dtype.kind in "fc" and a.size and not np.isfinite(a).all():
            return False
    return True


@dataclasses.dataclass
class WatchCounts:
    """What :class:`Watch` carries from round to round (part of the run's state,
    :class:`fedpcd_app.server.run_state.RunState`, checkpointed with it): the current streaks of
    criteria 2 and 3 and the best median train loss so far."""

    refused_rounds: int = 0
    bad_loss_rounds: int = 0
    best_loss: float = math.inf

    def as_dict(self) -> dict[str, Any]:
        return {"refused_rounds": int(self.refused_rounds), "bad_loss_rounds": int(self.bad_loss_rounds),
                "best_loss": float(self.best_loss)}

    @classmethod
    def from_dict(cls, raw: Any) -> WatchCounts:
        """Rebuilt from :meth:`as_dict` (a checkpoint); anything else is a one-line ValueError."""
        try:
            counts = cls(int(raw["refused_rounds"]), int(raw["bad_loss_rounds"]), float(raw["best_loss"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint's divergence counts are unreadable ({type(exc).__name__}: {exc})") from None
        if counts.refused_rounds < 0 or counts.bad_loss_rounds < 0 or math.isnan(counts.best_loss):
            raise ValueError("checkpoint's divergence counts hold a negative count or a NaN loss")
        return counts


class Watch:
    """The rules of criteria 2 and 3 (see the module docstring); the rounds they count are the
    run state's :class:`WatchCounts`, given to each call (a resumed run continues its streaks)."""

    def __init__(self, cfg: RunConfig, classes: int) -> None:
        self.patience = cfg.diverge_patience
        self.chance = math.log(classes) if classes >= 2 else None

    def observe(self, record: dict[str, Any], valid: Iterable, c: WatchCounts) -> str | None:
        """After a round's aggregation: why the run diverged, or None; ``c``: the round's counts
        (the next run state's), updated."""
        if record.get("diverged"):
            return record["diverged"]
        if not self.patience:
            return None
        arrived = [d for d in record.get("dropped", ()) if not str(d.get("reason", "")).startswith(NO_REPLY)]
        if record.get("num_replies", 0) == 0 and arrived:
            c.refused_rounds += 1
        elif record.get("num_replies", 0) > 0:
            c.refused_rounds = 0
        if c.refused_rounds >= self.patience:
            return f"every reply was dropped in {c.refused_rounds} consecutive rounds"
        losses = [float(r.content[keys.METRICS][keys.TRAIN_LOSS]) for r in valid
                  if keys.TRAIN_LOSS in r.content[keys.METRICS]]
        if losses:
            median = replies.median(losses)  # float(np.median(losses)), bit for bit
            bad = not math.isfinite(median) or (
                self.chance is not None and median >= self.chance and median >= c.best_loss)
            if math.isfinite(median):
                c.best_loss = min(c.best_loss, median)
            c.bad_loss_rounds = c.bad_loss_rounds + 1 if bad else 0
            if c.bad_loss_rounds >= self.patience:
                what = "non-finite" if not math.isfinite(median) else (
                    f"at chance level or worse (median {median:.4g} >= ln({round(math.exp(self.chance))}) = "
                    f"{self.chance:.4g}) without progress")
                return f"the train loss was {what} for {c.bad_loss_rounds} consecutive rounds"
        return None


def model_norm(arrays) -> float:
    """The global model's L2 norm over its float arrays (an ArrayRecord or a mapping of arrays)."""
    total = 0.0
    from fedcore.flat import array_view

    for value in arrays.values():
        # a Flower Array read in place (its .npy header parsed once per shape), not np.load's copy
        a = array_view(value) if hasattr(value, "numpy") else np.asarray(value)
        if a.dtype.kind in "fc" and a.size:
            total += float(np.sum(np.square(a, dtype=np.float64)))
    return math.sqrt(total)


def selection_acc(evaluation: dict[str, Any]) -> float | None:
    """The mean accuracy the completeness checks read from an evaluation record: the validation
    split's (``val_mean_acc``) when the run has one, else the test split's. A check that decides
    whether a run counts in hyperparameter selection must not read the test split it reports on
    (issue 42: test data leaked into selection through the collapse / at-chance rules)."""
    val = evaluation.get("val_mean_acc")
    return val if val is not None else evaluation.get("mean_acc")


# -- a collapsed final model (server_app.Experiment.completeness) ------------------------------------
# A run whose final evaluation lost most of what it had gained over chance is not complete: the
# mean accuracy of the final model is within COLLAPSE_KEEP of its best earlier gain over chance
# (1/C) although that best gain was at least COLLAPSE_MIN_GAIN. Scale-down majorities (attack =
# 'scale-down', attack-scale = 0.01, attack-fraction = 0.6; numbers reported with the problem):
# fedmedian 0.652 -> 0.113, krum 0.568 -> 0.122, fedpcd 0.913 -> 0.228 on 10 classes keep 2-16 %
# of their gain; an honest run's mean accuracy moves by a few points between evaluations, far
# from losing two thirds of its gain.
COLLAPSE_MIN_GAIN = 0.2
COLLAPSE_KEEP = 1 / 3
# The final model's norm outside [1e-3, 1e3] x the initial model's: not a trained model (a
# majority of 'huge' updates ends near 6e29 per weight, an all-zero model at 0). Honest training moves
# the norm by a small factor, three orders of magnitude inside either bound.
NORM_BOUNDS = (1e-3, 1e3)
# Warnings (summary.json "warnings", and the log): an evaluation this far below the previous
# one (accepted updates near the size bound: fedcore.replies.NEAR_BOUND, NEAR_BOUND_WARN_ROUNDS).
SUDDEN_DROP = 0.15


def collapse(evaluations: list[tuple[int, float]], classes: int) -> dict[str, Any] | None:
    """``evaluations``: (round, mean accuracy) in order. The collapse of the last one (see
    :data:`COLLAPSE_MIN_GAIN`), as a dict for summary.json, else None."""
    scored = [(r, a) for r, a in evaluations if a is not None and math.isfinite(a)]
    if len(scored) < 2 or classes < 2:
        return None
    chance = 1.0 / classes
    (last_round, last), earlier = scored[-1], scored[:-1]
    best_round, best = max(earlier, key=lambda e: e[1])
    gain = best - chance
    if gain < COLLAPSE_MIN_GAIN or last - chance > COLLAPSE_KEEP * gain:
        return None
    return {"round": last_round, "mean_acc": last, "best_mean_acc": best, "best_round": best_round,
            "chance": chance}


# A run of at least AT_CHANCE_ROUNDS rounds whose final model scores at most AT_CHANCE x chance
# (1/C) has not learnt (e.g. fedmedian 0.113 and krum 0.122 on 10 classes under a scale-down
# majority): incomplete too. Shorter runs may honestly still be there.
AT_CHANCE = 1.5
AT_CHANCE_ROUNDS = 20


def at_chance(final_acc: float | None, classes: int, rounds: int) -> str | None:
    """Why a final mean accuracy is a model that never learnt (see :data:`AT_CHANCE`), else None."""
    if final_acc is None or classes < 2 or rounds < AT_CHANCE_ROUNDS or not math.isfinite(final_acc):
        return None
    chance = 1.0 / classes
    if final_acc > AT_CHANCE * chance:
        return None
    return (f"the final mean accuracy {final_acc:.4f} is at chance level (<= {AT_CHANCE:g} x 1/{classes}) after "
            f"{rounds} rounds")


def norm_outside(final: float, initial: float) -> str | None:
    """Why the final model's norm is not a trained model's (:data:`NORM_BOUNDS`), else None."""
    if not math.isfinite(final):
        return "the final model is not finite"
    if initial <= 0 or not math.isfinite(initial):
        return None
    low, high = NORM_BOUNDS
    if final > high * initial or final < low * initial:
        return (f"the final model's norm {final:.3g} is {final / initial:.3g} x the initial model's {initial:.3g} "
                f"(outside [{low:g}, {high:g}] x)")
    return None


# -- SIGINT / SIGTERM during a run (server_app.Experiment.run) ------------------------------------
class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a run; ``signal_name`` says which."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class Interrupts:
    """While entered (in the main thread): SIGINT and SIGTERM raise :class:`RunInterrupted` at
    once, except inside :meth:`deferred` blocks (a round's aggregation and record, a checkpoint),
    where they are held until the block ends. A signal the process ignores (a background job's
    SIGINT) stays ignored. The earlier handlers come back on exit."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self) -> None:
        self.pending: str | None = None
        self.depth = 0
        self.old: dict = {}

    def __enter__(self) -> Interrupts:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name)
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue
                try:
                    self.old[sig] = signal.signal(sig, self._handler)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        self.old = {}

    def _handler(self, signum, frame) -> None:
        import signal

        name = signal.Signals(signum).name
        if self.depth:
            self.pending = name
            return
        raise RunInterrupted(name)

    def deferred(self):
        return _Deferred(self)

    def interruptible(self):
        """Inside :meth:`deferred` blocks, a window in which a signal ends the run at once (a
        round's exchange waiting for its clients); one held before the window is raised on entry."""
        return _Interruptible(self)


class _Deferred:
    def __init__(self, owner: Interrupts) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        self.owner.depth += 1

    def __exit__(self, kind, value, tb) -> None:
        self.owner.depth -= 1
        if kind is None and not self.owner.depth and self.owner.pending:
            name, self.owner.pending = self.owner.pending, None
            raise RunInterrupted(name)


class _Interruptible:
    def __init__(self, owner: Interrupts) -> None:
        self.owner, self.depth = owner, 0

    def __enter__(self) -> None:
        self.depth = self.owner.depth
        if self.owner.pending:
            name, self.owner.pending = self.owner.pending, None
            raise RunInterrupted(name)
        self.owner.depth = 0

    def __exit__(self, kind, value, tb) -> None:
        self.owner.depth = self.depth


class signals_ignored:
    """SIGINT and SIGTERM ignored inside (the main thread only): the interrupted run's saving."""

    def __enter__(self) -> None:
        import signal
        import threading

        self.old = {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc) -> None:
        import signal

        for s, h in self.old.items():
            signal.signal(s, h)
