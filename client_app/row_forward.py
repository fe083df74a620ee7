"""How a model runs as rows: one forward of every client's parameters at once.

A round's clients are *rows* of stacked parameters (:mod:`client_app.vectorised` trains
them); here is the forward they share: ``torch.func.vmap`` over ``functional_call`` of a copy
of the run's model (batched matmuls; a convolution becomes one grouped convolution, or where
:data:`UNROLLED_CONVOLUTIONS` says, a loop over the rows inside the one batched step), a linear
chain's forward and backward written out by hand, dropout taking each row's noise from outside
and BatchNorm normalising each row over its real examples only (the padding never enters its
statistics, which it hands out for the trainer to update the running ones). Also what decides
whether a model has a row form at all (:func:`covers_model`, :func:`model_info`) and the device
kind the device-dependent choices go by (:func:`device_kind`).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import weakref
from collections.abc import Callable

import torch
from torch import nn

from client_app.methods import NotCovered
from fedcore.internals import BatchNormBase, ConvBase, DropoutBase, threshold_backward

# device kinds whose rows run convolutions row by row inside the batched step, not as one
# grouped convolution (the CPU: measured faster; docs/performance.md §7)
UNROLLED_CONVOLUTIONS = ("cpu",)


class _MaskedDropout(nn.Module):
    """A dropout whose noise (``Bernoulli(1 − p) / (1 − p)``, drawn outside) is set per call."""

    def __init__(self) -> None:
        super().__init__()
        self.noise: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.noise


class _RowBatchNorm(nn.Module):
    """A BatchNorm in training mode over a row's real examples only (``real``: 1 for an example,
    0 for padding, set per call), written out: batch mean and biased variance over the examples
    and positions, then the affine map. Its batch statistics (the mean and the unbiased variance
    the module's running statistics take) are handed out in ``stats``;
    :func:`client_app.vectorised._update_running` updates the rows' running statistics from
    them, as the module does in the loop's forward."""

    def __init__(self, bn: BatchNormBase, at: tuple[int, int, int] | None) -> None:
        super().__init__()
        self.eps, self.momentum = bn.eps, bn.momentum
        self.at = at  # where running_mean, running_var, num_batches_tracked are in the buffers; None: not tracked
        self.weight, self.bias = bn.weight, bn.bias  # the same parameter names as the module's
        self.real: torch.Tensor | None = None
        self.stats: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        real = self.real if self.real is not None else x.new_ones(n)
        w = real.view(n, *[1] * (x.dim() - 1))
        count = (real.sum() * x[0, 0].numel()).clamp_min(1)  # real examples × positions per channel
        mean = (x * w).sum(dims) / count
        xc = x - mean.view(shape)
        var = (xc * xc * w).sum(dims) / count
        out = xc * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        self.stats = (mean.detach(), (var * count / (count - 1)).detach())
        return out


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the rows need to know of a model object (its layout), worked out once per object."""

    layout: tuple  # (type, (name, shape) of each parameter, device)
    uncovered: str | None  # why it has no row form, or None
    has_dropout: bool
    has_norms: bool  # a BatchNorm (batches of one example are the loop's)
    device: torch.device  # where its parameters are
    # its parameter objects in order (training writes them in place; a ``.data`` rebound keeps the object)
    parameters: tuple = ()


_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_info(model: nn.Module) -> ModelInfo:
    """(cached per model object: the ClientApp reuses its model objects across messages)"""
    info = _INFO.get(model)
    if info is None:
        dev = next(model.parameters()).device
        info = ModelInfo(layout=(type(model), tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
                                 str(dev)),
                         uncovered=covers_model(model), has_dropout=bool(dropout_modules(model)),
                         has_norms=bool(norm_modules(model)), device=dev, parameters=tuple(model.parameters()))
        _INFO[model] = info
    return info


def device_kind(model: nn.Module) -> str:
    """The device type (``cpu``, ``cuda``) the rows' device-dependent choices go by: how
    convolutions are batched (:func:`unrolled_on`), how dropout noise is drawn
    (:func:`client_app.vectorised.dropout_noise`), which models ``auto`` trains as rows
    (:data:`client_app.vectorised.AUTO_MODELS`). One place, so that a test can take the CUDA
    choices with the tensors on the CPU."""
    return next(model.parameters()).device.type


def dropout_modules(model: nn.Module) -> list[tuple[str, nn.Dropout]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]


_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def norm_modules(model: nn.Module) -> list[tuple[str, BatchNormBase]]:
    return [(n, m) for n, m in model.named_modules() if type(m) in _NORMS]


def covers_model(model: nn.Module) -> str | None:
    """None if ``model`` trains as rows here, else why not."""
    name = type(model).__name__
    if any(isinstance(m, BatchNormBase) and type(m) not in _NORMS for m in model.modules()):
        return f"{name} has a BatchNorm variant without a row form"
    running = {f"{n}.{b}" if n else b for n, m in norm_modules(model) for b, _ in m.named_buffers(recurse=False)}
    others = [n for n, _ in model.named_buffers() if n not in running]
    if others:
        return f"{name} has buffers other than BatchNorm's running statistics ({others[0]})"
    if any(isinstance(m, (DropoutBase,)) and not isinstance(m, nn.Dropout)
           for m in model.modules()):
        return f"{name} has a dropout variant without a row form"
    if dropout_modules(model) and device_kind(model) not in ("cpu", "cuda"):
        return f"{name}'s dropout draws from the {device_kind(model)} generator (no row form)"
    return None


def unrolled_on(model: nn.Module) -> bool:
    """Convolutions where :data:`UNROLLED_CONVOLUTIONS` says (the CPU): vmap makes them one
    grouped convolution, measured 1.5x slower there than the rows' convolutions one by one
    (docs/performance.md); there the rows' forward is a loop over rows inside the one batched
    step (one backward, one update of all rows). Elsewhere (CUDA) the grouped convolution."""
    return device_kind(model) in UNROLLED_CONVOLUTIONS and any(isinstance(m, ConvBase)
                                                               for m in model.modules())


def _replace(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, attr, module)


class Forward:
    """vmap(functional_call(model)) over stacked parameters, dropout noise and real-example
    weights (BatchNorm's); for convolutions where :func:`unrolled_on`, functional_call row by
    row. A call gives the rows' logits and each BatchNorm's batch statistics."""

    def __init__(self, model: nn.Module) -> None:
        self.template = copy.deepcopy(model)
        self.template.train()
        names = [n for n, _ in self.template.named_parameters()]
        self.drops: list[_MaskedDropout] = []
        for name, _ in dropout_modules(self.template):
            masked = _MaskedDropout()
            _replace(self.template, name, masked)
            self.drops.append(masked)
        buffers = [n for n, _ in model.named_buffers()]
        self.norms: list[_RowBatchNorm] = []
        for name, bn in norm_modules(self.template):
            at = tuple(buffers.index(f"{name}.{b}") for b in ("running_mean", "running_var", "num_batches_tracked")) \
                if bn.track_running_stats else None
            row_bn = _RowBatchNorm(bn, at)
            _replace(self.template, name, row_bn)
            self.norms.append(row_bn)
        self.names = [n for n, _ in self.template.named_parameters()]
        if self.names != names:
            raise NotCovered("the model's parameters moved when its modules took their row form")
        for p in self.template.parameters():
            p.requires_grad_(False)

        def one(params, x, noise, real):
            for m, z in zip(self.drops, noise):
                m.noise = z
            for m in self.norms:
                m.real = real
            try:
                out = torch.func.functional_call(self.template, dict(zip(self.names, params)), (x,))
                return out, [m.stats for m in self.norms]
            finally:
                for m in self.norms:
                    m.real = m.stats = None

        if unrolled_on(model):
            def rows(params, x, noise, real):
                outs = [one([p[b] for p in params], x[b], [z[b] for z in noise], real[b]) for b in range(x.shape[0])]
                stats = [tuple(torch.stack(s) for s in zip(*(st[j] for _, st in outs))) for j in range(len(self.norms))]
                return torch.stack([o for o, _ in outs]), stats

            self.fn = rows
        else:
            self.fn = torch.func.vmap(one, in_dims=(0, 0, 0, 0))

        # flatten → (Linear → ReLU)* → Linear (mlp, craft-mlp, logreg): batched matmuls written
        # out, without vmap's per-operation cost; checked against the model on the first batch
        linears = [m for m in self.template.modules() if isinstance(m, nn.Linear)]
        chain = [p for m in linears for p in ((m.weight,) if m.bias is None else (m.weight, m.bias))]
        self.chain: bool | None = None if (not self.drops and [id(p) for p in self.template.parameters()]
                                           == [id(p) for p in chain]) else False
        self.layers = [m.bias is not None for m in linears]

    def _chain(self, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], x.shape[1], -1)
        at = 0
        for i, has_bias in enumerate(self.layers):
            wt = params[at].transpose(1, 2)
            h = torch.baddbmm(params[at + 1].unsqueeze(1), h, wt) if has_bias else torch.bmm(h, wt)
            at += 2 if has_bias else 1
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h

    def is_chain(self, params: list[torch.Tensor], x: torch.Tensor) -> bool:
        """Is the model the linear chain? (one comparison on the first batch, then remembered)"""
        if self.chain is None:
            with torch.no_grad():
                probe = [p[:1].detach() for p in params]
                want = self.fn(probe, x[:1], [], x.new_ones(x.shape[:2])[:1])[0]
                got = self._chain(probe, x[:1])
            self.chain = want.shape == got.shape and bool(torch.allclose(want, got, rtol=1e-4, atol=1e-5))
        return self.chain

    @torch.no_grad()
    def chain_grads(self, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    coefficient: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The chain's per-example cross-entropy (rows, batch) and the gradient of
        Σ coefficient(ce)·ce with respect to every row's parameters, (rows, numel) per parameter
        in parameter order, by hand (softmax − one-hot, then the matmuls' transposes): the
        backward autograd would run, without its per-operation bookkeeping."""
        h = x.reshape(x.shape[0], x.shape[1], -1)
        inputs = []
        at = 0
        for i, has_bias in enumerate(self.layers):
            inputs.append(h)
            wt = params[at].transpose(1, 2)
            h = torch.baddbmm(params[at + 1].unsqueeze(1), h, wt) if has_bias else torch.bmm(h, wt)
            at += 2 if has_bias else 1
            if i < len(self.layers) - 1:
                h = h.relu_()  # in place: the next layer's input, > 0 exactly where the ReLU passes its gradient
        logp = torch.log_softmax(h, 2)
        at_y = y.unsqueeze(2)
        ce = -logp.gather(2, at_y).squeeze(2)
        c = coefficient(ce)  # (rows, batch): d total / d ce
        dz = logp.exp_()
        dz.scatter_add_(2, at_y, torch.full_like(ce, -1.0).unsqueeze(2))
        dz.mul_(c.unsqueeze(2))
        grads: list[torch.Tensor] = []
        rows = dz.shape[0]
        for i in range(len(self.layers) - 1, -1, -1):
            at -= 2 if self.layers[i] else 1
            part = [torch.bmm(dz.transpose(1, 2), inputs[i]).reshape(rows, -1)]
            if self.layers[i]:
                part.append(dz.sum(1))
            grads[:0] = part
            if i:
                # the ReLU's backward, as autograd's: the gradient where the layer's output is > 0, else 0
                dz = threshold_backward(torch.bmm(dz, params[at]), inputs[i], 0)
        return ce, grads

    def __call__(self, params: list[torch.Tensor], x: torch.Tensor, noise: list[torch.Tensor],
                 real: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The rows' logits (rows, batch, classes) and each BatchNorm's (mean, unbiased variance)
        of the rows' real examples, (rows, channels) each; ``real`` (rows, batch): 1 for an
        example, 0 for padding."""
        if self.is_chain(params, x):
            return self._chain(params, x), []
        try:
            return self.fn(params, x, noise, real)
        finally:
            for m in self.drops:
                m.noise = None

    def dropout_shapes(self, sample: torch.Tensor) -> list[tuple[int, ...]]:
        """The feature shape each dropout module sees (one forward of one example)."""
        shapes: list[tuple[int, ...]] = []
        hooks = [m.register_forward_hook(lambda _m, inp, _o: shapes.append(tuple(inp[0].shape[1:])))
                 for m in self.drops]
        try:
            for m in self.drops:
                m.noise = torch.ones((), device=sample.device, dtype=sample.dtype)
            with torch.no_grad():
                self.template(sample[:1])
        finally:
            for h in hooks:
                h.remove()
            for m in self.drops:
                m.noise = None
        return shapes


_FORWARDS: dict[tuple, Forward] = {}  # per model layout and device: the parameters are the rows'


def forward_for(model: nn.Module) -> Forward:
    key = (model_info(model).layout, threading.get_ident())
    if key not in _FORWARDS:
        if len(_FORWARDS) > 8:
            _FORWARDS.clear()
        _FORWARDS[key] = Forward(model)
    return _FORWARDS[key]
