"""CRAFT: closed-form, conflict-resolved aggregation, layer by layer (paper 002_*).

Per round t and per layer group q, with g_i = θ_t − θ_i restricted to the group (raw local
updates, not divided by the client learning rate):

1. Active clients: ‖g_i‖ > ``tol``. None active → zero update for the group; exactly one
   active → that client's raw update.
2. U = the active rows normalised to unit length; ρ = the clients' weights normalised to
   sum 1 over the active clients (data size n_i by default, or uniform).
3. ĝ = the previous round's aggregate of the group, normalised to unit length (zero in
   the first round, which makes that round the minimum-norm, ConFIG-like solution).
4. g = ĝ + U⁺ (ρ − U ĝ): the point of the affine set {x : U x = ρ} closest to ĝ, i.e. every
   client's update makes the prescribed angle with g (⟨u_i, g⟩ = ρ_i > 0: no client is
   in conflict with g when the system is feasible), with the previous direction kept as
   far as the constraints allow.
5. θ_{t+1} = θ_t − η_s g over the concatenated groups; the unscaled g is the next reference.

The maths follows the authors' released code (``tum-pbs/CRAFT``, ``fed/craft.py``). U⁺ is
applied through the m×m Gram system, U⁺ v = Uᵀ (U Uᵀ)⁺ v, never an SVD of the d×m matrix;
and the Gram of the *raw* rows gives everything else for free: the norms (its diagonal),
the Gram of the unit rows (D⁻¹ G D⁻¹), and the per-client inner products with the
plain average and with g that the diagnostics need. So each group costs three passes
over its (m × d_q) block (Gram, Δ ĝ, Δᵀ c) and no (m × d) temporary; the (m × d) update
matrix itself is written straight from the reply bytes into a buffer kept across rounds
(:func:`fedcore.flat.records_to_deltas`).

Layer groups (:func:`layer_groups`) come from the model's module structure when the
strategy is given the run's model (``Craft(model=net)``; this app passes it): a module's
weight and bias form one group, a GroupNorm/LayerNorm joins the convolution before it in
the same parent module, and every other tensor is its own group. Without a model (a
foreign app that did not pass one) the groups come from the ArrayRecord keys alone
(:func:`key_groups`): ``<module>.weight`` and ``<module>.bias`` together, every other
tensor alone — so a norm layer is then *not* merged with its convolution (it forms a group
of its own). ``craft-layerwise = false``: one group for the whole model.

Hyperparameters (``Params``; run-config keys):

* ``craft-step`` η_s > 0 — default 0.1 (the authors' ``utils/config.yaml``): the absolute
  step θ_{t+1} = θ_t − η_s g. Note g is scale-free (unit rows, Σρ = 1): η_s is a step
  length per group, not a multiple of the clients' step, so it is not ``server-lr``
  (which CRAFT refuses when non-zero: ``server-lr`` has one meaning, η_g/η_l, everywhere).
  The client learning rate and its decay do not enter CRAFT's step.
* ``craft-rho`` — ``data-size`` (default, ρ_i ∝ n_i as the authors) or ``uniform``.
* ``craft-layerwise`` — true (default) solves per layer group; false: one global group.
* ``craft-tol`` — ≥ 0, default 0: clients with a group update norm ≤ tol are inactive.

State (:class:`State`, checkpointed): the previous round's unscaled aggregate g (the
reference) and the round it was computed in.

Degenerate cases: one client (or one active client per group) gives that client's raw
update, so with one client per round and η_s = 1 CRAFT is the client's model; two
identical clients make U Uᵀ singular and the pseudo-inverse gives the least-squares
(minimum-norm) solution without NaN.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from flwr.app import MetricRecord

from fedcore import flat, keys
from fedcore.config import ConfigError
from fedcore.params import MethodParams, hyper
from strategies.base import FairStrategy, metric_column, reply_metrics
from strategies.registry import register

if TYPE_CHECKING:
    from torch import nn

RHO_CHOICES = ("data-size", "uniform")

# Diagnostics keys (MetricRecord of aggregate_train → rounds.jsonl "strategy")
ACTIVE = "craft-active"
CONFLICT_BEFORE = "craft-conflict-before"
CONFLICT_AFTER = "craft-conflict-after"


def tol_field() -> Any:
    """``craft-tol``: declared here once, shared by CRAFT's and ConFIG's ``Params``."""
    return hyper(0.0, low=0.0, key="craft-tol")


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """CRAFT's hyperparameters (see the module docstring)."""

    prefix = "craft"
    rho: str = hyper("data-size", choices=RHO_CHOICES)
    layerwise: bool = hyper(True)
    tol: float = tol_field()
    step: float = hyper(0.1, low=0.0, low_open=True)  # authors' utils/config.yaml


