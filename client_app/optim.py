"""``torch.optim.SGD``'s update, written out: the same kernels in the same order, without
``torch._dynamo``.

Every ``torch.optim`` optimizer's ``step`` (and ``state_dict``, ``zero_grad`` in some versions)
is wrapped by torch in ``_use_grad_for_differentiable`` / ``torch._disable_dynamo``, which import
``torch._dynamo`` at the first call: with PyPI's torch 2.14.1 that pulls sympy, triton and
torch's compiler stack into every process that takes one SGD step (its memory and CPU:
docs/performance.md, rule 8). A SuperNode starts a fresh ClientApp process for every message (Flower 1.42), so every
train message paid it. torch has no supported switch that keeps the wrapper from importing it
(``torch._disable_dynamo`` imports ``torch._dynamo`` to build the disabled function), hence this
module.

:class:`SGD` takes ``torch.optim.SGD``'s arguments for what this app uses (lr, momentum,
dampening, weight decay, nesterov; no ``maximize``, ``differentiable``, ``fused``, tensor lr) and
computes each step exactly as ``torch.optim.sgd`` does with its defaults (``foreach=None``,
``fused=None``): the per-tensor path (``_single_tensor_sgd``) for parameters on the CPU (and any
device outside ``torch.utils._foreach_utils._get_foreach_kernels_supported_devices()``), the
multi-tensor path (``_multi_tensor_sgd``: ``torch._foreach_*`` kernels) on CUDA, the same
operations with the same operands, so the parameters and momentum buffers are bit for bit
``torch.optim.SGD``'s (``tests/test_lean_client.py`` checks both against it step by step).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# torch.optim's defaults pick the multi-tensor path (torch._foreach_* kernels) for parameters on
# the device types foreach_device names; the rest, the CPU among them, take the per-tensor path
from fedcore.internals import foreach_add, foreach_add_, foreach_device, foreach_mul_


class SGD:
    """``torch.optim.SGD(params, lr, momentum, dampening, weight_decay, nesterov)`` for one
    parameter group: :meth:`zero_grad` and :meth:`step` as torch's, the momentum buffers in
    :attr:`state` (``state[p]["momentum_buffer"]``, as ``torch.optim.SGD.state``)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        if isinstance(lr, torch.Tensor):
            raise TypeError("client_app.optim.SGD takes a float learning rate (torch.optim.SGD for a tensor one)")
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.lr, self.momentum, self.dampening = float(lr), float(momentum), float(dampening)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        # as torch.optim's optimizers read it (e.g. a caller's ``param_groups[0]["lr"]``)
        self.param_groups = [{"params": self.params, "lr": self.lr, "momentum": self.momentum,
                              "dampening": self.dampening, "weight_decay": self.weight_decay,
                              "nesterov": self.nesterov}]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``Optimizer.zero_grad``: every parameter's gradient to None (or zeroed in place)."""
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One SGD step of every parameter that has a gradient (``torch.optim.SGD.step``)."""
        lr = self.param_groups[0]["lr"]  # a caller may set it between steps, as with torch's
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in params]
        bufs = [self.state.get(p, {}).get("momentum_buffer") for p in params] if self.momentum != 0 else []
        single = [i for i, p in enumerate(params) if not foreach_device(p.device.type)]
        if len(single) == len(params):
            self._single(params, grads, bufs, lr)
        elif not single:
            self._multi(params, grads, bufs, lr)
        else:  # torch's default takes the per-tensor path for all when one parameter is off a foreach device
            self._single(params, grads, bufs, lr)
        if self.momentum != 0:
            for p, buf in zip(params, bufs, strict=True):
                self.state.setdefault(p, {})["momentum_buffer"] = buf

    def _single(self, params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list, lr: float) -> None:
        """``torch.optim.sgd._single_tensor_sgd`` (float lr and weight decay, maximize off)."""
        momentum, dampening, wd = self.momentum, self.dampening, self.weight_decay
        for i, param in enumerate(params):
            grad = grads[i]
            if wd != 0:
                grad = grad.add(param, alpha=wd)
            if momentum != 0:
                buf = bufs[i]
                if buf is None:
                    buf = grad.detach().clone()
                    bufs[i] = buf
                else:
                    buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                grad = grad.add(buf, alpha=momentum) if self.nesterov else buf
            param.add_(grad, alpha=-lr)

    def _multi(self, params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list, lr: float) -> None:
        """``torch.optim.sgd._multi_tensor_sgd`` (float lr and weight decay, maximize off), its
        groups by (device, dtype) as ``Optimizer._group_tensors_by_device_and_dtype`` forms them."""
        momentum, dampening, wd = self.momentum, self.dampening, self.weight_decay
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault((p.device, p.dtype), []).append(i)
        for indices in groups.values():
            device_params = [params[i] for i in indices]
            device_grads = [grads[i] for i in indices]
            has_sparse = any(g.is_sparse for g in device_grads)
            if wd != 0:
                device_grads = foreach_add(device_grads, device_params, alpha=wd)
            if momentum != 0:
                device_bufs = [bufs[i] for i in indices]
                if all(b is not None for b in device_bufs):
                    foreach_mul_(device_bufs, momentum)
                    foreach_add_(device_bufs, device_grads, alpha=1 - dampening)
                else:
                    for j, i in enumerate(indices):
                        if device_bufs[j] is None:
                            device_bufs[j] = bufs[i] = device_grads[j].detach().clone()
                        else:
                            device_bufs[j].mul_(momentum).add_(device_grads[j], alpha=1 - dampening)
                if self.nesterov:
                    foreach_add_(device_grads, device_bufs, alpha=momentum)
                else:
                    device_grads = device_bufs
            if not has_sparse:
                foreach_add_(device_params, device_grads, alpha=-lr)
            else:
                for p, g in zip(device_params, device_grads):
                    p.add_(g, alpha=-lr)
