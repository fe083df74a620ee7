"""FedPCD: priority-constrained aggregation with a server-side history cache.

Papers ``000_*``/``001_*`` (FedPCD, Algorithm 1) and ``../shared/spec/ALGORITHMS.md``.
Per round the server takes the FedAvg pseudo-gradient ḡ = Σ p_i g_i (g_i = Δ_i/η_l) as the
primary direction and finds the direction closest to it that makes progress τ on every
client direction it knows about (current participants and a cache of recent ones):

    d̃* = argmin_d ½‖d − g̃_0‖²  s.t.  c̃_jᵀ d ≥ τ‖c̃_j‖²,   d_t = ‖ḡ‖ d̃*/‖d̃*‖,
    θ_{t+1} = θ_t − η_g d_t.

The QP is solved in its dual over the m' constraint multipliers (Gram matrix Q = C Cᵀ),
never in R^d:  μ* = argmin_{μ≥0} ½ μᵀQμ + μᵀ(C g̃_0 − b),  d̃* = g̃_0 + Cᵀμ*.

Hyperparameters (run config)
----------------------------
fedpcd-tau : float, default 0.02
    Required progress τ ≥ 0 per constraint. τ = 0 only asks for non-negative progress.
fedpcd-history : int, default 10
    Window H ≥ 0 (rounds) of the cache; H = 0 uses the current participants only.
fedpcd-eps : float, default 1e-12
    ε of the normalisations g/(‖g‖ + ε).
fedpcd-normalize : ``l2`` (default) | ``none`` | ``ema``
    How directions are scaled before the QP (paper Table 4/5 ablations).
fedpcd-ema-beta : float, default 0.9
    β of the per-client bias-corrected EMA of ‖g_i‖² (``ema`` only; updated when the
    client is seen; ḡ stays ℓ2-normalised). β = 0 is ``l2``.
fedpcd-primary : ``fedavg`` (default) | ``none``
    ``none``: g̃_0 = 0, i.e. the minimum-norm feasible direction (needs τ > 0).
fedpcd-cache-dtype : ``float32`` (default) | ``bfloat16`` | ``float16``
    Storage of cached directions; the maths runs in float32 either way.
server-lr : float, default 0 = the client ``lr``
    η_g. With η_g = η_l and no active constraint a round is exactly FedAvg.

Diagnostics per round (MetricRecord → rounds.jsonl): ``fedpcd-constraints`` (m'),
``fedpcd-active`` (#μ_j > 0), ``fedpcd-corrected`` (0/1), ``fedpcd-cosine`` (cos(d_t, ḡ)),
``fedpcd-solver-ok`` (0/1), ``fedpcd-solver-status`` (0 feasible, 1 solved, 2 elastic,
3 primary), ``fedpcd-solve-seconds``, ``fedpcd-fallbacks`` (cumulative),
``fedpcd-dropped`` (non-finite updates), ``fedpcd-cache-size``.

Failure handling (never crashes a round): if the dual QP is unbounded (the constraints
are jointly infeasible) or the solver fails, the elastic relaxation
min ½‖d − g̃_0‖² + ρ Σ_j max(0, b_j − c̃_jᵀd) is solved instead (its dual is the same QP
with the box 0 ≤ μ ≤ ρ, always bounded: the least-violation direction); if that fails
too, d_t = ḡ. Both are logged and counted. A client whose update holds NaN/Inf is
dropped for the round with a logged reason.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from strategies.base import FairStrategy
from strategies.fedpcd_cache import HistoryCache
from strategies.linalg import clarabel_qp, unit_rows
from strategies.registry import register

log = logging.getLogger(__name__)

TAU = "fedpcd-tau"
HISTORY = "fedpcd-history"
EPS = "fedpcd-eps"
NORMALIZE = "fedpcd-normalize"
EMA_BETA = "fedpcd-ema-beta"
PRIMARY = "fedpcd-primary"
CACHE_DTYPE = "fedpcd-cache-dtype"

# Per-round diagnostics (MetricRecord keys, they land in rounds.jsonl under "strategy").
M_CONSTRAINTS = "fedpcd-constraints"
M_ACTIVE = "fedpcd-active"
M_CORRECTED = "fedpcd-corrected"
M_COSINE = "fedpcd-cosine"
M_SOLVER_OK = "fedpcd-solver-ok"
M_SOLVER_STATUS = "fedpcd-solver-status"
M_SOLVE_SECONDS = "fedpcd-solve-seconds"
M_FALLBACKS = "fedpcd-fallbacks"
M_DROPPED = "fedpcd-dropped"
M_CACHE = "fedpcd-cache-size"

# Solver status codes (``fedpcd-solver-status``).
STATUS_FEASIBLE = 0  # g̃_0 already satisfies every constraint: μ = 0, no solve
STATUS_SOLVED = 1  # dual QP solved
STATUS_ELASTIC = 2  # infeasible or failed: least-violation (elastic) solution
STATUS_PRIMARY = 3  # everything failed: d_t = ḡ
STATUS_NAMES = {0: "feasible", 1: "solved", 2: "elastic", 3: "primary"}

ELASTIC_PENALTY = 100.0  # ρ: μ_j ≤ ρ in the elastic dual (normalised directions: μ is O(1))
_MU_ZERO = 1e-7  # relative size below which a multiplier is 0 (inactive)
_FEAS_TOL = 1e-6  # relative tolerance of the post-solve feasibility check


class SolverError(RuntimeError):
    """The QP solver did not return a usable solution."""


def _clarabel_qp(gram: np.ndarray, lin: np.ndarray, upper: float | None) -> np.ndarray:
    """argmin_{μ ≥ 0 (, μ ≤ upper)} ½ μᵀ Q μ + linᵀ μ with Clarabel (m variables)."""
    import clarabel
    from scipy import sparse

    m = gram.shape[0]
    eye = sparse.identity(m, format="csc")
    if upper is None:
        a, rhs, cones = -eye, np.zeros(m), [clarabel.NonnegativeConeT(m)]
    else:  # −μ ≤ 0 and μ ≤ ρ
        a = sparse.vstack([-eye, eye]).tocsc()
        rhs = np.concatenate([np.zeros(m), np.full(m, upper)])
        cones = [clarabel.NonnegativeConeT(2 * m)]
    x, status = clarabel_qp(0.5 * (gram + gram.T), lin, a, rhs, cones)
    if x is None:
        raise SolverError(f"clarabel: {status}")
    mu = np.clip(x, 0.0, upper)
    # An interior-point μ_j of an inactive constraint is ~1e-9, not 0: snap it to 0 so
    # "active" means μ_j > 0 and complementary slackness holds to round-off.
    mu[mu < _MU_ZERO * max(1.0, float(mu.max(initial=0.0)))] = 0.0
    return mu


def dual_multipliers(gram, c_dot_g0, b) -> tuple[np.ndarray, int, str]:
    """μ* of the FedPCD dual from the Gram matrix, C g̃_0 and b (all float64-able).

    Returns ``(mu, status, reason)``: ``status`` is one of the ``STATUS_*`` codes. With
    ``STATUS_PRIMARY`` the caller must use ḡ (``mu`` is then all zeros).
    """
    q = np.asarray(gram, dtype=np.float64)
    cg = np.asarray(c_dot_g0, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = cg.shape[0]
    if m == 0 or np.all(cg >= b):  # g̃_0 feasible: KKT holds with μ = 0 exactly
        return np.zeros(m), STATUS_FEASIBLE, ""
    lin = cg - b
    tol = _FEAS_TOL * max(1.0, float(np.abs(b).max()), float(np.abs(np.diag(q)).max()))
    reason = ""
    try:
        mu = _clarabel_qp(q, lin, None)
        if np.all(cg + q @ mu >= b - tol):  # C d̃ ≥ b: the primal really is feasible
            return mu, STATUS_SOLVED, ""
        reason = "dual solution violates the constraints (infeasible program)"
    except Exception as exc:  # noqa: BLE001 - any solver failure → documented fallback
        reason = f"{type(exc).__name__}: {exc}"
    try:
        mu = _clarabel_qp(q, lin, ELASTIC_PENALTY)
        return mu, STATUS_ELASTIC, reason
    except Exception as exc:  # noqa: BLE001
        return np.zeros(m), STATUS_PRIMARY, f"{reason}; elastic: {type(exc).__name__}: {exc}"


def fedpcd_direction(
    g_bar: torch.Tensor, constraints: torch.Tensor, tau: float, eps: float = 1e-12
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedPCD's update direction d_t and multipliers μ (paper eq. 10-11, dual form).

    Parameters
    ----------
    g_bar : (d,) tensor
        Primary pseudo-gradient ḡ (the FedAvg direction).
    constraints : (m, d) tensor
        Raw constraint directions (client pseudo-gradients, current and cached); they are
        ℓ2-normalised here. m = 0 gives back ``g_bar``.
    tau : float
        Required progress τ ≥ 0 on each normalised direction.
    eps : float
        ε of g/(‖g‖ + ε).

    Returns
    -------
    (d_t, mu) : ((d,) tensor of g_bar's dtype, (m,) float64 tensor ≥ 0)
        d_t is rescaled to ‖ḡ‖; it *is* ``g_bar`` when ḡ already satisfies every
        constraint. If the program is infeasible the least-violation (elastic) solution is
        returned; if the solver fails, ḡ.
    """
    m = constraints.shape[0]
    if m == 0:
        return g_bar, torch.zeros(0, dtype=torch.float64)
    c_unit, _ = unit_rows(constraints, eps)
    g0 = g_bar / (torch.linalg.vector_norm(g_bar) + eps)
    gram = (c_unit @ c_unit.T).double()
    sq = torch.diagonal(gram)
    mu, status, _ = dual_multipliers(gram.numpy(), (c_unit @ g0).double().numpy(), (tau * sq).numpy())
    mu_t = torch.from_numpy(mu)
    if status in (STATUS_FEASIBLE, STATUS_PRIMARY):
        return g_bar, mu_t
    d = g0 + mu_t.to(c_unit.dtype) @ c_unit
    return rescale(d, torch.linalg.vector_norm(g_bar), g_bar), mu_t