@dataclasses.dataclass
class State:
    """What CRAFT carries from one round to the next."""

    reference: torch.Tensor | None = None  # (d,) the previous round's unscaled aggregate g
    last_round: int = 0  # the round that computed it


# -- layer groups ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """Consecutive state tensors solved together, as a slice [start, stop) of the flat vector."""

    name: str
    keys: tuple[str, ...]
    start: int
    stop: int


def _norm_owners(model: nn.Module) -> dict[str, str]:
    """GroupNorm/LayerNorm module name → the convolution before it in the same parent."""
    from torch import nn

    owners: dict[str, str] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        previous_conv = None
        for child_name, child in module.named_children():
            name = f"{prefix}.{child_name}" if prefix else child_name
            if isinstance(child, nn.modules.conv._ConvNd):
                previous_conv = name
            elif isinstance(child, (nn.GroupNorm, nn.LayerNorm)) and previous_conv is not None:
                owners[name] = previous_conv
            walk(child, name)

    walk(model, "")
    return owners


def _merge_groups(keys: tuple[str, ...], sizes: tuple[int, ...], owners: dict[str, str]) -> list[LayerGroup]:
    """Adjacent tensors of one group merged: ``<module>.weight``/``.bias`` form the group of
    ``owners.get(module, module)``, every other tensor is a group of its own."""
    groups: list[LayerGroup] = []
    offset = 0
    for key, n in zip(keys, sizes):
        module, _, leaf = key.rpartition(".")
        group = owners.get(module, module) if leaf in ("weight", "bias") else key
        if groups and groups[-1].name == group:  # adjacent tensors of one group merge
            last = groups[-1]
            groups[-1] = LayerGroup(group, last.keys + (key,), last.start, offset + n)
        else:
            groups.append(LayerGroup(group, (key,), offset, offset + n))
        offset += n
    return groups


def layer_groups(model: nn.Module, keys: tuple[str, ...] | None = None) -> list[LayerGroup]:
    """CRAFT's layer groups of ``model`` as slices of its flat ``state_dict()`` vector.

    ``keys``, when given, is the ArrayRecord order of the run's model (``FlatSpec.keys``);
    it must equal the state-dict order, else the slices would not match the flat vector.
    """
    state = model.state_dict()
    if keys is not None and tuple(state) != tuple(keys):
        raise ValueError("CRAFT layer groups: the model's state_dict keys differ from the ArrayRecord's "
                         "(the run's model must be built from the same run config)")
    return _merge_groups(tuple(state), tuple(t.numel() for t in state.values()), _norm_owners(model))


def key_groups(keys: tuple[str, ...], sizes: tuple[int, ...]) -> list[LayerGroup]:
    """Layer groups from the ArrayRecord keys alone (no model at hand): a module's weight
    and bias together, every other tensor alone. Norm layers are *not* merged with their
    convolution here (that needs the module structure: :func:`layer_groups`)."""
    return _merge_groups(tuple(keys), tuple(sizes), {})


# -- one group ------------------------------------------------------------------------------
@dataclasses.dataclass
class GroupSolution:
    direction: torch.Tensor  # (d_q,) g for the group
    gram: torch.Tensor  # (m, m) float64 Gram of the raw rows Δ Δᵀ
    dots: torch.Tensor  # (m,) float64 ⟨Δ_i, g⟩ restricted to the group
    active: torch.Tensor  # (m,) bool


