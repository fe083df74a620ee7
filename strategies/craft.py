"""CRAFT: closed-form, conflict-resolved aggregation, layer by layer (paper 002_*).

Paper: Z. Wang, Q. Liu et al. (code ``tum-pbs/CRAFT``), *CRAFT:
Conflict-Resolved Aggregation for Federated Training*, 2026 (the text this project works from
names no venue).

``tests/test_algorithms.py`` checks this module against the round as the paper writes it
(per group, ``torch.linalg.pinv`` as the authors call it: ``tests/oracles.py``).

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
and the Gram of the *raw* rows, taken together with the reference row, gives everything
else for free: the norms (its diagonal), the Gram of the unit rows (D⁻¹ G D⁻¹), U ĝ, the
per-client inner products with the plain average and with g that the diagnostics need,
and ‖g‖. So each group costs two reads of its (m × d_q) block — the Gram and g = ĝ + Δᵀ c,
written in place over the reference — and no (m × d) temporary; the update matrix itself
is written straight from the reply bytes into a buffer kept across rounds
(:func:`fedcore.flat.records_to_deltas`), next to the reference: :class:`UpdateMatrix`, the
kernel both CRAFT and ConFIG call.

The pseudo-inverse drops what ``torch.linalg.pinv(U)`` drops with its default cutoff, as
the authors call it: singular values σ ≤ max(k, d_q)·eps·σ_max of the k × d_q unit rows
(:func:`pinv_cutoff`; eps of the updates' dtype).

Layer groups (:func:`layer_groups`) come from the model's module structure when the
strategy is given the run's model (``Craft(model=net)``; this app passes it): a module's
weight and bias form one group, a GroupNorm/LayerNorm joins the convolution before it in
the same parent module, and every other tensor is its own group. Without a model (a
foreign app that did not pass one) the groups come from the ArrayRecord keys alone
(:func:`key_groups`): ``<module>.weight`` and ``<module>.bias`` together, every other
tensor alone — so a norm layer is then *not* merged with its convolution (it forms a group
of its own). ``craft-layerwise = false``: one group for the whole model.

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

import numpy as np
import torch

from fedcore import flat
from fedcore.config import Grid
from fedcore.internals import ConvBase
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Round, Step
from strategies.flower import FairStrategy, method_params
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
    return hyper(0.0, low=0.0, key="craft-tol", doc="clients with a (group) update norm <= tol are inactive")


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """CRAFT's hyperparameters (see the module docstring)."""

    prefix = "craft"
    rho: str = hyper("data-size", choices=RHO_CHOICES,
                     doc="the clients' weights ρ: data-size (ρ_i ∝ n_i, as the authors) or uniform")
    layerwise: bool = hyper(True, doc="solve per layer group (true) or over one global group (false)")
    tol: float = tol_field()
    step: float = hyper(0.1, low=0.0, low_open=True, grid=Grid((0.03, 0.1, 0.3), 1e-3, 10.0),
                        doc="η_s, the absolute step θ_{t+1} = θ_t − η_s g (the authors' utils/config.yaml); g is "
                            "scale-free (unit rows, Σρ = 1), so η_s is a step length per group, not server-lr "
                            "(which CRAFT refuses when non-zero); the clients' lr does not enter it")


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
            if isinstance(child, ConvBase):
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


# -- the Gram matrices ----------------------------------------------------------------------
F64_GRAM_MAX = 1 << 16  # groups of at most this many parameters get their Gram in float64


def group_grams(rows: torch.Tensor, groups: list[tuple[int, int]],
                spare: torch.Tensor | None = None) -> list[np.ndarray]:
    """The Gram matrix rows[:, a:b] rows[:, a:b]ᵀ of every group, as float64 numpy arrays.

    One read of each (n × d_q) block and nothing written but n × n numbers: on the CPU numpy's
    ``A @ A.T``, which BLAS computes as a symmetric rank-k update (syrk, half the products;
    MKL's sgemm through torch was slower for these shapes: docs/performance.md, rule 5); on
    another device torch
    (:func:`device_grams`). Groups of at most :data:`F64_GRAM_MAX` parameters are multiplied
    in float64: there the pseudo-inverse's cutoff (:func:`pinv_cutoff`) is far below what a
    float32 Gram resolves, and it costs nothing; larger groups in their own dtype (there the
    cutoff is above the float32 Gram's rounding).

    ``spare``: a view of the same buffer that starts with ``rows`` and has one row more
    (finite values). OpenBLAS's syrk is slower for n ≡ 3 (mod 4) rows than for n + 1
    (docs/performance.md, rule 5), so such an n is multiplied with the spare row and the result
    cut to n × n.
    """
    if rows.device.type != "cpu":
        return device_grams(rows, groups)
    n = rows.shape[0]
    wide = spare if spare is not None and n % 4 == 3 and spare.shape[0] == n + 1 else rows
    out = []
    for a, b in groups:
        x = wide[:, a:b].numpy()
        if x.dtype != np.float64 and b - a <= F64_GRAM_MAX:
            x = x.astype(np.float64)
        out.append(np.asarray((x @ x.T)[:n, :n], dtype=np.float64))
    return out


