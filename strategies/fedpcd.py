"""FedPCD: priority-constrained aggregation with a server-side history cache.

Paper: *FedPCD: Priority-Constrained Federated Aggregation* (2026; American University of Sharjah —
the text this project works from names neither authors nor venue), Algorithm 1, which carries the
single-machine priority-constrained descent (PCD) of D. Varam and Alhajri (2026) to federated
aggregation; its one-page summary states the same claims.

Per round the server takes the FedAvg pseudo-gradient ḡ = Σ p_i g_i (g_i = Δ_i/η_l) as the
primary direction and finds the direction closest to it that makes progress τ on every
client direction it knows about (current participants and a cache of recent ones):

    d̃* = argmin_d ½‖d − g̃_0‖²  s.t.  c̃_jᵀ d ≥ τ‖c̃_j‖²,   d_t = ‖ḡ‖ d̃*/‖d̃*‖,
    θ_{t+1} = θ_t − η_g d_t,

with p_i = n_i/Σ_j n_j, g̃_0 = ḡ/(‖ḡ‖ + ε) and each constraint direction c̃_j = g_j/(‖g_j‖ + ε)
(``fedpcd-normalize``: or by the square root of a bias-corrected EMA of ‖g_j‖², or raw), the
round's clients and the cached ones of the last H rounds (``fedpcd-history``), b_j = τ‖c̃_j‖².
The QP is solved in its dual over the m' constraint multipliers (Gram matrix Q = C Cᵀ), never in R^d:

    μ* = argmin_{μ≥0} ½ μᵀQμ + μᵀ(C g̃_0 − b),   d̃* = g̃_0 + Cᵀμ*.

:meth:`FedPCD.aggregate_valid` is Algorithm 1 as a chain of the pure steps below, each
returning its result and its metrics: :func:`drop_non_finite` → :func:`primary_direction`
(ḡ, g̃_0) → :func:`constraints_from_cache` (the round's clients normalised into the history
cache, :mod:`strategies.fedpcd_cache`; the outlier options) → :func:`solve_dual` (μ*, with
the fallbacks below) → :func:`server_step` (d_t and θ_{t+1}). ``tests/test_algorithms.py``
checks it against the round in plain float64 with a primal solve (``tests/oracles.py``).

With ``server-lr`` η_g = η_l (0, the default) and no active constraint a round is exactly FedAvg. The
outlier options (``fedpcd-outlier-*``) are this project's extension, not in the papers.

Diagnostics per round (MetricRecord → rounds.jsonl): ``fedpcd-constraints`` (m'),
``fedpcd-active`` (#μ_j > 0), ``fedpcd-corrected`` (0/1), ``fedpcd-cosine`` (cos(d_t, ḡ)),
``fedpcd-solver-ok`` (0/1), ``fedpcd-solver-status`` (0 feasible, 1 solved, 2 elastic,
3 primary), ``fedpcd-solve-seconds``, ``fedpcd-fallbacks`` (cumulative),
``fedpcd-dropped`` (non-finite updates), ``fedpcd-cache-size``, ``fedpcd-outliers``
(constraints left out by the outlier options this round).

Cost per round (``benchmarks/aggregation.py`` times it against this floor): one pass over
the replies that writes Δ_i into k work rows and into the cache rows the round's admission
hands out (float32: the raw Δ_i with a float64 factor, its client's own row when it returns)
and squares Δ_i while each block is in the cache (:func:`fedcore.flat.deltas_into`); ḡ over
the work rows; one (k × d)·(d × m') product for
the new Gram rows, which also gives c̃ᵀḡ; the direction over the *active* entries only.
Memory: the cache's rows (allocated once for the most entries the window can hold, resident
only once written), k + 1 work rows, θ and the direction. ``server-device`` (the strategy's
``device``): with CUDA the work rows, the cache and the products live on the GPU; the
dual QP stays on the host (m' × m').

Failure handling (never crashes a round): if the dual QP is unbounded (the constraints
are jointly infeasible) or the solver fails, the elastic relaxation
min ½‖d − g̃_0‖² + ρ Σ_j max(0, b_j − c̃_jᵀd) is solved instead (its dual is the same QP
with the box 0 ≤ μ ≤ ρ, always bounded: the least-violation direction); if that fails
too, d_t = ḡ. Both are logged and counted. A client whose update holds NaN/Inf is
dropped for the round with a logged reason, and a returning client's cached entry with it
(with a float32 cache its row was being overwritten); the app's reply validation drops such
replies before FedPCD.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np
import torch

from fedcore import flat
from fedcore.config import ConfigError, Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Round, Step
from strategies.fedpcd_cache import Admission, Constraints, HistoryCache
from strategies.flower import FairStrategy, method_params
from strategies.linalg import clarabel_qp
from strategies.registry import register

log = logging.getLogger(__name__)

# fedpcd-primary → how the method weights its clients (strategies.registry.WEIGHTINGS): the
# primary ḡ's weights; with no primary the direction weights every constraint alike.
PRIMARY_WEIGHTING = {"fedavg": "data-size", "fedavg-uniform": "uniform", "none": "uniform"}


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """FedPCD's hyperparameters (see the module docstring)."""

    prefix = "fedpcd"
    tau: float = hyper(0.02, low=0.0, grid=Grid((0.005, 0.01, 0.02, 0.05, 0.075, 0.1), 0.0, 1.0),
                       doc="τ, the progress required per constraint; 0 only asks for non-negative progress")
    history: int = hyper(10, low=0, doc="H, the cache's window in rounds; 0 uses the current participants only")
    eps: float = hyper(1e-12, low=0.0, low_open=True, doc="ε of the normalisations g/(‖g‖ + ε)")
    normalize: str = hyper("l2", choices=("l2", "none", "ema"),
                           doc="how directions are scaled before the QP (paper Table 4/5 ablations)")
    ema_beta: float = hyper(0.9, low=0.0, high=0.999,
                            doc="β of the per-client bias-corrected EMA of ‖g_i‖² (normalize='ema' only; updated when "
                                "the client is seen; ḡ stays ℓ2-normalised); 0 is l2")
    primary: str = hyper("fedavg", choices=tuple(PRIMARY_WEIGHTING),
                         doc="the primary direction ḡ: fedavg = Σ p_i g_i, p_i = n_i/Σn (the data-size FedAvg "
                             "direction, as in the paper); fedavg-uniform = (1/m) Σ g_i, the FedAvg of "
                             "fedavg-weighting='uniform' (ḡ also sets the step's length ‖ḡ‖); none: g̃_0 = 0, the "
                             "minimum-norm feasible direction (needs τ > 0), rescaled to the data-size ‖ḡ‖")
    cache_dtype: str = hyper("float32", choices=("float32", "bfloat16", "float16"),
                             doc="storage of the cached directions; the maths runs in float32 either way")
    outlier_norm: float = hyper(0.0, low=0.0,
                                doc="this project's extension (0 = off): a client whose update is longer than this "
                                    "x the round's median update norm (>= 3 valid clients) gets no constraint, this "
                                    "round or in the cache (a returning client's older entry is dropped too); its "
                                    "update still counts in ḡ (bound that with update-clip)")
    outlier_norm_low: float = hyper(0.0, low=0.0,
                                    doc="this project's extension (0 = off): a client whose update is shorter than "
                                        "the median norm / this gets no constraint either (normalisation would give a "
                                        "tiny sign-flipped update, attack='scale-down', full strength); its update "
                                        "still counts in ḡ")
    outlier_cosine: float = hyper(-1.0, low=-1.0, high=1.0,
                                  doc="this project's extension (-1 = off): a constraint (current or cached) whose "
                                      "cosine to this round's ḡ is below it is left out of the round's QP (it stays "
                                      "cached); ḡ holds every update, so a large attacker can dominate it: use a "
                                      "threshold well below 0 (e.g. -0.5), or the norm rule")

    def check(self) -> None:
        if 0.0 < self.outlier_norm < 1.0:
            raise ConfigError(f"run-config key 'fedpcd-outlier-norm' = {self.outlier_norm} would leave out clients "
                              "shorter than the median: use 0 (off) or a factor >= 1 (e.g. 3)")
        if 0.0 < self.outlier_norm_low < 1.0:
            raise ConfigError(f"run-config key 'fedpcd-outlier-norm-low' = {self.outlier_norm_low} would leave out "
                              "clients longer than the median: use 0 (off) or a factor k >= 1 (e.g. 10: no "
                              "constraint for an update shorter than median/10)")
        if self.primary == "none" and self.tau == 0.0:
            raise ConfigError("run-config key 'fedpcd-primary' = 'none' needs 'fedpcd-tau' > 0 "
                              "(with τ = 0 the minimum-norm feasible direction is 0)")


