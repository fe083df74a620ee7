"""Plain references the tests check the strategies against: FedPCD's and CRAFT's rounds as the
papers write them, and FedPCD's direction for given constraints.

:func:`fedpcd_round` and :func:`craft_round` are the algorithms line by line, in float64 and
plain torch: no cache, no reused buffers, no Gram bookkeeping, one generic QP solve (cvxpy's
primal for FedPCD). ``tests/test_algorithms.py`` plays random multi-round federations through
them and through the strategies and checks that they agree.

* :func:`fedpcd_round` — FedPCD, paper ``000_*`` Algorithm 1 (and ``ALGORITHMS.md``).
* :func:`craft_round` — CRAFT, paper ``002_*`` (the authors' ``fed/craft.py``).
* :func:`fedpcd_direction` — FedPCD's d_t and μ for a primary ḡ and raw constraint rows,
  assembled densely (no cache) around the strategy's dual solve with its fallbacks.

Not in :func:`fedpcd_round`: FedPCD's solver fallbacks (an infeasible program's elastic
relaxation) and this project's outlier options (``fedpcd-outlier-norm``/``-cosine``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from strategies import fedpcd

# -- FedPCD --------------------------------------------------------------------------------------


@dataclasses.dataclass
class FedPCDMemory:
    """What FedPCD remembers between rounds: the history cache (client → (round seen, c̃)) and,
    for ``normalize='ema'``, each client's EMA of ‖g‖² with its number of updates."""

    cache: dict[int, tuple[int, torch.Tensor]] = dataclasses.field(default_factory=dict)
    ema: dict[int, tuple[float, int]] = dataclasses.field(default_factory=dict)


def fedpcd_round(
    theta: torch.Tensor,
    local_models: torch.Tensor,
    num_examples: torch.Tensor,
    clients: list[int],
    memory: FedPCDMemory,
    t: int,
    *,
    eta_l: float,
    eta_g: float,
    tau: float = 0.02,
    history: int = 10,
    eps: float = 1e-12,
    normalize: str = "l2",
    ema_beta: float = 0.9,
    primary: str = "fedavg",
) -> torch.Tensor:
    """One server round of FedPCD (Algorithm 1). Returns θ_{t+1}; ``memory`` is updated.

    ``theta`` (d,) is θ_t, ``local_models`` (m, d) the θ_i of the round's clients, ``clients``
    their stable ids (partition ids), ``num_examples`` their n_i.
    """
    theta = theta.double()
    # 1. Pseudo-gradients and the primary direction (the FedAvg one).
    g = (theta - local_models.double()) / eta_l  # g_i = Δ_i / η_l
    p = num_examples.double() / num_examples.double().sum()
    g_bar = p @ g  # ḡ = Σ p_i g_i

    # 2. Normalisation: c̃_i = s_i g_i and g̃_0.
    norms = g.norm(dim=1)
    if normalize == "l2":
        s = 1.0 / (norms + eps)
    elif normalize == "none":
        s = torch.ones_like(norms)
    else:  # "ema": s_i = 1/(√v̂_i + ε), v̂_i the bias-corrected EMA of ‖g_i‖², updated when seen
        s = torch.empty_like(norms)
        for i, c in enumerate(clients):
            v, k = memory.ema.get(c, (0.0, 0))
            v, k = ema_beta * v + (1.0 - ema_beta) * float(norms[i]) ** 2, k + 1
            memory.ema[c] = (v, k)
            s[i] = 1.0 / (math.sqrt(v / (1.0 - ema_beta**k)) + eps)
    if primary == "none":
        g0 = torch.zeros_like(g_bar)  # the minimum-norm feasible direction
    elif normalize == "none":
        g0 = g_bar
    else:
        g0 = g_bar / (g_bar.norm() + eps)

    # 3. History cache: drop entries older than H rounds, then the round's clients overwrite theirs.
    memory.cache = {c: (r, v) for c, (r, v) in memory.cache.items() if r >= t - history}
    for i, c in enumerate(clients):
        memory.cache[c] = (t, s[i] * g[i])
    constraints = torch.stack([v for _, v in memory.cache.values()])  # C: (m', d)

    # 4. d̃* = argmin_d ½‖d − g̃_0‖²  s.t.  c̃_jᵀ d ≥ τ‖c̃_j‖²  for every cached c̃_j.
    d_star = _closest_feasible(g0, constraints, tau * (constraints**2).sum(dim=1))

    # 5. Rescale to ‖ḡ‖ and step: θ_{t+1} = θ_t − η_g d_t.
    d_t = g_bar.norm() * d_star / d_star.norm()
    return theta - eta_g * d_t


