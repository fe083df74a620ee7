"""FedPCD: priority-constrained aggregation with a server-side history cache.

Papers ``000_*``/``001_*`` (FedPCD, Algorithm 1) and ``../shared/spec/ALGORITHMS.md``.
**Read :func:`strategies.algorithms.fedpcd_round` first**: Algorithm 1 line by line, in plain
float64 torch. This module is the fast kernel of the same round (cached Gram rows, the dual
QP, buffers reused across rounds); ``tests/test_algorithms.py`` checks that they agree.
Per round the server takes the FedAvg pseudo-gradient ḡ = Σ p_i g_i (g_i = Δ_i/η_l) as the
primary direction and finds the direction closest to it that makes progress τ on every
client direction it knows about (current participants and a cache of recent ones):

    d̃* = argmin_d ½‖d − g̃_0‖²  s.t.  c̃_jᵀ d ≥ τ‖c̃_j‖²,   d_t = ‖ḡ‖ d̃*/‖d̃*‖,
    θ_{t+1} = θ_t − η_g d_t.

The QP is solved in its dual over the m' constraint multipliers (Gram matrix Q = C Cᵀ),
never in R^d:  μ* = argmin_{μ≥0} ½ μᵀQμ + μᵀ(C g̃_0 − b),  d̃* = g̃_0 + Cᵀμ*.

With ``server-lr`` η_g = η_l (0, the default) and no active constraint a round is exactly FedAvg. The
outlier options (``fedpcd-outlier-*``) are this project's extension, not in the papers.

Diagnostics per round (MetricRecord → rounds.jsonl): ``fedpcd-constraints`` (m'),
``fedpcd-active`` (#μ_j > 0), ``fedpcd-corrected`` (0/1), ``fedpcd-cosine`` (cos(d_t, ḡ)),
``fedpcd-solver-ok`` (0/1), ``fedpcd-solver-status`` (0 feasible, 1 solved, 2 elastic,
3 primary), ``fedpcd-solve-seconds``, ``fedpcd-fallbacks`` (cumulative),
``fedpcd-dropped`` (non-finite updates), ``fedpcd-cache-size``, ``fedpcd-outliers``
(constraints left out by the outlier options this round).

Cost per round (``benchmarks/aggregation.py`` times it against this floor): one pass over
the replies that writes Δ_i into k work rows and into the cache (float32: the raw Δ_i with
a float64 factor, its client's own row when it returns) and squares Δ_i while each block is
in the cache (:func:`fedcore.flat.deltas_into`); ḡ over the work rows; one (k × d)·(d × m') product for
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
dropped for the round with a logged reason (a returning client's cached entry with it: its
row was being overwritten; the app's reply validation drops such replies before FedPCD).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch
from flwr.app import MetricRecord

from fedcore import flat
from fedcore.config import ConfigError, Grid
from fedcore.params import MethodParams, hyper
from strategies.base import FairStrategy
from strategies.fedpcd_cache import HistoryCache
from strategies.linalg import clarabel_qp
from strategies.registry import register
from strategies.rounds import Aggregated
from strategies.updates import client_of

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
    number of solver fallbacks so far."""

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


CANCEL_MAX = 1e3  # Σ μ_j ‖c̃_j‖ / ‖Σ μ_j c̃_j‖ beyond this: the correction is a near-cancellation


def _cancellation(q: np.ndarray, mu: np.ndarray) -> float:
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
        mu = _clarabel_qp(q, lin, None)
        cancel = _cancellation(q, mu)
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
        mu = _clarabel_qp(q, lin, ELASTIC_PENALTY)
        return mu, STATUS_ELASTIC, reason
    except Exception as exc:  # noqa: BLE001
        return np.zeros(m), STATUS_PRIMARY, f"{reason}; elastic: {type(exc).__name__}: {exc}"