@dataclasses.dataclass
class State:
    """What survives a round: the history cache (entries, Gram, EMA statistics) and the
    number of solver fallbacks so far. A round returns a new State whose cache is the one it was
    given, advanced in place (its rows are the method's largest memory: a copy a round would
    double it): the state handed to a round belongs to that round."""

    cache: HistoryCache
    fallbacks: int = 0


def init_state(params: Params, max_rows: int | None = None) -> State:
    """Round 0: an empty cache (``max_rows``: the most entries it can hold, see :class:`HistoryCache`)."""
    return State(HistoryCache(params.history, dtype=getattr(torch, params.cache_dtype), ema_beta=params.ema_beta,
                              max_rows=max_rows))


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
M_OUTLIERS = "fedpcd-outliers"

# Solver status codes (``fedpcd-solver-status``).
STATUS_FEASIBLE = 0  # g̃_0 already satisfies every constraint: μ = 0, no solve
STATUS_SOLVED = 1  # dual QP solved
STATUS_ELASTIC = 2  # infeasible or failed: least-violation (elastic) solution
STATUS_PRIMARY = 3  # everything failed: d_t = ḡ
STATUS_NAMES = {0: "feasible", 1: "solved", 2: "elastic", 3: "primary"}

ELASTIC_PENALTY = 100.0  # ρ: μ_j ≤ ρ in the elastic dual (normalised directions: μ is O(1))
_MU_ZERO = 1e-7  # relative size below which a multiplier is 0 (inactive)
_FEAS_TOL = 1e-6  # relative tolerance of the post-solve feasibility check

