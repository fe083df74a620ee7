"""FedPW ("Rethinking Fair Federated Learning from Parameter and Client View"; authors' code
``guankaiqi/FedPW``, ``models/fedpw.py``): momentum client weights from losses and the
Gram matrix, plus magnitude dropping and consensus rescaling of the update.

What is implemented, with Δ_i = θ_t − θ_i and ℓ_i the client's mean local training loss
(``train-loss``, as the code uses), i ∈ S_t (m clients):

1. Client weights (``update`` in the code). Loss shares a_i = ℓ_i / Σℓ; Gram shares
   b_i = (GΣ)_i / Σ_j (GΣ)_j with G the Gram matrix of the updates over the model's
   parameters (running statistics of normalisation layers excluded) and (GΣ)_i = Δ_i·ΣΔ.
   Momentum rates β_ℓ = β·mean(ℓ)/mean(ℓ)^(0), β_G = β·mean(GΣ)/mean(GΣ)^(0) against the
   first round's values (protection fades as training progresses). Per client
   δp_i ← (1−β_ℓ)δp_i + β_ℓ a_i; p_i ← p_i + δp_i; p ← p/Σp, and likewise p^G with b and
   β_G. Mix: r = std(p)/(std(p)+std(p^G)); w_i = r p_i + (1−r) p^G_i.
2. Drop rates (``update_drop_rate``): ρ_i = min(m·ρ̄ (1/ℓ_i)/Σ_j(1/ℓ_j), 1) (lower loss →
   more dropping; their mean is ρ̄ before the cap).
3. Aggregation, per array q of the model (``aggregate_nets_pw``): in the first round
   g_q = Σ w_i Δ_i,q. Afterwards each client zeroes its ⌊ρ_i n_q⌋ smallest-magnitude
   entries of Δ_i,q (``drop``); g_q = Σ w_i Δ̃_i,q; the ⌊ρ̄ n_q⌋ coordinates with the
   smallest spread across clients (std over clients of the row- then column-normalised
   Δ̃_q: where the clients agree most) are scaled by 1 + ā_drop/ā_keep when that ratio
   is < 1, with ā_drop the mean magnitude of the dropped entries and ā_keep the mean
   |g_q| on those coordinates (``consensus``; skipped for normalisation statistics).
4. θ ← θ − s g with s = ``server-lr``/``lr`` (1 when ``server-lr`` is 0, the default).

Deviations, all documented here: the code estimates both means from every 10th entry of
the sorted index lists — here they are exact means over the entries; a client that drops
nothing is left out of ā_drop (the code's mean would become NaN and skip the rescale);
columns whose normalised spread is undefined (all clients zero there) never count as
agreeing (the code's NaN sorts last the same way); with m = 1 no rescale (no spread).

Partial participation: the code runs all clients every round. Here p, δp, p^G, δp^G are
kept for all N clients (:class:`State`, one slot per client id, zeros until first seen: with
``num_clients`` = N the slots are the partition ids 0..N−1, and a client id never seen
before — a foreign app's node id — gets a new zero slot); a round
updates the momentum of its sampled clients only, normalises p over all N as the code
does, and restricts p and p^G to S_t (renormalised to sum 1) for the stds and the weights.
Shares, averages, ρ and the reference values of the first round are over S_t. With full
participation this is exactly the code.

Degenerate case: ρ̄ = 0 drops and
rescales nothing; with equal losses and
identical updates every share is 1/m and the step is the uniform mean of Δ_i (FedAvg
with uniform weights).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from fedcore import keys
from fedcore.params import MethodParams, hyper
from strategies import linalg
from strategies.base import Method, Reads, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register

_STAT_MARKERS = ("running_mean", "running_var", "num_batches_tracked")  # not parameters


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """FedPW's hyperparameters (see the module docstring)."""

    prefix = "fedpw"
    beta: float = hyper(0.3, low=0.0, high=1.0, doc="β, the momentum rate of the client weights (the code's default)")
    drop_rate: float = hyper(0.3, low=0.0, high=1.0, doc="ρ̄, the mean drop rate (the code's default); 0 drops and "
                                                         "rescales nothing")


def is_statistic(name: str) -> bool:
    """True for normalisation-layer statistics (excluded from the Gram and the rescale)."""
    return any(s in name for s in _STAT_MARKERS)