def device_grams(rows: torch.Tensor, groups: list[tuple[int, int]],
                 spare: torch.Tensor | None = None) -> list[np.ndarray]:
    """:func:`group_grams` with torch on ``rows``' device (any device: a test runs it on the
    CPU); the matrices come back to the host in one transfer. ``spare`` is not needed here."""
    grams = []
    for a, b in groups:
        x = rows[:, a:b]
        if x.dtype != torch.float64 and b - a <= F64_GRAM_MAX:
            x = x.double()
        grams.append((x @ x.T).double())
    return list(torch.stack(grams).cpu().numpy())


# -- one group ------------------------------------------------------------------------------
def pinv_cutoff(k: int, d_q: int, dtype: torch.dtype) -> float:
    """Relative cutoff on the eigenvalues of U Uᵀ that gives ``torch.linalg.pinv(U)``'s default.

    The authors compute U⁺ with ``torch.linalg.pinv(U)`` (U: k × d_q unit rows in the updates'
    dtype), which drops singular values σ ≤ max(k, d_q)·eps·σ_max. The eigenvalues of U Uᵀ
    are σ², so the same cut is λ ≤ (max(k, d_q)·eps)²·λ_max. For a float32 layer of
    524,288 parameters that drops every direction with σ below 6 % of σ_max.
    """
    return (max(k, d_q) * torch.finfo(dtype).eps) ** 2


def pinv_solve(gram: torch.Tensor, rhs: torch.Tensor, rcond: float) -> torch.Tensor:
    """(gram)⁺ rhs for a symmetric PSD float64 matrix: eigenvalues ≤ rcond·λ_max are dropped."""
    w, v = torch.linalg.eigh(gram)
    keep = w > rcond * max(float(w.max()), 0.0)
    inv = torch.where(keep, 1.0 / torch.where(keep, w, torch.ones_like(w)), torch.zeros_like(w))
    return v @ (inv * (v.T @ rhs))


@dataclasses.dataclass
class GroupSolution:
    """One group's g = ``ref_coef``·reference + Σ_i ``coef_i`` Δ_i, and what the diagnostics need."""

    coef: torch.Tensor  # (m,) float64
    ref_coef: float  # 1/‖reference‖ of the group, 0 when the reference is not used
    gram: torch.Tensor  # (m, m) float64 Gram of the raw rows Δ Δᵀ
    dots: torch.Tensor  # (m,) float64 ⟨Δ_i, g⟩ restricted to the group
    active: torch.Tensor  # (m,) bool
    sq_norm: float  # ‖g‖² of the group


def solve_gram(ext: np.ndarray, has_ref: bool, weights: torch.Tensor, tol: float, d_q: int,
               dtype: torch.dtype) -> GroupSolution:
    """CRAFT for one group from the Gram matrix of its rows: (reference, Δ_1, …, Δ_m) when
    ``has_ref``, else (Δ_1, …, Δ_m). No pass over the group's parameters: the norms are the
    diagonal, the unit-row Gram is D⁻¹ G D⁻¹, ⟨Δ_i, ĝ⟩ is G_{i,ref}/‖ref‖, and
    U⁺ v = Δᵀ D⁻¹ (U Uᵀ)⁺ v gives the coefficients of g in the rows."""
    ext = torch.as_tensor(ext, dtype=torch.float64)
    r = int(has_ref)
    gram = ext[r:, r:]
    m = gram.shape[0]
    if bool((weights < 0).any()):
        raise ValueError("CRAFT client weights must be non-negative")
    norms = gram.diagonal().clamp_min(0.0).sqrt()
    active = norms > tol
    coef = torch.zeros(m, dtype=torch.float64)
    ref_coef = 0.0
    ref_dots = torch.zeros(m, dtype=torch.float64)  # ⟨Δ_i, ĝ⟩
    k = int(active.sum())
    if k == 1:
        coef[active] = 1.0  # the one active client's raw update (no reference)
    elif k > 1:
        ref_sq = float(ext[0, 0]) if has_ref else 0.0
        if ref_sq > 0.0:
            ref_coef = 1.0 / float(np.sqrt(ref_sq))
            ref_dots = ext[r:, 0] * ref_coef
        rho = weights.double()[active]
        rho = rho / rho.sum() if float(rho.sum()) > 0 else torch.full_like(rho, 1.0 / k)
        n_a = norms[active]
        unit_gram = gram[active][:, active] / torch.outer(n_a, n_a)
        residual = rho - ref_dots[active] / n_a  # ρ − U ĝ
        coef[active] = pinv_solve(unit_gram, residual, pinv_cutoff(k, d_q, dtype)) / n_a
    full = torch.cat([torch.tensor([ref_coef], dtype=torch.float64), coef]) if has_ref else coef
    g_dots = ext @ full  # ⟨row, g⟩ for every row
    return GroupSolution(coef, ref_coef, gram, g_dots[r:], active, max(float(full @ g_dots), 0.0))