DROPPED_REASON = "FedPCD: its update's squared norm is not finite in float32 (NaN/Inf or too large)"


# -- the round, step by step (Algorithm 1) ------------------------------------------------------
@dataclasses.dataclass
class Updates:
    """A round's replies as FedPCD reads them (:meth:`FedPCDMethod.read_round`)."""

    theta: torch.Tensor  # θ_t, (d,) float32 on the host
    clients: list[int]  # stable client ids (partition ids), in reply order
    sizes: np.ndarray  # n_i, float64
    rows: torch.Tensor  # (m + 1, d) float32: Δ_i = θ_t − θ_i in rows[:m]; rows[m] receives ḡ
    sq_norms: np.ndarray  # ‖Δ_i‖², float64 (not finite for a NaN/Inf update, or one too large for float32)


def drop_non_finite(updates: Updates) -> tuple[Updates, list[int], dict]:
    """The clients whose ‖Δ_i‖² is not finite leave the round. Returns the usable updates
    (their rows moved up, in place), the indices of the dropped replies and the metrics."""
    finite = np.isfinite(updates.sq_norms)
    keep, dropped = np.flatnonzero(finite).tolist(), np.flatnonzero(~finite).tolist()
    if dropped:  # rare: the valid rows move up
        k = len(keep)
        updates.rows[:k] = updates.rows[keep].clone()
        updates = Updates(updates.theta, [updates.clients[i] for i in keep], updates.sizes[keep],
                          updates.rows[: k + 1], updates.sq_norms[keep])
    return updates, dropped, {M_DROPPED: len(dropped)}