def gram_shares(deltas: torch.Tensor, groups: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(GΣ)_i = Δ_i·Σ_j Δ_j over the parameter groups; returns (shares, (GΣ))."""
    d = deltas.to(torch.float64)
    gram = sum(d[:, a:b] @ d[:, a:b].T for a, b in groups)
    row = gram.sum(1)
    return row / row.sum(), row


def drop_rates(losses: torch.Tensor, avg_rate: float) -> torch.Tensor:
    """ρ_i = min(m ρ̄ (1/ℓ_i)/Σ_j (1/ℓ_j), 1)."""
    inv = 1.0 / losses.to(torch.float64).clamp_min(1e-12)
    return torch.clamp(inv / inv.sum() * losses.numel() * avg_rate, max=1.0)


def smallest_k(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` smallest entries of a 1-D tensor (in no particular order).

    The same set as ``torch.topk(values, k, largest=False).indices`` (up to the choice
    among exactly equal values): numpy's introselect partition, faster than topk for a k of
    a sizeable fraction of a layer (docs/performance.md, rule 5).
    """
    if k >= values.numel():
        return torch.arange(values.numel())
    arr = values.detach().cpu().contiguous().numpy()
    return torch.from_numpy(np.argpartition(arr, k - 1)[:k]).to(values.device)


def drop_smallest(block: torch.Tensor, rates: torch.Tensor) -> tuple[torch.Tensor, list[float], int]:
    """Zero each row's ⌊ρ_i n⌋ smallest |entries|; (dropped block, mean |dropped| per row, count)."""
    out = block.clone()
    mags = block.abs()
    n = block.shape[1]
    means, count = [], 0
    for i, rate in enumerate(rates.tolist()):
        k = int(n * rate)
        if k == 0:
            continue
        row, out_row = mags[i].numpy(), out[i].numpy()  # views: gather/scatter in numpy
        idx = smallest_k(mags[i], k).numpy()
        means.append(float(row[idx].mean()))
        out_row[idx] = 0.0
        count += k
    return out, means, count


def consensus_rescale(
    block: torch.Tensor, g: torch.Tensor, avg_rate: float, dropped_mean: float | None
) -> tuple[torch.Tensor, int]:
    """Scale g on the ⌊ρ̄ n⌋ most-agreed coordinates by 1 + ā_drop/ā_keep (when < 2)."""
    m, n = block.shape
    k = int(n * avg_rate)
    if k == 0 or m < 2 or dropped_mean is None:
        return g, 0
    rows = linalg.unit_rows(block.to(torch.float64))[0]
    col_norm = torch.linalg.vector_norm(rows, dim=0)
    cols = rows / torch.where(col_norm > 0, col_norm, 1.0)
    spread = torch.where(col_norm > 0, cols.std(0, unbiased=True), torch.inf)
    idx = smallest_k(spread, k)
    keep_mean = float(g[idx].abs().mean())
    if keep_mean == 0 or dropped_mean / keep_mean >= 1:
        return g, 0
    g = g.clone()
    g[idx] *= 1.0 + dropped_mean / keep_mean
    return g, k


def fedpw_update(
    deltas: torch.Tensor,
    weights: torch.Tensor,
    rates: torch.Tensor,
    avg_rate: float,
    groups: list[tuple[int, int]],
    statistic: list[bool],
    drop: bool,
) -> tuple[torch.Tensor, int, int]:
    """g = per-group weighted sum of (dropped, rescaled) updates; (g, #dropped, #rescaled)."""
    w = weights.to(torch.float64)
    g = torch.empty(deltas.shape[1], dtype=torch.float64)
    dropped_total = rescaled_total = 0
    for (a, b), is_stat in zip(groups, statistic):
        block = deltas[:, a:b].to(torch.float64)
        if not drop:
            g[a:b] = w @ block
            continue
        block, means, count = drop_smallest(block, rates)
        dropped_total += count
        g_q = w @ block
        if not is_stat:
            g_q, rescaled = consensus_rescale(block, g_q, avg_rate, sum(means) / len(means) if means else None)
            rescaled_total += rescaled
        g[a:b] = g_q
    return g, dropped_total, rescaled_total


@dataclasses.dataclass
class State:
    """Momentum weights, one slot per client, and the first round's reference values."""

    p_loss: torch.Tensor
    dp_loss: torch.Tensor
    p_gram: torch.Tensor
    dp_gram: torch.Tensor
    loss_ref: float = 0.0  # mean loss of the first aggregated round
    gram_ref: float = 0.0  # mean (GΣ)_i of the first aggregated round
    rounds_done: int = 0
    slots: dict[int, int] = dataclasses.field(default_factory=dict)  # client id → index

    @classmethod
    def zeros(cls, n: int) -> State:
        """N zero slots for clients 0..N−1."""
        z = lambda: torch.zeros(n, dtype=torch.float64)  # noqa: E731
        return cls(z(), z(), z(), z(), slots={i: i for i in range(n)})

    def copy(self) -> State:
        """A state the round can advance in place (this one unchanged)."""
        return State(self.p_loss.clone(), self.dp_loss.clone(), self.p_gram.clone(), self.dp_gram.clone(),
                     self.loss_ref, self.gram_ref, self.rounds_done, dict(self.slots))


def assign_slots(state: State, clients: list[int]) -> list[int]:
    """The slots of ``clients``; a client seen for the first time gets a new zero slot."""
    for c in clients:
        if c not in state.slots:
            state.slots[c] = len(state.p_loss)
            zero = torch.zeros(1, dtype=torch.float64)
            state.p_loss, state.dp_loss, state.p_gram, state.dp_gram = (
                torch.cat([v, zero]) for v in (state.p_loss, state.dp_loss, state.p_gram, state.dp_gram))
    return [state.slots[c] for c in clients]


def momentum_weights(
    state: State, ids: list[int], loss_share: torch.Tensor, gram_share: torch.Tensor,
    beta_loss: float, beta_gram: float,
) -> tuple[torch.Tensor, float]:
    """Advance the momenta of the slots ``ids`` in place; the round's weights and mix r."""
    idx = torch.tensor(ids, dtype=torch.long)
    restricted = []
    for p, dp, share, b in ((state.p_loss, state.dp_loss, loss_share, beta_loss),
                            (state.p_gram, state.dp_gram, gram_share, beta_gram)):
        dp[idx] = (1.0 - b) * dp[idx] + b * share
        p[idx] += dp[idx]
        p /= p.sum()
        restricted.append(p[idx] / p[idx].sum())
    q_loss, q_gram = restricted
    if len(ids) < 2:
        ratio = 0.5
    else:
        s_loss, s_gram = float(q_loss.std()), float(q_gram.std())
        ratio = s_loss / (s_loss + s_gram) if s_loss + s_gram > 0 else 0.5
    return ratio * q_loss + (1.0 - ratio) * q_gram, ratio


class FedPWMethod(Method):
    """FedPW (see the module docstring)."""

    Params = Params
    weighting = "loss"  # loss- and Gram-based momentum weights

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(losses=(keys.TRAIN_LOSS,))  # the one method that weights by the clients' train loss

    def init(self) -> State:
        return State.zeros(self.setting.num_clients or 0)

    def aggregate(self, round_: Round, state: State) -> Step:
        theta, deltas = round_.theta, round_.deltas
        groups = round_.spec.offsets()
        statistic = [is_statistic(k) for k in round_.spec.keys]
        param_groups = [g for g, s in zip(groups, statistic) if not s]

        losses = round_.value(keys.TRAIN_LOSS)
        loss_share = losses / losses.sum()
        gram_share, gram_row = gram_shares(deltas, param_groups)
        st, beta = state.copy(), self.params.beta
        if st.rounds_done == 0:
            st.loss_ref, st.gram_ref = float(losses.mean()), float(gram_row.mean())
        beta_loss = beta * float(losses.mean()) / st.loss_ref if st.loss_ref > 0 else beta
        beta_gram = beta * float(gram_row.mean()) / st.gram_ref if st.gram_ref > 0 else beta
        slots = assign_slots(st, round_.clients)
        weights, ratio = momentum_weights(st, slots, loss_share, gram_share, beta_loss, beta_gram)

        rates = drop_rates(losses, self.params.drop_rate)
        g, dropped, rescaled = fedpw_update(
            deltas, weights, rates, self.params.drop_rate, groups, statistic, drop=st.rounds_done > 0
        )
        st.rounds_done += 1
        scale = round_.step_scale
        new = theta.to(torch.float64) - scale * g
        metrics = {
            "fedpw-weights": [float(x) for x in weights],
            "fedpw-drop-rates": [float(x) for x in rates],
            "fedpw-dropped": dropped,
            "fedpw-rescaled": rescaled,
            "fedpw-loss-ratio": ratio,
            "fedpw-beta-loss": beta_loss,
            "fedpw-beta-gram": beta_gram,
            "update-norm": float(scale * g.norm()),
        }
        return Step(new.to(theta.dtype), st, metrics)


@register("fedpw")
class FedPW(FairStrategy):
    """FedPW (see the module docstring): ``FedPW(fraction_train=0.1, beta=0.3, drop_rate=0.3,
    num_clients=N)``."""

    method_class = FedPWMethod
    Params = Params

    def __init__(self, *, beta: float = Params.beta, drop_rate: float = Params.drop_rate,
                 params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedPW", beta=beta, drop_rate=drop_rate), **common)
