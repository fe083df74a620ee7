"""FedLF (Pan et al., 2024, "FedLF: Layer-wise Fair Federated Learning", AAAI): layer-wise MGDA.

Per round, with pseudo-gradients g_i = Δ_i / η_l of the sampled clients (the authors'
code, ``zibinpan/FedLF`` ``gfedplat/algorithm/FedLF/FedLF.py``, uses full-batch gradients
at θ_t; with local training the displacement over the learning rate stands in for them)
and their losses l_i = F_i (the global model's loss on their data, before training):

1. Fairness direction in loss space, p = 1/√m · 1:
   h = ((l·p) l/‖l‖ − p ‖l‖) / ‖l‖²  (the tangent that turns l towards the uniform vector).
2. For each layer group q (one group per array of the model's state dict, as the authors'
   ``Loc_list`` has one group per parameter tensor, ``gfedplat/Module.py``; here running
   statistics of normalisation layers, when the model has them, are groups too): rescale the rows of G_q to
   their mean norm μ_q; f_q = h·G_q rescaled to
   μ_q; history rows (stored g of clients absent now, see below) rescaled to μ_q;
   λ_q = min-norm point of the convex hull of all these rows; d_q = λ_qᵀ V_q.
3. d_raw = concat(d_q); d = d_raw rescaled to ‖mean_i g_i‖ (uniform mean). While some
   client conflicts with d (g_i·d < −1e−6): halve d if ‖d‖ > 2‖d_raw‖, else fall back to
   d = d_raw and stop.
4. θ ← θ − η d with η = the round's client learning rate η_l (``lr``·``lr-decay``^(t−1), the
   paper uses decay 0.999) times the server step factor η_g/η_l
   (``Round.step_scale``: 1 by default, ``server-lr``/η_l when it is set).

History rows: the stored g of every client absent this round whose last round is within
τ rounds (t − last ≤ τ). The authors' τ = ⌊(clients ever seen) / m⌋, used only once more
than m distinct clients have been seen; the FedPCD paper instead evaluates FedLF with a
fixed window H = 10 (``fedlf-window``), then every absent client seen within H rounds
counts. Stored g are updated for every client that replied, after the step (the
:class:`State`; a sampled client whose reply was dropped keeps its older row, as before).

The method is ``fedlf``; the strategy
is :class:`FedLF`.

Degenerate cases: when all losses are equal h = 0 and the fairness row carries no
direction; it is then left out (the authors' code would divide 0 by 0). With equal
losses and equal pseudo-gradients d = g (FedAvg with uniform weights: the step η_l·g is
the common Δ). With equal pseudo-gradients but unequal losses, f_q = (Σh) g_q and
Σh ≤ 0, so the fairness row is −g_q and the min-norm point is 0: FedLF stands still.
In exact arithmetic g_i·d ≥ 0 for every row of each group's problem, so the halving
loop only guards against the QP's round-off.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from fedcore import keys
from fedcore.params import MethodParams, hyper
from strategies import linalg
from strategies.base import Method, Reads, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register

CONFLICT_TOL = 1e-6  # g_i·d below −tol counts as a conflict (the authors' tolerance)


def loss_fairness_direction(losses: torch.Tensor) -> torch.Tensor:
    """h = ((l·p) l/‖l‖ − p‖l‖)/‖l‖² with p = 1/√m (zero when all losses are equal).

    ‖h‖‖l‖ is the sine of the angle between l and p; below 1e-9 (equal losses up to
    round-off) h is set to exactly 0 so that no direction is made of round-off.
    """
    losses = losses.to(torch.float64)
    m = losses.numel()
    p = torch.full_like(losses, 1.0 / math.sqrt(m))
    ln = torch.linalg.vector_norm(losses)
    if ln == 0:
        return torch.zeros_like(losses)
    h = ((losses @ p) * losses / ln - p * ln) / ln**2
    return h if float(h.norm() * ln) > 1e-9 else torch.zeros_like(losses)


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "fedlf"
    history: bool = hyper(True, doc="use the stored rows of absent clients (false: an ablation)")
    window: int = hyper(0, low=0, doc="0 = the authors' adaptive τ; H >= 1 = a fixed window of H rounds (FedPCD's "
                                      "setting is 10)")


@dataclasses.dataclass
class FedLFStep:
    direction: torch.Tensor  # (d,) the final d (before the step size η)
    group_weights: list[torch.Tensor]  # per group: λ_q over [clients, fair row?, history]
    fair_row_used: bool
    halvings: int
    reverted: bool  # the halving loop fell back to d_raw
    conflicts: int  # clients with g_i·d < −tol after the loop


def fedlf_direction(
    grads: torch.Tensor,
    losses: torch.Tensor,
    groups: list[tuple[int, int]],
    history: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> FedLFStep:
    """FedLF's common direction for (m, d) pseudo-gradients, (m,) losses, column groups.

    ``history`` holds the k stored pseudo-gradients of absent clients: a (k, d) tensor or
    a sequence of k (d,) tensors (no stacked copy needed), or None.

    Per group every row of the min-norm problem (client rows, fairness row, history rows,
    all rescaled to μ_q) is a combination of the group's raw rows x = [g_q; hist_q], so
    the problem's Gram matrix comes from the one Gram matrix x xᵀ and d_q = coef·x: one
    float64 pass per group instead of building and multiplying the rescaled rows (same
    values to float rounding; tested against that direct construction).
    """
    m = grads.shape[0]
    h = loss_fairness_direction(losses)
    fair = bool(torch.any(h != 0)) and m > 1
    hist = history if history is not None and len(history) else None
    if m == 1 and hist is None:
        return FedLFStep(grads[0].to(torch.float64).clone(), [torch.ones(1, dtype=torch.float64)], False, 0, False, 0)
    d_raw = torch.zeros(grads.shape[1], dtype=torch.float64)
    dots_raw = torch.zeros(m, dtype=torch.float64)  # g_i · d_raw
    lambdas = []
    for a, b in groups:
        x = _group_rows(grads, hist, a, b)
        lam, d_q = _group_direction(x, m, h if fair else None)
        lambdas.append(lam)
        d_raw[a:b] = d_q
        dots_raw += x[:m] @ d_q
    return _rescaled(d_raw, dots_raw, grads, lambdas, fair)


def _group_rows(grads: torch.Tensor, hist, a: int, b: int) -> torch.Tensor:
    """x = [g_q; hist_q]: the group's columns [a, b) of the m client rows and the k history rows
    (float64; the history row by row: it need not be one stacked tensor)."""
    m, k = grads.shape[0], 0 if hist is None else len(hist)
    x = torch.empty((m + k, b - a), dtype=torch.float64)
    x[:m] = grads[:, a:b]
    for j, row in enumerate(hist if hist is not None else ()):
        x[m + j] = row[a:b]
    return x


def _group_direction(x: torch.Tensor, m: int, h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(λ_q, d_q) of one group: the min-norm point of the rows V (μ-scaled unit client rows, the
    fairness row when ``h`` is given, μ-scaled unit history rows), d_q = λ·V as coef·x."""
    gram = x @ x.T
    norms = gram.diagonal().clamp_min(0).sqrt()
    inv = 1.0 / (norms + 1e-12)  # unit rows = x / (‖x‖ + eps), as linalg.unit_rows
    mu = norms[:m].mean()
    v, t = _min_norm_gram(gram * inv[:, None] * inv[None, :], mu, m, h)
    lam = torch.from_numpy(linalg.min_norm_simplex(v.numpy()))
    if h is not None:
        coef_c, lam_h = mu * lam[:m] + t * lam[m] * h, lam[m + 1:]
    else:
        coef_c, lam_h = mu * lam[:m], lam[m:]
    coef = torch.cat([coef_c, mu * lam_h]) * inv
    return lam, coef @ x