def rescale(d: torch.Tensor, norm: torch.Tensor | float, fallback: torch.Tensor) -> torch.Tensor:
    """‖ḡ‖ · d/‖d‖; ``fallback`` (ḡ) when d vanishes (nothing to rescale)."""
    dn = float(torch.linalg.vector_norm(d))
    if not np.isfinite(dn) or dn <= 1e-30:
        return fallback
    return d * (float(norm) / dn)


class FedPCDStrategy(FairStrategy):
    """FedPCD on the project's round protocol (see the module docstring)."""

    def __init__(self, cfg, *, tau: float, history: int, eps: float, normalize: str,
                 ema_beta: float, primary: str, cache_dtype: str) -> None:
        super().__init__(cfg)
        self.tau, self.eps, self.normalize, self.primary = tau, eps, normalize, primary
        self.cache = HistoryCache(history, dtype=getattr(torch, cache_dtype), ema_beta=ema_beta)
        import clarabel  # noqa: F401 - imported here, not inside the first round's solve time
        import scipy.sparse  # noqa: F401
        self.fallbacks = 0
        self._work: torch.Tensor | None = None  # (m + 1, d) float32: Δ_i rows, then ḡ
        self._theta: torch.Tensor | None = None
        self._dir: torch.Tensor | None = None

    # -- persistent buffers (first-touch page faults of big tensors cost more than FedAvg)
    def _buffers(self, m: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._work is None or self._work.shape[0] < m + 1 or self._work.shape[1] != d:
            self._work = torch.empty(m + 1, d, dtype=torch.float32)
        if self._theta is None or self._theta.numel() != d:
            self._theta = torch.empty(d, dtype=torch.float32)
            self._dir = torch.empty(d, dtype=torch.float32)
        return self._work, self._theta, self._dir

    def aggregate_train(self, server_round, replies):
        from flwr.app import MetricRecord

        from fedcore import keys
        from fedcore import flat

        replies = list(replies)
        if self.current_arrays is None:
            raise RuntimeError("begin_round() must be called before aggregate_train()")
        d = self.spec.dim
        work, theta, direction = self._buffers(len(replies), d)
        flat.record_to_flat(self.current_arrays, out=theta)
        eta_l = self.round_lr(server_round)
        eta_g = self.cfg.server_lr or eta_l

        # Δ_i straight into the persistent rows; a non-finite update drops its client.
        pids, n_ex, norms = [], [], []
        for msg in replies:
            met = msg.content[keys.METRICS]
            row = work[len(pids)]
            flat.record_to_flat(msg.content[keys.ARRAYS], out=row)
            torch.sub(theta, row, out=row)
            pid, norm = int(met[keys.PARTITION_ID]), float(torch.linalg.vector_norm(row))
            if not np.isfinite(norm):  # the row is overwritten by the next reply
                log.warning("round %d: FedPCD drops partition %d: its update holds NaN/Inf",
                            server_round, pid)
                continue
            pids.append(pid)
            n_ex.append(float(met[keys.NUM_EXAMPLES]))
            norms.append(norm / eta_l)  # ‖g_i‖ = ‖Δ_i‖/η_l
        dropped = len(replies) - len(pids)
        k = len(pids)
        if k == 0:  # nothing usable: keep the model, never crash the round
            self.cache.expire(server_round)
            return self.current_arrays, MetricRecord({M_DROPPED: dropped, M_FALLBACKS: self.fallbacks})
        delta = work[:k]
        p = torch.tensor(n_ex, dtype=torch.float64)
        p = p / p.sum()
        g_bar = work[k]
        torch.mv(delta.T, (p / eta_l).to(torch.float32), out=g_bar)  # ḡ = Σ p_i Δ_i/η_l (current only)
        g_bar_norm = float(torch.linalg.vector_norm(g_bar))

        # Constraint directions c̃_i = s_i g_i = (s_i/η_l) Δ_i: scaled as they are cached.
        scale = self.cache.scales(pids, torch.tensor(norms, dtype=torch.float64), self.normalize, self.eps)
        if self.primary == "fedavg":
            g0_scale = 1.0 if self.normalize == "none" else 1.0 / (g_bar_norm + self.eps)
        else:
            g0_scale = 0.0
        # Cache update + the new Gram rows as one matmul (rows of Δ_i and of ḡ).
        c_dot_gbar = self.cache.insert(server_round, pids, work[: k + 1], n_new=k,
                                       scales=(scale / eta_l).numpy())
        slots = self.cache.active_slots()
        gram = self.cache.gram_of(slots)
        sq = np.diag(gram).copy()
        cg0 = g0_scale * c_dot_gbar
        t0 = time.perf_counter()
        mu, status, reason = dual_multipliers(gram, cg0, self.tau * sq)
        solve_s = time.perf_counter() - t0
        if status >= STATUS_ELASTIC:
            self.fallbacks += 1
            log.warning("round %d: FedPCD fallback (%s): %s", server_round, STATUS_NAMES[status], reason)

        active = np.nonzero(mu > 0.0)[0]
        corrected = status in (STATUS_SOLVED, STATUS_ELASTIC) and active.size > 0
        if corrected:
            # d̃ = g̃_0 + Σ_{μ_j > 0} μ_j c̃_j (inactive constraints contribute nothing).
            torch.mul(g_bar, g0_scale, out=direction)
            self.cache.add_rows(direction, [slots[j] for j in active], mu[active])
            dn = float(torch.linalg.vector_norm(direction))
            if np.isfinite(dn) and dn > 1e-30:
                cosine = float(direction @ g_bar) / (dn * max(g_bar_norm, 1e-30))
                step = eta_g * g_bar_norm / dn  # θ − η_g ‖ḡ‖ d̃/‖d̃‖
            else:  # degenerate d̃ = 0: keep the primary direction
                corrected, cosine = False, 1.0
        if not corrected:
            direction, step, cosine = g_bar, eta_g, 1.0
        theta.sub_(direction, alpha=step)
        metrics = {
            M_CONSTRAINTS: len(slots),
            M_ACTIVE: int(active.size),
            M_CORRECTED: int(corrected),
            M_COSINE: cosine,
            M_SOLVER_OK: int(status <= STATUS_SOLVED),
            M_SOLVER_STATUS: status,
            M_SOLVE_SECONDS: solve_s,
            M_FALLBACKS: self.fallbacks,
            M_DROPPED: dropped,
            M_CACHE: self.cache.size,
            "update-norm": eta_l * g_bar_norm,  # ‖Σ p_i Δ_i‖, as FedAvg reports it
        }
        return self.to_record(theta), MetricRecord(metrics)

    # -- checkpoint state ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"cache": self.cache.state_dict(), "fallbacks": self.fallbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cache.load_state_dict(state["cache"])
        self.fallbacks = int(state["fallbacks"])


@register("fedpcd")
def build(cfg):
    from fedcore.config import ConfigError

    tau = cfg.get_float(TAU, 0.02, low=0.0)
    primary = cfg.get_choice(PRIMARY, ("fedavg", "none"), "fedavg")
    if primary == "none" and tau == 0.0:
        raise ConfigError(f"run-config key '{PRIMARY}' = 'none' needs '{TAU}' > 0 "
                          "(with τ = 0 the minimum-norm feasible direction is 0)")
    return FedPCDStrategy(
        cfg,
        tau=tau,
        history=cfg.get_int(HISTORY, 10, low=0),
        eps=cfg.get_float(EPS, 1e-12, low=0.0, low_open=True),
        normalize=cfg.get_choice(NORMALIZE, ("l2", "none", "ema"), "l2"),
        ema_beta=cfg.get_float(EMA_BETA, 0.9, low=0.0, high=0.999),
        primary=primary,
        cache_dtype=cfg.get_choice(CACHE_DTYPE, ("float32", "bfloat16", "float16"), "float32"),
    )