def _write_direction(rows: torch.Tensor, has_ref: bool, sol: GroupSolution, out: torch.Tensor, a: int, b: int) -> None:
    """out[a:b] = ref_coef·reference + Δᵀ coef over the group's columns: one read of the block.
    With the reference, ``out`` is its row ``rows[0]`` (read before written, by the same BLAS call)."""
    r = int(has_ref)
    block, dst = rows[r:, a:b], out[a:b]
    coef = sol.coef.to(device=rows.device, dtype=rows.dtype)
    if sol.ref_coef == 0.0:
        torch.mv(block.T, coef, out=dst)  # no reference (or not used): β = 0, not read
    else:
        dst.addmv_(block.T, coef, beta=sol.ref_coef)


# -- all groups -------------------------------------------------------------------------------
@dataclasses.dataclass
class Aggregate:
    direction: torch.Tensor  # (d,) concatenated group directions
    dots: torch.Tensor  # (m,) ⟨Δ_i, g⟩ over the whole model
    avg_dots: torch.Tensor  # (m,) ⟨Δ_i, Σ_j ρ_j Δ_j⟩ over the whole model (plain average)
    active: torch.Tensor  # (m,) bool: non-zero update in at least one group
    norm: float  # ‖g‖ (from the Gram matrices: no pass over g)
    groups: list[GroupSolution]

    def diagnostics(self) -> dict[str, float | int]:
        k = int(self.active.sum())

        def frac(dots: torch.Tensor) -> float:
            return float((dots[self.active] < 0).sum()) / k if k else 0.0

        return {ACTIVE: k, CONFLICT_BEFORE: frac(self.avg_dots), CONFLICT_AFTER: frac(self.dots)}


class UpdateMatrix:
    """CRAFT's kernel: the update matrix, kept across rounds on one device, and the solve over it.

    One (1 + m + 1, d) buffer: row 0 the reference ĝ, replaced group by group by the new
    direction g (the next round's reference, without a copy), rows 1 … m the updates Δ_i
    (:meth:`updates`: the caller writes them straight from the reply bytes), then a spare
    row (finite) for :func:`group_grams`. Per group one Gram of the reference and the
    updates gives the norms, the Gram of the updates and their products with the reference,
    so each group costs one read of its block for the Gram and one for the direction.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.rows: torch.Tensor | None = None

    def updates(self, m: int, d: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The (m, d) rows for this round's updates."""
        if self.rows is None or self.rows.shape[0] < 2 + m or self.rows.shape[1] != d or self.rows.dtype != dtype:
            self.rows = torch.empty(2 + m, d, dtype=dtype, device=self.device)
            self.rows[1 + m :].zero_()  # the spare row: finite (zeros, later an older Δ)
        return self.rows[1 : 1 + m]

    def solve(self, updates: torch.Tensor, weights: torch.Tensor, groups: list[tuple[int, int]],
              reference: torch.Tensor | None = None, tol: float = 0.0) -> Aggregate:
        """CRAFT over consecutive groups [start, stop) covering the (m, d) ``updates``, with the
        previous direction ``reference`` (d,) or None; ``weights`` (m,) ≥ 0 (all 0: uniform);
        clients with a group update norm ≤ ``tol`` are inactive there. ``updates`` are the rows
        :meth:`updates` gave (any other tensor is copied into them first). The direction is
        written into row 0, over the reference."""
        m = updates.shape[0]
        rows = self.updates(m, updates.shape[1], updates.dtype)
        if updates.data_ptr() != rows.data_ptr() or updates.device != rows.device:
            rows.copy_(updates)
        rows = self.rows[: 1 + m]
        has_ref = reference is not None
        if has_ref and (reference.device != rows.device or reference.data_ptr() != rows[0].data_ptr()):
            rows[0].copy_(reference)  # a restored state (host memory), or the buffer grew for more replies
        ext, spare = (rows, self.rows[: 2 + m]) if has_ref else (rows[1:], self.rows[1 : 2 + m])
        sols = [solve_gram(gram, has_ref, weights, tol, b - a, rows.dtype)
                for gram, (a, b) in zip(group_grams(ext, groups, spare), groups)]
        for sol, (a, b) in zip(sols, groups):
            _write_direction(ext, has_ref, sol, rows[0], a, b)
        w = weights.double().clamp_min(0.0)
        w = w / w.sum() if float(w.sum()) > 0 else torch.full_like(w, 1.0 / m)
        gram_total = sum(s.gram for s in sols)
        active = torch.stack([s.active for s in sols]).any(0)
        return Aggregate(rows[0], sum(s.dots for s in sols), gram_total @ w, active,
                         float(np.sqrt(sum(s.sq_norm for s in sols))), sols)


