"""Small vector steps several methods share: unit normalisation, simplex projection, and
Clarabel QPs (FedPCD's dual, the minimum-norm point of a Gram matrix over the simplex)."""

from __future__ import annotations

import numpy as np
import torch


def unit_rows(mat: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows / (‖row‖ + eps), ‖row‖)."""
    norms = torch.linalg.vector_norm(mat, dim=1)
    return mat / (norms + eps).unsqueeze(1), norms


def project_simplex(v: np.ndarray | torch.Tensor) -> np.ndarray:
    """Euclidean projection onto the probability simplex (Duchi et al., 2008)."""
    v = np.asarray(v, dtype=np.float64)
    # The projection commutes with shifting every entry by the same c; shifted so that the
    # largest is 0, the sums below stay at the scale of the gaps (AFL's λ + γF after a
    # diverging round, F ~ 1e22, rounded u₀ − 1 to u₀ and left no index to choose).
    v = v - v.max()
    n = v.size
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    rho = np.nonzero(u * np.arange(1, n + 1) > css)[0][-1]
    theta = css[rho] / (rho + 1.0)
    return np.maximum(v - theta, 0.0)


def clarabel_qp(quad: np.ndarray, lin: np.ndarray, a, rhs: np.ndarray, cones: list) -> tuple[np.ndarray | None, str]:
    """argmin ½ xᵀ Q x + linᵀ x  s.t.  A x + s = rhs, s ∈ ``cones`` (Clarabel's standard form).

    ``quad``: the dense symmetric Q (its upper triangle goes to the solver); ``a``: a scipy
    sparse matrix. Returns (x, status): x is None unless the solver reports Solved or
    AlmostSolved. Shared by FedPCD's dual QP and :func:`min_norm_simplex`.
    """
    import clarabel
    from scipy import sparse

    p = sparse.triu(sparse.csc_matrix(quad)).tocsc()
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    sol = clarabel.DefaultSolver(p, np.asarray(lin, dtype=np.float64), a, rhs, cones, settings).solve()
    solved = sol.status in (clarabel.SolverStatus.Solved, clarabel.SolverStatus.AlmostSolved)
    return (np.asarray(sol.x, dtype=np.float64) if solved else None), f"{sol.status}"


def min_norm_simplex(
    gram: np.ndarray | torch.Tensor,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
) -> np.ndarray:
    """argmin_λ λᵀ G λ over the simplex (optionally with box bounds), with Clarabel.

    The minimum-norm point of the convex hull of rows whose Gram matrix is ``gram``
    (MGDA, FedMGDA+, FedLF). Bounds: lower ≤ λ ≤ upper elementwise.

    The QP goes to Clarabel directly (the interior-point solver cvxpy would call): G
    scaled by its largest diagonal entry, Σλ = 1 as a zero cone, the bounds as one
    nonnegative cone. No cvxpy canonicalisation and no eigendecomposition per call: this
    runs once per layer group per round (FedLF), so it has to cost about a millisecond.
    """
    import clarabel
    from scipy import sparse

    g = np.asarray(gram, dtype=np.float64)
    m = g.shape[0]
    if m == 1:
        return np.ones(1)
    scale = max(float(np.abs(np.diag(g)).max()), 1e-30)
    eye = sparse.identity(m, format="csc")
    lo = np.zeros(m) if lower is None else np.maximum(np.asarray(lower, dtype=np.float64), 0.0)
    rows, rhs = [sparse.csc_matrix(np.ones((1, m))), -eye], [np.ones(1), -lo]  # Σλ = 1; −λ ≤ −lo
    if upper is not None:
        rows.append(eye)  # λ ≤ upper
        rhs.append(np.asarray(upper, dtype=np.float64) * np.ones(m))
    a = sparse.vstack(rows).tocsc()
    cones = [clarabel.ZeroConeT(1), clarabel.NonnegativeConeT(a.shape[0] - 1)]
    # ½λᵀPλ with P = (G + Gᵀ)/scale is λᵀGλ/scale
    x, status = clarabel_qp((g + g.T) / scale, np.zeros(m), a, np.concatenate(rhs), cones)
    if x is None:
        raise RuntimeError(f"min-norm QP failed: {status}")
    out = np.clip(x, 0.0, None)  # solver round-off
    return out / out.sum()