def _min_norm_gram(unit_gram: torch.Tensor, mu: torch.Tensor, m: int,
                   h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(V Vᵀ, t) for V = [μ·unit_c; t·(h·unit_c) (the fairness row f/‖f‖·μ); μ·unit_h] from the
    unit rows' Gram matrix; without ``h`` V has no fairness row (and t is None)."""
    blocks = mu * mu * unit_gram
    if h is None:
        return blocks, None
    u_cc, u_all_c = unit_gram[:m, :m], unit_gram[:, :m]
    hu = u_all_c @ h  # (m + k,): unit_j · (h·unit_c)
    f_norm = mu * torch.sqrt((h @ u_cc @ h).clamp_min(0))  # ‖h·(μ unit_c)‖
    t = mu * mu / (f_norm + 1e-12)
    n = unit_gram.shape[0]
    v = torch.empty((n + 1, n + 1), dtype=torch.float64)
    v[:m, :m], v[:m, m + 1:] = blocks[:m, :m], blocks[:m, m:]
    v[m + 1:, :m], v[m + 1:, m + 1:] = blocks[m:, :m], blocks[m:, m:]
    v[:m, m] = v[m, :m] = mu * t * hu[:m]
    v[m + 1:, m] = v[m, m + 1:] = mu * t * hu[m:]
    v[m, m] = t * t * (h @ hu[:m])
    return v, t


def _rescaled(d_raw: torch.Tensor, dots_raw: torch.Tensor, grads: torch.Tensor, lambdas: list[torch.Tensor],
              fair: bool) -> FedLFStep:
    """d_raw rescaled to ‖mean_i g_i‖, then halved while it conflicts with a client (:func:`_halve_scale`)."""
    raw_norm = float(d_raw.norm())
    target = float(torch.linalg.vector_norm(grads.sum(0, dtype=torch.float64))) / grads.shape[0]  # ‖mean_i g_i‖
    scale = target / raw_norm if raw_norm > 0 else 1.0
    scale, halvings, reverted = _halve_scale(dots_raw, scale)
    conflicts = int((dots_raw * scale < -CONFLICT_TOL).sum())
    return FedLFStep(d_raw * scale, lambdas, fair, halvings, reverted, conflicts)


def _halve_scale(dots_raw: torch.Tensor, scale: float) -> tuple[float, int, bool]:
    """FedLF's conflict guard for d = scale·d_raw, from the dot products g_i·d_raw: while
    some g_i·d < −tol, halve the scale if it is > 2, else fall back to scale 1 (d_raw).
    Returns (scale, number of halvings, whether it fell back)."""
    halvings = 0
    while float(torch.max(-(dots_raw * scale))) > CONFLICT_TOL:
        if scale > 2:
            scale /= 2
            halvings += 1
        else:
            return 1.0, halvings, True
    return scale, halvings, False


def resolve_conflicts(grads: torch.Tensor, d: torch.Tensor, d_raw: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """While some g_i·d < −tol: halve d if ‖d‖ > 2‖d_raw‖, else return d_raw.

    ``d`` is a positive multiple of ``d_raw`` (FedLF's rescaled direction), so this is
    :func:`_halve_scale` on g_i·d_raw. Returns (d, number of halvings, whether it fell
    back to d_raw).
    """
    raw_norm = float(d_raw.norm())
    scale = float(d.norm()) / raw_norm if raw_norm > 0 else 1.0
    dots_raw = grads.to(torch.float64) @ d_raw.to(torch.float64)
    scale, halvings, reverted = _halve_scale(dots_raw, scale)
    return d_raw * scale, halvings, reverted


@dataclasses.dataclass
class State:
    """Each client's last round and last pseudo-gradient, keyed by client id."""

    last_round: dict[int, int] = dataclasses.field(default_factory=dict)
    last_grad: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)

    def history_rows(
        self, server_round: int, present: list[int], m: int, window: int = 0
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        """Stored g of absent clients seen within τ rounds: τ = ``window`` if ≥ 1, else
        the authors' ⌊seen/m⌋ (only once more than m clients have been seen)."""
        seen = len(self.last_round)
        if window >= 1:
            tau = window
        elif seen <= m:
            return [], None
        else:
            tau = seen // m
        now = set(present)
        ids = sorted(
            pid for pid, r in self.last_round.items() if pid not in now and server_round - r <= tau
        )
        if not ids:
            return [], None
        return ids, [self.last_grad[pid] for pid in ids]  # the stored rows, not a stacked copy

    def remember(self, server_round: int, ids: list[int], grads: torch.Tensor) -> State:
        """The state with these clients' rows (this one unchanged)."""
        last_round, last_grad = dict(self.last_round), dict(self.last_grad)
        for pid, row in zip(ids, grads):
            last_round[pid] = server_round
            last_grad[pid] = row.detach().clone()
        return State(last_round, last_grad)


class FedLFMethod(Method):
    """FedLF's server step (client: plain local SGD, reporting ``loss-before``)."""

    Params = Params
    weighting = "loss"  # min-norm weights with a loss-space fairness row

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(losses=(keys.LOSS_BEFORE,))  # F_i(θ_t): the clients compute it for this method

    def init(self) -> State:
        return State()

    def aggregate(self, round_: Round, state: State) -> Step:
        eta_l = round_.lr
        theta, grads = round_.theta, round_.deltas
        grads = grads.div_(eta_l)  # g_i = Δ_i / η_l, in place
        m = grads.shape[0]
        hist_ids, hist = (
            state.history_rows(round_.number, round_.clients, m, self.params.window)
            if self.params.history else ([], None)
        )
        step = fedlf_direction(grads, round_.value(keys.LOSS_BEFORE), round_.spec.offsets(), hist)
        eta = round_.step_scale * eta_l
        new = theta.to(torch.float64) - eta * step.direction
        # λ on the current clients (mean over groups) and on the fairness row: what the
        # layer-wise min-norm problems gave to each participant and to fairness.
        client_w = torch.stack([lam[:m] for lam in step.group_weights]).mean(0)
        fair_w = (
            float(torch.stack([lam[m] for lam in step.group_weights]).mean()) if step.fair_row_used else 0.0
        )
        metrics = {
            "fedlf-client-weights": [float(x) for x in client_w],
            "fedlf-fair-weight": fair_w,
            "fedlf-history-rows": len(hist_ids),
            "fedlf-halvings": step.halvings,
            "fedlf-reverted": int(step.reverted),
            "fedlf-conflicts": step.conflicts,
            "update-norm": float(eta * step.direction.norm()),
        }
        return Step(new.to(theta.dtype), state.remember(round_.number, round_.clients, grads), metrics)


@register("fedlf")
class FedLF(FairStrategy):
    """FedLF (see the module docstring): ``FedLF(history=True, window=10, fraction_train=0.25, lr=0.1, seed=0)``."""

    method_class = FedLFMethod
    Params = Params

    def __init__(self, *, history: bool = Params.history, window: int = Params.window, params: Params | None = None,
                 **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedLF", history=history, window=window), **common)