# -- methods ------------------------------------------------------------------------------------
class GroupedMethod(Method):
    """Shared plumbing of CRAFT and ConFIG: layer groups and the update matrix.

    The layer groups come from the run's model (``setting.model``: :func:`layer_groups`), else
    from the ArrayRecord keys (:func:`key_groups`). :attr:`matrix` (:class:`UpdateMatrix`, on the
    setting's device) holds the round's updates Δ_i = θ_t − θ_i, written straight from the reply
    bytes through the kept :class:`fedcore.flat.UpdateWriter` (scratch kept across rounds, not state).
    """

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self._groups: list[tuple[int, int]] | None = None
        self.matrix = UpdateMatrix(self.setting.device)
        self.writer = flat.UpdateWriter()  # θ_t's host vector and the staging row, reused every round

    @property
    def layerwise(self) -> bool:
        return False

    def groups(self, spec: flat.FlatSpec) -> list[tuple[int, int]]:
        if self._groups is None:
            if not self.layerwise:
                self._groups = [(0, spec.dim)]
            elif self.setting.model is not None:
                self._groups = [(g.start, g.stop) for g in layer_groups(self.setting.model, spec.keys)]
            else:
                self._groups = [(g.start, g.stop) for g in key_groups(spec.keys, spec.sizes)]
        return self._groups

    def read_rows(self, round_: Round) -> tuple[torch.Tensor, torch.Tensor]:
        """(θ_t on the host, the (m, d) updates Δ_i in :attr:`matrix`): one pass over the reply bytes."""
        updates = self.matrix.updates(len(round_), round_.spec.dim)
        theta, _ = round_.write_updates(updates, self.writer)
        return theta, updates


def step_from(theta: torch.Tensor, direction: torch.Tensor, alpha: float) -> torch.Tensor:
    """θ_t − alpha·direction (θ_t is the writer's host buffer, stepped in place)."""
    return theta.sub_(direction.to(theta.device), alpha=alpha)


class CraftMethod(GroupedMethod):
    """CRAFT (paper 002_*): θ_{t+1} = θ_t − η_s g, g per layer group, see the module docstring."""

    Params = Params
    weighting = "data-size"  # or uniform: craft-rho (resolve_weighting)
    own_step = "set its absolute step with craft-step (default 0.1)"

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return cls.Params.from_run_config(config).rho

    @property
    def layerwise(self) -> bool:
        return self.params.layerwise

    def init(self) -> State:
        return State()

    def aggregate(self, round_: Round, state: State) -> Step:
        theta, updates = self.read_rows(round_)
        sizes = round_.num_examples
        weights = sizes if self.params.rho == "data-size" else torch.ones_like(sizes)
        agg = self.matrix.solve(updates, weights, self.groups(round_.spec), state.reference, self.params.tol)
        metrics = {**agg.diagnostics(), "update-norm": agg.norm}
        # the next reference is a copy: the direction lives in the kernel's rows, which the next round overwrites
        new_state = State(agg.direction.clone(), int(round_.number))
        return Step(step_from(theta, agg.direction, self.params.step), new_state, metrics)


@register("craft")
class Craft(FairStrategy):
    """CRAFT (see the module docstring)::

        Craft(fraction_train=0.1, step=0.1, rho="data-size", layerwise=True, tol=0.0, model=net)

    ``model``: the run's model, whose module structure gives the layer groups (without it, the
    array names do); ``server_lr`` must stay 0 (the step is ``step``)."""

    method_class = CraftMethod
    Params = Params

    def __init__(self, *, rho: str = Params.rho, layerwise: bool = Params.layerwise, tol: float = Params.tol,
                 step: float = Params.step, params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "Craft", rho=rho, layerwise=layerwise, tol=tol, step=step),
                         **common)
