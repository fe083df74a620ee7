"""FedAvg (McMahan et al., 2017): the data-size-weighted mean of the local models.

θ_{t+1} = Σ_i p_i θ_i with p_i = n_i / Σ_j n_j. With ``server-lr`` η_g set (> 0) the step
is θ_t − η_g/η_l · Σ p_i Δ_i, i.e. η_g = η_l (the default) is plain FedAvg. No
hyperparameters of its own.

Weighting of the FedAvg family (FedAvg, FedProx, and the server optimisers of
``strategies.fedopt``): ``fedavg_weighting`` (the app's run-config key ``fedavg-weighting``)
``"data-size"`` (default, p_i = n_i / Σ n_j) or ``"uniform"`` (p_i = 1/m over the m replies:
FedeRage's Algorithm 1 FedAvg, and the q-FFL/FedProx authors' FedAvg, whose clients are drawn
with probability ∝ n_k, so that the uniform mean stays unbiased for Σ_k p_k F_k; the app uses
it whenever ``participation = "size-proportional"``). Under secure aggregation the secure sum
is then uniform too.

The mean is taken straight from the replies' bytes, one column block at a time
(:func:`weighted_sum_records`): no (m, d) matrix is built, so a round reads each reply once
and touches no fresh memory beyond the d-vectors (for a ResNet-18 with 10 replies the
matrix was a 447 MB first-touch allocation, half the round's time).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import MetricRecord

from fedcore import flat, keys
from fedcore.config import APP, ConfigError
from strategies.base import FairStrategy, metric_column, reply_metrics
from strategies.registry import register

_BLOCK_ELEMS = 1 << 22  # an (m, columns) float32 block of 16 MB: large enough that each
# product is one substantial BLAS call (many tiny calls stall on thread barriers when
# the cores are shared), small enough that no (m, d) matrix is ever built


WEIGHTINGS = ("data-size", "uniform")


def check_weighting(value: str) -> str:
    if value not in WEIGHTINGS:
        raise ConfigError(f"run-config key 'fedavg-weighting' = {value!r} is not one of {', '.join(WEIGHTINGS)}")
    return value


def fedavg_weights(num_examples: torch.Tensor, weighting: str) -> torch.Tensor:
    """p_i: n_i / Σ n_j (``data-size``) or 1/m (``uniform``), float64."""
    n = num_examples.to(torch.float64)
    return n / n.sum() if weighting == "data-size" else torch.full_like(n, 1.0 / n.numel())


def fedavg_direction(pseudo_gradients: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """ḡ = Σ_i p_i g_i for (m, d) rows and (m,) weights summing to 1."""
    return weights.to(pseudo_gradients.dtype) @ pseudo_gradients


def weighted_sum_records(records: list, weights: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_i w_i θ_i (float32) for m ArrayRecords, without stacking them.

    Equals ``fedavg_direction(records_to_matrix(records), weights)`` bit for bit: each
    column block is the same float32 matrix-vector product over the same m values in the
    same order (``tests/test_benchmarks_perf.py`` checks it). ``out``: a (d,) float32
    tensor to write into.
    """
    views = [[flat.array_view(a).reshape(-1) for a in rec.values()] for rec in records]
    sizes = [v.size for v in views[0]]
    for i, vs in enumerate(views):
        if [v.size for v in vs] != sizes:
            raise ValueError(f"reply {i} has arrays of sizes {[v.size for v in vs]}, the first reply {sizes}")
    m, d = len(records), int(sum(sizes))
    if out is None:
        out = torch.empty(d, dtype=torch.float32)
    w = weights.to(torch.float32)
    cols = max(1, min(d, _BLOCK_ELEMS // max(m, 1)))
    buf = np.empty(m * cols, dtype=np.float32)
    starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    k = 0  # first array overlapping the block
    for a in range(0, d, cols):
        e = min(a + cols, d)
        block = buf[: m * (e - a)].reshape(m, e - a)
        while starts[k + 1] <= a:
            k += 1
        j = k
        while j < len(sizes) and starts[j] < e:  # the arrays' pieces inside [a, e)
            lo, hi = max(a, starts[j]), min(e, starts[j + 1])
            for i in range(m):
                block[i, lo - a : hi - a] = views[i][j][lo - starts[j] : hi - starts[j]]  # one copy
            j += 1
        torch.mv(torch.from_numpy(block).T, w, out=out[a:e])
    return out


@register("fedavg")
class FedAvg(FairStrategy):
    """FedAvg (see the module docstring); a weighted sum, so it runs under secure aggregation."""

    weighting = "data-size"  # or uniform: fedavg-weighting (resolve_weighting)

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return str(APP["fedavg-weighting"].read(config))

    needs_individual_updates = False
    app_arguments = ("fedavg_weighting",)

    def __init__(self, *, fedavg_weighting: str = "data-size", **kwargs) -> None:
        super().__init__(**kwargs)
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        if fedavg_weighting == "uniform":
            self.secagg_weighting = "uniform"  # the secure sum is the uniform mean too

    def aggregate_valid(self, server_round, replies):
        n = metric_column(reply_metrics(replies), keys.NUM_EXAMPLES)
        theta = self.current_flat()
        p = fedavg_weights(n, self.fedavg_weighting)
        g_bar = weighted_sum_records([msg.content[keys.ARRAYS] for msg in replies], p)  # Σ p_i θ_i
        g_bar = torch.sub(theta, g_bar, out=g_bar)  # Σ p_i Δ_i
        new = theta - self.step_scale(server_round) * g_bar
        return self.to_record(new), MetricRecord({"update-norm": float(g_bar.norm())})
