"""SCAFFOLD's client (Karimireddy et al., ICML 2020), option II.

Each local step uses the corrected gradient g − c_i + c (c: the server's control
variate, sent each round as the ArrayRecord ``scaffold-c``; c_i: this client's, kept in
its context state under ``scaffold-c-i``). After K steps of size η_l from θ_t to y_i:

    c_i⁺ = c_i − c + (θ_t − y_i) / (K · η_l)

The reply carries y_i (the model) and Δc_i = c_i⁺ − c_i (ArrayRecord ``scaffold-delta-c``);
the client stores c_i + Δc_i, the very float32 sum the server forms to mirror c_i, so the
server's copy stays bit-identical. A request that carries ``scaffold-c-i`` (the server
does so once per client after resuming from a checkpoint, when context states are gone)
sets c_i before training. Control variates cover the model's parameters; buffers (e.g.
BatchNorm statistics) keep zero entries. With momentum the (θ_t − y_i)/(K η_l) estimate
is no longer the mean gradient: SCAFFOLD assumes plain SGD. The record names are in
:mod:`fedcore.keys` (``SCAFFOLD_C``, ``SCAFFOLD_C_CLIENT``, ``SCAFFOLD_DELTA_C``). The correction
is one :class:`Correction` (on the loop by its ``add_to``, as rows by its ``stack``).

A foreign ClientApp runs this routine through ``client_app.client_app.train_reply(...)``, or
keeps its own training loop and adds it with ``client_app.foreign.ClientSide``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from client_app.methods import Parts, TrainJob, TrainOutcome, register_client_method
from fedcore import flat, keys


def control_update(c_i: torch.Tensor, c: torch.Tensor, theta: torch.Tensor, y: torch.Tensor,
                   num_steps: int, lr: float) -> torch.Tensor:
    """Option II: c_i⁺ = c_i − c + (θ_t − y_i) / (K · η_l)."""
    return c_i - c + (theta - y) / (num_steps * lr)


def parameter_mask(model: nn.Module, spec: flat.FlatSpec) -> torch.Tensor:
    """(d,) bool: which entries of the flat state-dict vector are trainable parameters."""
    names = {n for n, _ in model.named_parameters()}
    mask = torch.zeros(spec.dim, dtype=torch.bool)
    for key, (a, b) in zip(spec.keys, spec.offsets()):
        mask[a:b] = key in names
    return mask


@dataclasses.dataclass(frozen=True, eq=False)
class Correction:
    """c − c_i added to the gradient (cut into the model's parameters)."""

    per_parameter: list[torch.Tensor]  # c − c_i cut into the model's parameters

    @torch.no_grad()
    def add_to(self, model: nn.Module) -> None:
        """(see :class:`client_app.methods.GradientTerm`) grad += c − c_i, per parameter."""
        for p, corr in zip(model.parameters(), self.per_parameter):
            if p.grad is not None:
                p.grad.add_(corr)

    @staticmethod
    def stack(terms, rows, flat, params):
        """(see :class:`client_app.methods.GradientTerm`) A row without a correction: zeros."""
        corr = torch.stack([torch.zeros_like(params[0]) if t is None else flat(t.per_parameter) for t in terms])
        return lambda g, p, m: g + corr[:m]


def _flat_or_zeros(record, d: int) -> torch.Tensor:
    return flat.record_to_flat(record) if record is not None else torch.zeros(d)


@dataclasses.dataclass
class Setup:
    """A request's SCAFFOLD values: the flat layout, θ_t, c and c_i."""

    spec: flat.FlatSpec
    theta: torch.Tensor
    c: torch.Tensor
    c_i: torch.Tensor


def setup(job: TrainJob) -> Setup:
    spec = flat.spec_of(job.global_arrays)
    theta = flat.record_to_flat(job.global_arrays)
    c = _flat_or_zeros(job.request.get(keys.SCAFFOLD_C), spec.dim)
    c_i = _flat_or_zeros(job.request.get(keys.SCAFFOLD_C_CLIENT, job.state.get(keys.SCAFFOLD_C_CLIENT)), spec.dim)
    return Setup(spec, theta, c, c_i)


def correction_per_parameter(model: nn.Module, s: Setup) -> list[torch.Tensor]:
    """c − c_i cut into the model's parameters (named_parameters order)."""
    slices = dict(zip(s.spec.keys, s.spec.offsets()))
    corr = s.c - s.c_i
    dev = next(model.parameters()).device
    return [corr[slices[n][0]:slices[n][1]].reshape(p.shape).to(dev, p.dtype) for n, p in model.named_parameters()]


def finish(job: TrainJob, outcome: TrainOutcome, s: Setup) -> None:
    """c_i⁺ from the trained model; the reply's Δc_i and the node's stored c_i."""
    from flwr.app import ArrayRecord

    y = flat.record_to_flat(ArrayRecord(job.model.state_dict()))
    mask = parameter_mask(job.model, s.spec)
    c_new = torch.where(mask, control_update(s.c_i, s.c, s.theta, y, max(outcome.num_steps, 1), job.lr), 0.0)
    delta = c_new - s.c_i
    job.state[keys.SCAFFOLD_C_CLIENT] = flat.flat_to_record(s.c_i + delta, s.spec)
    outcome.records[keys.SCAFFOLD_DELTA_C] = flat.flat_to_record(delta, s.spec)


@register_client_method(keys.SCAFFOLD)
def scaffold(job: TrainJob) -> Parts:
    """The correction c − c_i; c_i⁺ and Δc_i from the trained model."""
    s = setup(job)
    return Parts(terms=(Correction(correction_per_parameter(job.model, s)),),
                 finish=lambda job, outcome, _trained: finish(job, outcome, s), needs_steps=True)