@dataclasses.dataclass
class Primary:
    """The primary direction ḡ and what the later steps need of it."""

    vector: torch.Tensor  # ḡ = Σ p_i Δ_i/η_l, (d,) float32: the row after the updates
    weights: np.ndarray  # p_i/η_l, i.e. ḡ = Σ weights_i Δ_i (float64)
    norm: float  # ‖ḡ‖
    unit_scale: float  # g̃_0 = unit_scale·ḡ: 1/(‖ḡ‖ + ε), 1 without normalisation, 0 without a primary


def primary_direction(updates: Updates, eta_l: float, params: Params) -> tuple[Primary, dict]:
    """ḡ = Σ p_i g_i with g_i = Δ_i/η_l and p_i = n_i/Σn (``fedavg``) or 1/k, written into the
    row after the updates; g̃_0 its normalised form (0 for ``primary = 'none'``)."""
    k = len(updates.clients)
    if params.primary == "fedavg-uniform":
        p = torch.full((k,), 1.0 / k, dtype=torch.float64)
    else:
        p = torch.tensor(updates.sizes / updates.sizes.sum(), dtype=torch.float64)
    g_bar = updates.rows[k]
    torch.mv(updates.rows[:k].T, (p / eta_l).to(device=g_bar.device, dtype=g_bar.dtype), out=g_bar)
    norm = float(torch.linalg.vector_norm(g_bar))
    if params.primary == "none":
        unit = 0.0
    else:
        unit = 1.0 if params.normalize == "none" else 1.0 / (norm + params.eps)
    return Primary(g_bar, (p / eta_l).numpy(), norm, unit), {"update-norm": eta_l * norm}  # ‖Σ p_i Δ_i‖, as FedAvg


def normalise(clients: list[int], norms: torch.Tensor, mode: str, eps: float, ema: dict[int, tuple[float, int]],
              beta: float) -> tuple[torch.Tensor, dict[int, tuple[float, int]]]:
    """Factors s_i with c̃_i = s_i g_i (float64) and the clients' updated EMA statistics.

    ``l2``: 1/(‖g_i‖ + ε); ``none``: 1; ``ema``: 1/(√v̂_i + ε) with v̂_i the bias-corrected
    EMA (β = ``beta``) of ‖g_i‖² of client i, ``ema`` its (EMA, times seen) so far.
    """
    norms = norms.double()
    if mode == "l2":
        return 1.0 / (norms + eps), {}
    if mode == "none":
        return torch.ones_like(norms), {}
    if mode != "ema":
        raise ValueError(f"unknown normalisation {mode!r}")
    out, seen = torch.empty_like(norms), {}
    for i, (client, n) in enumerate(zip(clients, norms.tolist())):
        v, k = ema.get(client, (0.0, 0))
        v, k = beta * v + (1.0 - beta) * n * n, k + 1
        seen[client] = (v, k)
        out[i] = 1.0 / (np.sqrt(v / (1.0 - beta**k)) + eps)
    return out, seen


def norm_inliers(norms: np.ndarray, factor: float, low: float = 0.0) -> list[int]:
    """Indices of the updates whose norm is at most ``factor`` × the median norm and (with
    ``low`` = k > 0) at least the median / k (all of them when both are 0 or there are fewer
    than 3: no median to trust)."""
    norms = np.asarray(norms, dtype=np.float64)
    if (factor <= 0.0 and low <= 0.0) or norms.size < 3:
        return list(range(norms.size))
    med = float(np.median(norms))
    return [i for i in range(norms.size)
            if (factor <= 0.0 or norms[i] <= factor * med) and (low <= 0.0 or norms[i] >= med / low)]


def cosine_inliers(gram: np.ndarray, c_dot_gbar, g_bar_norm: float, threshold: float) -> list[int]:
    """Indices j of the constraints with cos(c̃_j, ḡ) = c̃_jᵀḡ/(‖c̃_j‖‖ḡ‖) ≥ ``threshold``
    (a zero direction, e.g. a free rider's, has no angle and stays: its constraint is 0 ≥ 0)."""
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None)) * g_bar_norm
    cos = np.divide(np.asarray(c_dot_gbar, dtype=np.float64), norms, out=np.ones(len(norms)), where=norms > 0)
    return [j for j in range(len(cos)) if cos[j] >= threshold]