@dataclasses.dataclass
class Correction:
    """What :func:`correct_direction` found."""

    mu: np.ndarray  # (m',) multipliers in ``slots`` order
    status: int  # a STATUS_* code
    reason: str  # why a fallback was taken ("" otherwise)
    active: np.ndarray  # indices j with μ_j > 0
    corrected: bool  # the direction differs from ḡ
    step: float  # θ_{t+1} = θ_t − step·direction
    cosine: float  # cos(d_t, ḡ)
    solve_seconds: float


def correct_direction(
    cache: HistoryCache,
    slots: list[int],
    g_bar: torch.Tensor,
    c_dot_gbar: np.ndarray,
    g0_scale: float,
    tau: float,
    eta_g: float,
    out: torch.Tensor,
) -> tuple[torch.Tensor, Correction]:
    """FedPCD's corrected step from the cache (paper eq. 10-11, dual form): one code path for
    the strategy and :func:`fedpcd_direction`.

    The constraints are the cache entries c̃_j in ``slots``, their Gram matrix is the cache's;
    ``c_dot_gbar`` are c̃_jᵀḡ and g̃_0 = ``g0_scale``·ḡ. Solves the dual for μ, then writes
    d̃ = g̃_0 + Σ_{μ_j>0} μ_j c̃_j into ``out`` (only the *active* entries are read). Returns
    the direction to step along (``out``, or ``g_bar`` itself when nothing is corrected) and
    the step length: η_g‖ḡ‖/‖d̃‖ (so that d_t = ‖ḡ‖ d̃/‖d̃‖), or η_g along ḡ.
    """
    gram = cache.gram_of(slots)
    t0 = time.perf_counter()
    mu, status, reason = dual_multipliers(gram, g0_scale * c_dot_gbar, tau * np.diag(gram).copy())
    solve_s = time.perf_counter() - t0
    active = np.nonzero(mu > 0.0)[0]
    corrected = status in (STATUS_SOLVED, STATUS_ELASTIC) and active.size > 0
    g_bar_norm = float(torch.linalg.vector_norm(g_bar))
    direction, step, cosine = g_bar, eta_g, 1.0
    if corrected:
        torch.mul(g_bar, g0_scale, out=out)
        cache.add_rows(out, [slots[j] for j in active], mu[active])
        dn = float(torch.linalg.vector_norm(out))
        if np.isfinite(dn) and dn > 1e-30:
            direction = out
            cosine = float(out @ g_bar) / (dn * max(g_bar_norm, 1e-30))
            step = eta_g * g_bar_norm / dn  # θ − η_g ‖ḡ‖ d̃/‖d̃‖
        else:  # degenerate d̃ = 0: keep the primary direction
            corrected = False
    return direction, Correction(mu, status, reason, active, corrected, step, cosine, solve_s)


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

    The constraints go through a one-round :class:`HistoryCache` and :func:`correct_direction`,
    the strategy's own code path.
    """
    m = constraints.shape[0]
    if m == 0:
        return g_bar, torch.zeros(0, dtype=torch.float64)
    dtype = torch.float64 if torch.float64 in (g_bar.dtype, constraints.dtype) else torch.float32
    cache = HistoryCache(0, dtype=dtype)
    rows = torch.cat([constraints.to(dtype), g_bar.to(dtype).unsqueeze(0)])
    norms = torch.linalg.vector_norm(constraints.double(), dim=1)
    c_dot_gbar = cache.insert(1, list(range(m)), rows, n_new=m, scales=(1.0 / (norms + eps)).numpy())
    g32 = rows[m]
    direction, corr = correct_direction(cache, cache.active_slots(), g32, np.atleast_1d(c_dot_gbar),
                                        1.0 / (float(torch.linalg.vector_norm(g32)) + eps), tau, 1.0,
                                        torch.empty_like(g32))
    mu = torch.from_numpy(corr.mu)
    if not corr.corrected:
        return g_bar, mu
    return (direction * corr.step).to(g_bar.dtype), mu


@register("fedpcd")
class FedPCD(FairStrategy):
    """FedPCD (see the module docstring): ``FedPCD(fraction_train=0.1, tau=0.02, history=10, seed=0)``."""

    weighting = "data-size"  # the primary ḡ's weights: fedpcd-primary (resolve_weighting)

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return PRIMARY_WEIGHTING[cls.Params.from_run_config(config).primary]

    Params = Params

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        import clarabel  # noqa: F401 - imported here, not inside the first round's solve time
        import scipy.sparse  # noqa: F401
        self._work: torch.Tensor | None = None  # (m + 1, d) float32 on the device: Δ_i rows, then ḡ
        self._dir: torch.Tensor | None = None  # (d,) the corrected direction, on the device
        self.writer = flat.UpdateWriter()  # θ_t's host vector and the staging row, reused every round

    def init_state(self) -> State:
        return init_state(self.params, self.max_cache_rows())

    def max_cache_rows(self) -> int | None:
        """min(N, (H + 1)·clients per round): no more entries fit in the window (None when
        N is unknown). The cache allocates these rows once; unused ones cost no memory."""
        if self.num_clients is None:
            return None
        per_round = min(self.num_clients, max(self.min_train_nodes, int(round(self.fraction_train * self.num_clients))))
        return min(self.num_clients, (self.params.history + 1) * per_round)

    # -- persistent buffers (first-touch page faults of big tensors cost more than FedAvg)
    def _buffers(self, m: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._work is None or self._work.shape[0] < m + 1 or self._work.shape[1] != d:
            self._work = torch.empty(m + 1, d, dtype=torch.float32, device=self.device)
        if self._dir is None or self._dir.numel() != d:
            self._dir = torch.empty(d, dtype=torch.float32, device=self.device)
        return self._work, self._dir

    def aggregate_valid(self, server_round, replies):
        p_, cache = self.params, self.state.cache
        work, out = self._buffers(len(replies), self.spec.dim)
        eta_l = self.round_lr(server_round)
        eta_g = self.step_scale(server_round) * eta_l
        pids = [client_of(msg) for msg in replies]  # partition-id, else the node id (a foreign app's)
        # float32 cache: each direction is written raw into its cache row (its client's own
        # row when it returns) while Δ_i is computed (entry = factor · row), so no pass scales
        # it in afterwards. 16-bit cache: rows are rounded after scaling: insert() below.
        raw = cache.dtype == work.dtype
        if raw:
            cache.expire(server_round)
            claimed = cache.claim(pids, like=work)
        # One pass: Δ_i into the work rows (and the cache rows) and ‖Δ_i‖².
        m = len(replies)
        batch = self.read_updates(replies, out=work[:m], writer=self.writer,
                                  copies=[cache.row(s) for s in claimed] if raw else None, norms=True)
        theta, sq, n_ex = batch.theta, batch.sq_norms, batch.num_examples.numpy()
        keep = [i for i in range(m) if np.isfinite(sq[i])]
        for i in sorted(set(range(m)) - set(keep)):  # a non-finite update drops its client
            if raw:
                cache.release(pids[i], claimed[i])
        # returned with the round's other drops (rounds.jsonl "dropped")
        discards = [(replies[i], "FedPCD: its update's squared norm is not finite in float32 (NaN/Inf or too large)")
                    for i in sorted(set(range(m)) - set(keep))]
        dropped, k = m - len(keep), len(keep)
        if k == 0:  # nothing usable: keep the model, never crash the round
            cache.expire(server_round)
            metrics = {M_DROPPED: dropped, M_FALLBACKS: self.state.fallbacks}
            return Aggregated(self.current_arrays, MetricRecord(metrics), discards)
        if p_.primary == "fedavg-uniform":  # ḡ = (1/k) Σ g_i
            p = torch.full((len(keep),), 1.0 / len(keep), dtype=torch.float64)
        else:
            p = torch.tensor(n_ex[keep] / n_ex[keep].sum(), dtype=torch.float64)
        if dropped:  # rare: the valid rows move up
            work[:k] = work[keep].clone()
        g_bar = work[k]
        torch.mv(work[:k].T, (p / eta_l).to(device=work.device, dtype=work.dtype), out=g_bar)  # ḡ = Σ p_i Δ_i/η_l
        g_bar_norm = float(torch.linalg.vector_norm(g_bar))
        pids = [pids[i] for i in keep]
        norms = torch.tensor(np.sqrt(sq[keep]) / eta_l, dtype=torch.float64)  # ‖g_i‖ = ‖Δ_i‖/η_l
        # Outlier option (this project's extension): over-long updates count in ḡ, get no constraint.
        inl = norm_inliers(norms.numpy(), p_.outlier_norm, p_.outlier_norm_low)
        for i in sorted(set(range(k)) - set(inl)):
            log.info("round %d: FedPCD keeps partition %d out of the QP: its update norm %.3g is outside "
                     "[median/%g, %g x median]", server_round, pids[i], float(norms[i]), p_.outlier_norm_low,
                     p_.outlier_norm)
            if raw:
                cache.release(pids[i], claimed[keep[i]])
        outliers = k - len(inl)
        c_pids = [pids[i] for i in inl]

        # Constraint directions c̃_i = s_i g_i = (s_i/η_l) Δ_i.
        scale = cache.scales(c_pids, norms[inl], p_.normalize, p_.eps)
        if p_.primary != "none":
            g0_scale = 1.0 if p_.normalize == "none" else 1.0 / (g_bar_norm + p_.eps)
        else:
            g0_scale = 0.0
        # The new Gram rows: one matmul of the k new rows with the stored ones. float32:
        # c̃_jᵀḡ = f_j Σ_i (p_i/η_l) Δ_iᵀr_j comes from the same products (ḡ is not multiplied
        # with the cache). 16-bit: ḡ (unrounded) joins the product as an extra row.
        if raw:
            new = [claimed[keep[i]] for i in inl]
            prods = cache.products(work[:k], sorted({*cache.active_slots(), *new}))
            cache.commit(server_round, c_pids, new, (scale / eta_l).numpy(), prods[inl])
            slots = cache.active_slots()
            c_dot_gbar = ((p / eta_l).numpy() @ prods[:, slots]) * cache.factor[slots]
        else:
            rows = work[: k + 1] if not outliers else work[inl + [k]]
            c_dot_gbar = cache.insert(server_round, c_pids, rows, n_new=len(inl), scales=(scale / eta_l).numpy())
            slots = cache.active_slots()
        if p_.outlier_cosine > -1.0 and slots:
            near = cosine_inliers(cache.gram_of(slots), c_dot_gbar, g_bar_norm, p_.outlier_cosine)
            outliers += len(slots) - len(near)
            slots, c_dot_gbar = [slots[j] for j in near], np.asarray(c_dot_gbar)[near]
        direction, corr = correct_direction(cache, slots, g_bar, c_dot_gbar, g0_scale, p_.tau, eta_g, out)
        if corr.status >= STATUS_ELASTIC:
            self.state.fallbacks += 1
            log.warning("round %d: FedPCD fallback (%s): %s", server_round, STATUS_NAMES[corr.status], corr.reason)
        theta.sub_(direction.to(theta.device), alpha=corr.step)
        metrics = {
            M_CONSTRAINTS: len(slots),
            M_ACTIVE: int(corr.active.size),
            M_CORRECTED: int(corr.corrected),
            M_COSINE: corr.cosine,
            M_SOLVER_OK: int(corr.status <= STATUS_SOLVED),
            M_SOLVER_STATUS: corr.status,
            M_SOLVE_SECONDS: corr.solve_seconds,
            M_FALLBACKS: self.state.fallbacks,
            M_DROPPED: dropped,
            M_CACHE: cache.size,
            M_OUTLIERS: outliers,
            "update-norm": eta_l * g_bar_norm,  # ‖Σ p_i Δ_i‖, as FedAvg reports it
        }
        return Aggregated(self.to_record(theta), MetricRecord(metrics), discards)