def _closest_feasible(g0: torch.Tensor, c: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """argmin_d ½‖d − g0‖² s.t. C d ≥ b, as the paper states the program (cvxpy, Clarabel)."""
    import cvxpy as cp

    g0n, cn, bn = g0.numpy(), c.numpy(), b.numpy()
    if np.all(cn @ g0n >= bn):  # g̃_0 already gives every client its progress
        return g0.clone()
    d = cp.Variable(g0n.size)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(d - g0n)), [cn @ d >= bn])
    problem.solve(solver=cp.CLARABEL)
    if d.value is None:
        raise RuntimeError(f"FedPCD reference: the program is {problem.status}")
    return torch.from_numpy(np.asarray(d.value, dtype=np.float64))


# -- CRAFT ---------------------------------------------------------------------------------------


def craft_round(
    theta: torch.Tensor,
    local_models: torch.Tensor,
    num_examples: torch.Tensor,
    groups: list[tuple[int, int]],
    reference: torch.Tensor | None,
    *,
    step: float = 0.1,
    rho: str = "data-size",
    tol: float = 0.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One server round of CRAFT. Returns (θ_{t+1}, g): g is the next round's ``reference``.

    ``groups`` are the layer groups as [start, stop) slices of the flat model (one group
    covering everything: the global variant); ``reference`` the previous round's g (None in
    round 1). ``dtype`` is the dtype of the clients' updates, which sets the pseudo-inverse's
    numerical rank as ``torch.linalg.pinv`` does in the authors' code.
    """
    theta = theta.double()
    updates = theta - local_models.double()  # g_i = θ_t − θ_i (not divided by η_l)
    weights = num_examples.double() if rho == "data-size" else torch.ones(len(local_models), dtype=torch.float64)
    g = torch.zeros_like(theta)
    for a, b in groups:
        rows = updates[:, a:b]
        norms = rows.norm(dim=1)
        active = norms > tol
        k = int(active.sum())
        if k == 0:  # no client moved this group
            continue
        if k == 1:  # one client: its raw update
            g[a:b] = rows[active][0]
            continue
        u = rows[active] / norms[active, None]  # unit rows U
        w = weights[active]
        rho_q = w / w.sum()  # ρ over the active clients, Σ ρ = 1
        ref = torch.zeros(b - a, dtype=torch.float64)
        if reference is not None and float(reference[a:b].norm()) > 0.0:
            ref = reference[a:b].double() / reference[a:b].double().norm()  # ĝ, unit length
        cutoff = max(u.shape) * torch.finfo(dtype).eps  # torch.linalg.pinv(U)'s default rank cut
        g[a:b] = ref + torch.linalg.pinv(u, rtol=cutoff) @ (rho_q - u @ ref)  # g = ĝ + U⁺(ρ − U ĝ)
    return theta - step * g, g


def fedpcd_direction(
    g_bar: torch.Tensor, constraints: torch.Tensor, tau: float, eps: float = 1e-12
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedPCD's update direction d_t and multipliers μ (paper eq. 10-11, dual form) for the
    primary ḡ (d,) and the raw constraint directions (m, d), ℓ2-normalised here (m = 0 gives
    back ``g_bar``). Computed in float64 when either input is, else float32; μ by the
    strategy's :func:`strategies.fedpcd.dual_multipliers` (the elastic relaxation when the
    program is infeasible, ḡ when the solver fails).

    Returns (d_t in g_bar's dtype, μ (m,) float64 ≥ 0): d_t is rescaled to ‖ḡ‖ and *is*
    ``g_bar`` when nothing is corrected (ḡ already satisfies every constraint, or a fallback).
    """
    m = constraints.shape[0]
    if m == 0:
        return g_bar, torch.zeros(0, dtype=torch.float64)
    dtype = torch.float64 if torch.float64 in (g_bar.dtype, constraints.dtype) else torch.float32
    norms = torch.linalg.vector_norm(constraints.double(), dim=1)
    c = constraints.to(dtype) * (1.0 / (norms + eps)).to(dtype)[:, None]  # c̃_j
    g = g_bar.to(dtype)
    gram = (c @ c.T).double().numpy()
    g0 = g / (torch.linalg.vector_norm(g) + eps)
    mu, status, _ = fedpcd.dual_multipliers(gram, (c @ g0).double().numpy(), tau * np.diag(gram))
    mu = torch.from_numpy(mu)
    if status not in (fedpcd.STATUS_SOLVED, fedpcd.STATUS_ELASTIC) or not bool((mu > 0).any()):
        return g_bar, mu
    d = g0 + mu.to(dtype) @ c  # d̃ = g̃_0 + Cᵀμ
    return (torch.linalg.vector_norm(g) * d / torch.linalg.vector_norm(d)).to(g_bar.dtype), mu
