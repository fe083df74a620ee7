"""AdaFed (Hamidi, Yang, "AdaFed: Fair Federated Learning via Adaptive Common Descent Direction",
arXiv:2401.04993): a common direction along which every client's loss decreases, at a
rate that grows with its loss (g_i·d ∝ F_i^γ).

Reference: the FairMOO code base (``Zhg9300/FairMOO``, ``component/algorithm/AdaFed/AdaFed.py`` and
``component/algorithm/common/utils.py`` — ``Gram_Schmidt``, ``get_d_adafed``; commit b1ac6d0 of
2025-09-15, read 2026). With Δ_i = θ_t − θ_i of the m replying clients, u_i = Δ_i/‖Δ_i‖ (the code's
pseudo-gradients (θ_t − θ_i)/η_l, normalised: η_l cancels), F_i their losses and γ the power:

1. Gram–Schmidt in the clients' order, each vector scaled by the loss it must meet:
   g̃_i = (u_i − Σ_{j<i} (g̃_j·u_i)/‖g̃_j‖² g̃_j) / (F_i^γ − Σ_{j<i} (g̃_j·u_i)/‖g̃_j‖²);
2. d = Σ_i λ_i g̃_i with λ_i = (1/‖g̃_i‖²) / Σ_j 1/‖g̃_j‖² (the min-norm point of their hull);
3. θ_{t+1} = θ_t − s·η_l·d (the code's optimiser step at the round's learning rate; s =
   ``server-lr``/``lr``, 1 by default).

d is made of unit vectors and scales as F^−γ, so at the same η_l its step is much shorter than
FedAvg's mean update (whose length is the clients' η_l·Σ of their gradients); the code ties it to
the clients' learning rate, and ``server-lr`` sets it apart (the step is then ``server-lr``·d).

Then u_i·d = K F_i^γ for every i, with K = 1/Σ_j 1/‖g̃_j‖² > 0: every client descends, the ones
with larger losses faster. In closed form d = d₀/‖d₀‖², d₀ the element of span{u_i} with
u_i·d₀ = F_i^γ (K = 1/‖d₀‖²): the direction does not depend on the clients' order. Here it is
computed so, from the m × m Gram matrix of the u_i (one pass over the updates, a Cholesky factor in
float64, d = Σ a_i u_i with G a = F^γ), not by orthogonalising d-vectors; the test checks it
against the code's Gram–Schmidt on the same inputs.

Which loss: FairMOO's clients send the mean training loss of their local epoch (``train-loss``,
the code's ``upload_loss`` after ``train``); ``adafed-loss = "loss-before"`` reads F_i(θ_t), the
received model's loss instead.

Deviations: an update that is (numerically) a combination of the earlier clients' — a repeated or
opposite update, or a zero one — makes the code divide 0 by 0 (NaN); here it is left out of the
direction (its residual below ``DEPENDENT`` of its norm; the metric ``adafed-dependent`` counts
them), so d is the others' (whose property holds). A round with no usable client keeps θ_t.

Limiting cases: one client, d = u_1/F_1^γ; mutually orthogonal updates give d ∝ Σ F_i^γ u_i
(γ = 0: the mean of the normalised updates, FedAvg's uniform direction on unit updates). AdaFed
does not reduce to FedAvg (its updates are normalised). The method is ``adafed``; the strategy is
:class:`AdaFed`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Reads, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register

DEPENDENT = 1e-6  # a unit update whose residual after the earlier ones is below this is left out


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "adafed"
    power: float = hyper(3.0, low=0.0, grid=Grid((0.5, 1.0, 3.0, 5.0), 0.0, 10.0),
                         doc="γ, the power of the losses the descent rates follow (g_i·d ∝ F_i^γ; FairMOO's default "
                             "3); 0 gives every client the same rate")
    loss: str = hyper(keys.TRAIN_LOSS, choices=(keys.TRAIN_LOSS, keys.LOSS_BEFORE),
                      doc="the loss F_i: train-loss, the local epoch's mean (FairMOO's code), or loss-before, the "
                          "received model's loss before training")


def adafed_coefficients(gram: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """a with d = Σ a_i u_i for the unit rows' Gram matrix ``gram`` (m × m) and ``targets`` F_i^γ
    (float64); and the clients left out as dependent on the earlier ones.

    A Cholesky factor L of the Gram matrix in the clients' order (Gram–Schmidt's residuals:
    ‖r_i‖ = L_ii) with a row whose L_ii² falls below DEPENDENT² left out; then G_K a = F^γ_K on the
    kept clients K and a /= F^γ_K·a (d = d₀/‖d₀‖², ‖d₀‖² = F^γ·a)."""
    gram, targets = gram.to(torch.float64), targets.to(torch.float64)
    m = gram.shape[0]
    low = torch.zeros((m, m), dtype=torch.float64)
    kept: list[int] = []
    dependent: list[int] = []
    for i in range(m):
        row = gram[i, kept] if kept else gram.new_zeros(0)
        sub = low[kept][:, kept] if kept else None
        coef = torch.linalg.solve_triangular(sub, row[:, None], upper=False)[:, 0] if kept else row
        residual = float(gram[i, i] - coef @ coef)
        if residual <= DEPENDENT**2 * max(float(gram[i, i]), 1.0):
            dependent.append(i)
            continue
        low[i, kept] = coef
        low[i, i] = residual**0.5
        kept.append(i)
    a = torch.zeros(m, dtype=torch.float64)
    if kept:
        factor = low[kept][:, kept]
        solved = torch.cholesky_solve(targets[kept][:, None], factor, upper=False)[:, 0]
        mass = float(targets[kept] @ solved)  # ‖d₀‖²
        if mass > 0:
            a[kept] = solved / mass
    return a, dependent


def gram_float64(rows: torch.Tensor, block: int = 1 << 20) -> torch.Tensor:
    """rows·rowsᵀ in float64, a block of columns at a time (no float64 copy of the (m, d) rows)."""
    gram = torch.zeros((rows.shape[0], rows.shape[0]), dtype=torch.float64)
    for start in range(0, rows.shape[1], block):
        part = rows[:, start:start + block].to(torch.float64)
        gram += (part @ part.T).cpu()
    return gram


class AdaFedMethod(Method):
    """AdaFed's server step (client: plain local SGD, reporting its loss)."""

    Params = Params
    weighting = "loss"  # descent rates ∝ F_i^γ

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(losses=(self.params.loss,))

    def aggregate(self, round_: Round, state: Any) -> Step:
        theta, deltas = round_.theta, round_.deltas
        gram = gram_float64(deltas)
        norms = gram.diagonal().clamp_min(0).sqrt()
        scale = torch.where(norms > 0, 1.0 / norms, torch.zeros_like(norms))
        unit_gram = gram * scale[:, None] * scale[None, :]
        targets = round_.value(self.params.loss).to(torch.float64).pow(self.params.power)
        a, dependent = adafed_coefficients(unit_gram, targets)
        direction = (a * scale).to(deltas.dtype) @ deltas  # d = Σ a_i u_i
        step = round_.step_scale * round_.lr
        rates = unit_gram @ a  # u_i·d (= K F_i^γ on the kept clients)
        metrics = {"adafed-rates": [float(x) for x in rates], "adafed-dependent": len(dependent),
                   "direction-norm": float(direction.norm()), "update-norm": float(step * direction.norm())}
        return Step(theta - step * direction, state, metrics)


@register("adafed")
class AdaFed(FairStrategy):
    """AdaFed (see the module docstring): ``AdaFed(power=3.0, loss="train-loss", fraction_train=0.1, lr=0.1)``."""

    method_class = AdaFedMethod
    Params = Params

    def __init__(self, *, power: float = Params.power, loss: str = Params.loss, params: Params | None = None,
                 **common: Any) -> None:
        super().__init__(method_params(Params, params, "AdaFed", power=power, loss=loss), **common)