def pinv_solve(gram: torch.Tensor, rhs: torch.Tensor, rcond: float) -> torch.Tensor:
    """(gram)⁺ rhs for a symmetric PSD float64 matrix: eigenvalues ≤ rcond·λ_max are dropped."""
    w, v = torch.linalg.eigh(gram)
    keep = w > rcond * max(float(w.max()), 0.0)
    inv = torch.where(keep, 1.0 / torch.where(keep, w, torch.ones_like(w)), torch.zeros_like(w))
    return v @ (inv * (v.T @ rhs))


def unit_reference(reference: torch.Tensor | None) -> torch.Tensor | None:
    """ĝ = reference / ‖reference‖, or None for a missing or zero reference."""
    if reference is None or reference.numel() == 0:
        return None
    norm = torch.linalg.vector_norm(reference)
    return None if float(norm) <= 0.0 else reference / norm


def solve_group(
    updates: torch.Tensor,
    weights: torch.Tensor,
    reference: torch.Tensor | None = None,
    tol: float = 0.0,
) -> GroupSolution:
    """CRAFT for one group, with the m×m quantities the diagnostics reuse.

    ``updates`` (m, d_q) raw client updates (a strided column slice of the (m, d) matrix
    is fine: no copy is made); ``weights`` (m,) non-negative; ``reference`` (d_q,) or None.
    """
    m, d = updates.shape
    if bool((weights < 0).any()):
        raise ValueError("CRAFT client weights must be non-negative")
    gram = (updates @ updates.T).double()
    norms = gram.diagonal().clamp_min(0.0).sqrt()
    active = norms > tol
    coef = torch.zeros(m, dtype=torch.float64)  # g = ĝ + Σ_i coef_i Δ_i
    ref_dots = torch.zeros(m, dtype=torch.float64)  # ⟨Δ_i, ĝ⟩
    ref = None
    k = int(active.sum())
    if k == 0:
        return GroupSolution(updates.new_zeros(d), gram, ref_dots, active)
    if k == 1:
        coef[active] = 1.0  # the one active client's raw update (no reference)
    else:
        ref = unit_reference(reference)
        if ref is not None:
            ref = ref.to(updates.dtype)
            ref_dots = (updates @ ref).double()
        rho = weights.double()[active]
        rho = rho / rho.sum() if float(rho.sum()) > 0 else torch.full_like(rho, 1.0 / k)
        n_a = norms[active]
        unit_gram = gram[active][:, active] / torch.outer(n_a, n_a)
        residual = rho - ref_dots[active] / n_a  # ρ − U ĝ
        rcond = 10.0 * k * torch.finfo(updates.dtype).eps  # eigenvalues of U Uᵀ are σ²
        coef[active] = pinv_solve(unit_gram, residual, rcond) / n_a  # U⁺ v = Δᵀ D⁻¹ (UUᵀ)⁺ v
    direction = updates.T @ coef.to(updates.dtype)  # (faster than coef @ updates on a column slice)
    if ref is not None:
        direction += ref
    return GroupSolution(direction, gram, ref_dots + gram @ coef, active)


def craft_direction(
    updates: torch.Tensor,
    weights: torch.Tensor,
    reference: torch.Tensor | None = None,
    tol: float = 0.0,
) -> torch.Tensor:
    """g = ĝ + U⁺ (ρ − U ĝ) for one parameter group (see the module docstring).

    Parameters
    ----------
    updates : (m, d) raw client updates θ_t − θ_i.
    weights : (m,) non-negative; normalised to sum 1 over the active clients (all zero →
        uniform, as the authors).
    reference : (d,) previous aggregate or None; normalised here, None or zero → zero.
    tol : clients with update norm ≤ tol are inactive (default 0: only exact zeros).
    """
    return solve_group(updates, weights, reference, tol).direction


# -- all groups -------------------------------------------------------------------------------
@dataclasses.dataclass
class Aggregate:
    direction: torch.Tensor  # (d,) concatenated group directions
    dots: torch.Tensor  # (m,) ⟨Δ_i, g⟩ over the whole model
    avg_dots: torch.Tensor  # (m,) ⟨Δ_i, Σ_j ρ_j Δ_j⟩ over the whole model (plain average)
    active: torch.Tensor  # (m,) bool: non-zero update in at least one group

    def diagnostics(self) -> dict[str, float | int]:
        k = int(self.active.sum())

        def frac(dots: torch.Tensor) -> float:
            return float((dots[self.active] < 0).sum()) / k if k else 0.0

        return {ACTIVE: k, CONFLICT_BEFORE: frac(self.avg_dots), CONFLICT_AFTER: frac(self.dots)}