def constraints_from_cache(admission: Admission, updates: Updates, primary: Primary, eta_l: float,
                           params: Params) -> tuple[Constraints, dict]:
    """The round's clients enter the history cache as c̃_i = s_i g_i (:func:`normalise`), and
    every entry of the window is a constraint. The outlier options (this project's
    extension): an update outside [median/``outlier-norm-low``, ``outlier-norm`` × median]
    leaves no entry; a constraint whose cosine to ḡ is below ``outlier-cosine`` is left out
    of this round's QP (it stays cached)."""
    norms = torch.tensor(np.sqrt(updates.sq_norms) / eta_l, dtype=torch.float64)  # ‖g_i‖ = ‖Δ_i‖/η_l
    entries = norm_inliers(norms.numpy(), params.outlier_norm, params.outlier_norm_low)
    for i in sorted(set(range(len(norms))) - set(entries)):
        log.info("round %d: FedPCD keeps partition %d out of the QP: its update norm %.3g is outside "
                 "[median/%g, %g x median]", admission.round, updates.clients[i], float(norms[i]),
                 params.outlier_norm_low, params.outlier_norm)
    cache = admission.cache
    scales, ema = normalise([updates.clients[i] for i in entries], norms[entries], params.normalize, params.eps,
                            cache.ema, cache.ema_beta)
    cons = admission.commit(updates.rows, updates.clients, entries, (scales / eta_l).numpy(), primary.weights, ema)
    outliers = len(norms) - len(entries)
    if params.outlier_cosine > -1.0 and cons.slots:
        near = cosine_inliers(cons.gram, cons.c_dot_gbar, primary.norm, params.outlier_cosine)
        outliers += len(cons.slots) - len(near)
        cons = cons.subset(near)
    return cons, {M_CONSTRAINTS: len(cons.slots), M_CACHE: cache.size, M_OUTLIERS: outliers}


class SolverError(RuntimeError):
    """The QP solver did not return a usable solution."""


def clarabel_dual(gram: np.ndarray, lin: np.ndarray, upper: float | None) -> np.ndarray:
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


CANCEL_MAX = 1e3  # Σ μ_j ‖c̃_j‖ / ‖Σ μ_j c̃_j‖ beyond this: the correction is a near-cancellation


def cancellation(q: np.ndarray, mu: np.ndarray) -> float:
    """Σ_j μ_j ‖c̃_j‖ / ‖Σ_j μ_j c̃_j‖ from the Gram matrix: how much the correction cancels.

    An infeasible program has an unbounded dual; in round-off (a float32 cache's Gram
    matrix) the solver returns a huge finite μ whose terms nearly cancel, and the primal
    check C d̃ ≥ b then passes within round-off (measured: μ up to 1.8e7, ratio 9.9e3, on
    an attacked round reported as solved). Feasible rounds measured ≤ 6 (digits, 60 rounds,
    with and without sign-flip attackers; μ ≤ 0.84), so ``CANCEL_MAX`` = 1e3 separates them;
    beyond it the d̃ a float32 cache yields carries a relative error ≳ 1e3·eps₃₂ ≈ 1e-4.
    """
    norms = np.sqrt(np.maximum(np.diag(q), 0.0))
    total = float(mu @ norms)
    if total <= 0.0:
        return 0.0
    return total / max(float(np.sqrt(max(float(mu @ q @ mu), 0.0))), 1e-300)


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
        mu = clarabel_dual(q, lin, None)
        cancel = cancellation(q, mu)
        if cancel > CANCEL_MAX:
            reason = (f"dual solution cancels by {cancel:.3g}x (max mu {mu.max():.3g}): the constraints are "
                      "jointly infeasible or nearly so, beyond what the cache's precision can verify")
        elif np.all(cg + q @ mu >= b - tol):  # C d̃ ≥ b: the primal really is feasible
            return mu, STATUS_SOLVED, ""
        else:
            reason = "dual solution violates the constraints (infeasible program)"
    except Exception as exc:  # noqa: BLE001 - any solver failure → documented fallback
        reason = f"{type(exc).__name__}: {exc}"
    try:
        mu = clarabel_dual(q, lin, ELASTIC_PENALTY)
        return mu, STATUS_ELASTIC, reason
    except Exception as exc:  # noqa: BLE001
        return np.zeros(m), STATUS_PRIMARY, f"{reason}; elastic: {type(exc).__name__}: {exc}"