def aggregate_groups(
    updates: torch.Tensor,
    weights: torch.Tensor,
    groups: list[tuple[int, int]],
    reference: torch.Tensor | None = None,
    tol: float = 0.0,
    out: torch.Tensor | None = None,
) -> Aggregate:
    """CRAFT over consecutive groups [start, stop) covering the (m, d) update matrix."""
    m, d = updates.shape
    direction = updates.new_empty(d) if out is None else out
    dots = torch.zeros(m, dtype=torch.float64)
    gram_total = torch.zeros(m, m, dtype=torch.float64)
    active = torch.zeros(m, dtype=torch.bool)
    for start, stop in groups:
        ref = None if reference is None else reference[start:stop]
        sol = solve_group(updates[:, start:stop], weights, ref, tol)
        direction[start:stop] = sol.direction
        dots += sol.dots
        gram_total += sol.gram
        active |= sol.active
    w = weights.double().clamp_min(0.0)
    w = w / w.sum() if float(w.sum()) > 0 else torch.full_like(w, 1.0 / m)
    return Aggregate(direction, dots, gram_total @ w, active)


# -- strategies ---------------------------------------------------------------------------------
class GroupedStrategy(FairStrategy):
    """Shared plumbing of CRAFT and ConFIG: layer groups and the (m, d) update buffer.

    ``model`` (optional): the run's freshly built model, whose module structure gives the
    layer groups (:func:`layer_groups`); without it they come from the ArrayRecord keys
    (:func:`key_groups`).
    """

    app_arguments = ("model",)

    def __init__(self, *, model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self._groups: list[tuple[int, int]] | None = None
        self._buffer: torch.Tensor | None = None  # (m, d) updates, reused every round (scratch)

    @property
    def layerwise(self) -> bool:
        return False

    def groups(self) -> list[tuple[int, int]]:
        if self._groups is None:
            assert self.spec is not None
            if not self.layerwise:
                self._groups = [(0, self.spec.dim)]
            elif self.model is not None:
                self._groups = [(g.start, g.stop) for g in layer_groups(self.model, self.spec.keys)]
            else:
                self._groups = [(g.start, g.stop) for g in key_groups(self.spec.keys, self.spec.sizes)]
        return self._groups

    def deltas(self, replies) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(θ_t, Δ matrix, n_i): Δ_i = θ_t − θ_i written into a buffer kept across rounds."""
        replies = list(replies)
        theta = self.current_flat()
        if self._buffer is None or self._buffer.shape[0] < len(replies):
            self._buffer = torch.empty(len(replies), theta.numel(), dtype=theta.dtype)
        deltas = flat.records_to_deltas(theta, [r.content[keys.ARRAYS] for r in replies], out=self._buffer)
        return theta, deltas, metric_column(reply_metrics(replies), keys.NUM_EXAMPLES)


@register("craft")
class Craft(GroupedStrategy):
    """CRAFT (paper 002_*): θ_{t+1} = θ_t − η_s g, g per layer group, see the module docstring.

    ``Craft(fraction_train=0.1, step=0.1, rho="data-size", layerwise=True, tol=0.0,
    model=net)``; ``server_lr`` must stay 0 (the step is ``step``).
    """

    Params = Params
    State = State
    own_step = "set its absolute step with craft-step (default 0.1)"

    @property
    def layerwise(self) -> bool:
        return self.params.layerwise

    def aggregate_valid(self, server_round, replies):
        theta, deltas, sizes = self.deltas(replies)
        weights = sizes if self.params.rho == "data-size" else torch.ones_like(sizes)
        agg = aggregate_groups(deltas, weights, self.groups(), self.state.reference, self.params.tol)
        self.state.reference, self.state.last_round = agg.direction, int(server_round)
        theta.sub_(agg.direction, alpha=self.params.step)
        metrics = {**agg.diagnostics(), "update-norm": float(torch.linalg.vector_norm(agg.direction))}
        return self.to_record(theta), MetricRecord(metrics)