@dataclasses.dataclass
class Solution:
    """What :func:`solve_dual` found."""

    mu: np.ndarray  # (m',) multipliers, in the constraints' order
    status: int  # a STATUS_* code
    reason: str  # why a fallback was taken ("" otherwise)
    active: np.ndarray  # indices j with μ_j > 0


def solve_dual(constraints: Constraints, primary: Primary, tau: float) -> tuple[Solution, dict]:
    """μ* of the dual QP with b_j = τ‖c̃_j‖² (:func:`dual_multipliers`: the elastic relaxation
    when the program is infeasible or the solver fails, μ = 0 and ḡ when that fails too)."""
    gram = constraints.gram
    t0 = time.perf_counter()
    mu, status, reason = dual_multipliers(gram, primary.unit_scale * constraints.c_dot_gbar, tau * np.diag(gram).copy())
    seconds = time.perf_counter() - t0
    active = np.nonzero(mu > 0.0)[0]
    return Solution(mu, status, reason, active), {M_ACTIVE: int(active.size), M_SOLVER_OK: int(status <= STATUS_SOLVED),
                                                  M_SOLVER_STATUS: status, M_SOLVE_SECONDS: seconds}


def server_step(theta: torch.Tensor, primary: Primary, constraints: Constraints, solution: Solution, eta_g: float,
                out: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """θ_{t+1} = θ_t − η_g d_t (θ in place), d_t = ‖ḡ‖ d̃/‖d̃‖ with d̃ = g̃_0 + Σ_{μ_j>0} μ_j c̃_j
    written into ``out`` (only the active entries are read); d_t = ḡ when nothing is corrected
    (g̃_0 feasible, the fallback to ḡ, or a degenerate d̃ = 0)."""
    direction, step, cosine = primary.vector, eta_g, 1.0
    corrected = solution.status in (STATUS_SOLVED, STATUS_ELASTIC) and solution.active.size > 0
    if corrected:
        torch.mul(primary.vector, primary.unit_scale, out=out)
        constraints.add_to(out, solution.active, solution.mu[solution.active])
        dn = float(torch.linalg.vector_norm(out))
        if np.isfinite(dn) and dn > 1e-30:
            direction = out
            cosine = float(out @ primary.vector) / (dn * max(primary.norm, 1e-30))
            step = eta_g * primary.norm / dn  # θ − η_g ‖ḡ‖ d̃/‖d̃‖
        else:  # degenerate d̃ = 0: keep the primary direction
            corrected = False
    theta.sub_(direction.to(theta.device), alpha=step)
    return theta, {M_CORRECTED: int(corrected), M_COSINE: cosine}


class FedPCDMethod(Method):
    """FedPCD (see the module docstring)."""

    Params = Params
    weighting = "data-size"  # the primary ḡ's weights: fedpcd-primary (resolve_weighting)

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return PRIMARY_WEIGHTING[cls.Params.from_run_config(config).primary]

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        import clarabel  # noqa: F401 - imported here, not inside the first round's solve time
        import scipy.sparse  # noqa: F401
        self._work: torch.Tensor | None = None  # (m + 1, d) float32 on the device: Δ_i rows, then ḡ
        self._dir: torch.Tensor | None = None  # (d,) the corrected direction, on the device
        self.writer = flat.UpdateWriter()  # θ_t's host vector and the staging row, reused every round

    def init(self) -> State:
        return init_state(self.params, self.max_cache_rows())

    def max_cache_rows(self) -> int | None:
        """min(N, (H + 1)·clients per round): no more entries fit in the window (None when N is
        unknown). The cache allocates these rows once; unused ones cost no memory."""
        n, per_round = self.setting.num_clients, self.setting.clients_per_round
        if n is None or per_round is None:
            return None
        return min(n, (self.params.history + 1) * per_round)

    def aggregate(self, round_: Round, state: State) -> Step:
        params, fallbacks = self.params, state.fallbacks
        eta_l = round_.lr
        updates, admission = self.read_round(round_, state.cache)
        updates, dropped, metrics = drop_non_finite(updates)
        discards = dict.fromkeys(dropped, DROPPED_REASON)  # returned with the round's other drops
        if not updates.clients:  # nothing usable: keep the model, never crash the round
            admission.commit()
            return Step(None, State(state.cache, fallbacks), {**metrics, M_FALLBACKS: fallbacks}, discards)
        primary, m_primary = primary_direction(updates, eta_l, params)
        constraints, m_constraints = constraints_from_cache(admission, updates, primary, eta_l, params)
        solution, m_solution = solve_dual(constraints, primary, params.tau)
        theta, m_step = server_step(updates.theta, primary, constraints, solution, round_.step_scale * eta_l,
                                    self._dir)
        if solution.status >= STATUS_ELASTIC:
            fallbacks += 1
            log.warning("round %d: FedPCD fallback (%s): %s", round_.number, STATUS_NAMES[solution.status],
                        solution.reason)
        metrics = {**metrics, **m_primary, **m_constraints, **m_solution, **m_step, M_FALLBACKS: fallbacks}
        return Step(theta, State(state.cache, fallbacks), metrics, discards)

    # -- reading the round: θ_t, client ids, n_i, Δ_i rows (and their cache rows) ---------------------
    def read_round(self, round_: Round, cache: HistoryCache) -> tuple[Updates, Admission]:
        """The round's clients admitted to the cache, and one pass over the replies that writes Δ_i
        into the work rows (and, with a float32 cache, into the rows the admission hands out) with ‖Δ_i‖²."""
        m, d = len(round_), round_.spec.dim
        if self._work is None or self._work.shape[0] < m + 1 or self._work.shape[1] != d:
            self._work = torch.empty(m + 1, d, dtype=torch.float32, device=self.setting.device)
        if self._dir is None or self._dir.numel() != d:
            self._dir = torch.empty(d, dtype=torch.float32, device=self.setting.device)
        clients = list(round_.clients)  # partition-id, else the node id (a foreign app's)
        admission = cache.admit(round_.number, clients, d, self._work.device)
        theta, sq_norms = round_.write_updates(self._work[:m], self.writer, copies=admission.rows, norms=True)
        return Updates(theta, clients, round_.num_examples.numpy(), self._work[: m + 1], sq_norms), admission


@register("fedpcd")
class FedPCD(FairStrategy):
    """FedPCD (see the module docstring): ``FedPCD(fraction_train=0.1, tau=0.02, history=10, seed=0)``."""

    method_class = FedPCDMethod
    Params = Params

    def __init__(self, *, tau: float = Params.tau, history: int = Params.history, eps: float = Params.eps,
                 normalize: str = Params.normalize, ema_beta: float = Params.ema_beta, primary: str = Params.primary,
                 cache_dtype: str = Params.cache_dtype, outlier_norm: float = Params.outlier_norm,
                 outlier_norm_low: float = Params.outlier_norm_low, outlier_cosine: float = Params.outlier_cosine,
                 params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedPCD", tau=tau, history=history, eps=eps, normalize=normalize,
                                       ema_beta=ema_beta, primary=primary, cache_dtype=cache_dtype,
                                       outlier_norm=outlier_norm, outlier_norm_low=outlier_norm_low,
                                       outlier_cosine=outlier_cosine), **common)
