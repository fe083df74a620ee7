"""A round's clients trained at once: one batched step of every client per step.

The per-client path (:func:`client_app.training.local_sgd` through a method's routine) trains
one model at a time. Here the clients a process receives in a round are *rows* of stacked
parameters — (B, *shape) per parameter — and one step of every row is one batched forward
and backward: ``torch.func.vmap`` over ``functional_call`` of the run's model (batched
matmuls; a convolution becomes one grouped convolution, the rows' channels stacked and
groups = rows), with ``autograd.grad`` of the sum of the rows' losses (rows are independent,
so each row's gradient is its own client's), then ``torch.optim.SGD``'s update (momentum,
weight decay, the round's lr) written out once for all rows. What a method changes comes from
its row form (:meth:`client_app.methods.ClientMethod.row_form`, from the method's one
definition, which its loop trains by too): the terms added to a row's gradient (FedProx's and
Ditto's proximal pull, SCAFFOLD's correction), the weighting of a row's example losses and the
scalar it carries (FedeRage's CVaR weights and β step), the rows of one job (Ditto's shared and
personal models on the same batches) and how their results finish its outcome. This module holds
the batched trainer and the jobs → rows plan; how a model runs as rows (the batched forward, BatchNorm's and dropout's
row forms, which models have one) is :mod:`client_app.row_forward`, and how one process's
many messages bring their training here together is :mod:`client_app.batch_delivery`.

Each row's batches are drawn from its job's own generator exactly as the per-client path
draws them (the same shuffled epochs or i.i.d. steps, then the augmentation's draws, which
come from that CPU generator on any device), so the rows see the same examples in the same
order; clients with fewer batches (different sizes, ``local-epochs``) are masked out of the
remaining steps (their parameters, momentum, β and running statistics stay), and a short batch
is padded with zero-weight examples to the row's own widest batch (rows of another width train
apart: :attr:`Group.batch`). A BatchNorm (1d/2d/3d) normalises each row over its real examples
only (its statistics written out, so the padding never enters them) and updates the row's
running statistics and ``num_batches_tracked`` as the module does in the loop. Dropout noise is
drawn per row as the per-client path draws it after ``seed_torch(train_seed)``: on the CPU from
a generator seeded so (``bernoulli_``, as the CPU's ``F.dropout``); on CUDA from the device's
default generator, seeded so for the row's draws and restored after, through
``torch.native_dropout`` on tensors of the loop's shapes in the loop's order (the fused kernel
``F.dropout`` calls there: the same Philox stream, the same masks). The result is the
per-client path's within float rounding (the tests hold both to 1e-5 relative;
``tests/test_vectorised.py``). The device-dependent choices (how convolutions are batched, how
noise is drawn, :data:`AUTO_MODELS`) go by :func:`client_app.row_forward.device_kind`.

Where it does not fit (a model with buffers other than BatchNorm's, a dropout variant, a
second model under dropout), the per-client routine runs, and the reason is logged once.

``client-execution`` (run config): ``loop`` = always the per-client path; ``vectorised`` =
rows wherever covered (even one client, e.g. in a Ray actor, which receives one message at a
time); ``auto`` = rows where covered and measured faster (:data:`AUTO_MODELS`: :func:`auto_rows`) for the train
requests the local engine hands a process (:func:`client_app.batch_delivery.deliver_batch`:
the round in process, or a worker's share of it, one client included), else the loop (a
request that arrives alone, as in a Ray actor or on a SuperNode, trains on the loop). Whether a
client trains as a row or on the loop thus depends on the run, never on how the round's
clients are split over the workers; and on the CPU a row's numbers do not depend on which rows
train beside it (at a fixed torch thread count: ``tests/test_worker_determinism.py``), so a run
gives the same bytes with any ``--workers``. On CUDA the grouped convolution's kernel depends on
the number of rows (cuDNN chooses by shape), so there a row's numbers equal the loop's within
float rounding only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from client_app import row_forward  # device_kind through the module: the one place a test patches
from client_app.methods import (
    ClientMethod,
    NotCovered,
    Row,
    RowForm,
    RowLoss,
    RowResult,
    TrainJob,
    TrainOutcome,
    buffers_of,
    load_params,
    params_of,
)
from client_app.row_forward import Forward, dropout_modules, forward_for, model_info
from client_app.training import batch_indices, sampled_batches
from fedcore.seeding import seed_torch

log = logging.getLogger("fedpcd")

# client-execution = 'auto' trains these models as rows, per device kind (device_kind): where
# benchmarks/simulation.py measured the rows' round faster than the loop's, or as fast (the CPU,
# in process, 2026-12-03, figures-free runs: Synthetic's logreg at 10 and 100 clients per round,
# 0.69 and 0.40 of the plain loop's CPU time against the loop's 1.15; the digits MLP at its
# default 5 clients per round 0.84-0.93 of the floor's CPU (medians at two and one threads,
# quiet) against the loop's 1.38-1.48, and its first round 1-2 s shorter: the loop's first
# torch.optim.SGD imported torch._dynamo then (client_app.optim's no longer does); CUDA: at 10,
# 50 and 100 clients per round, bash benchmarks/gpu_check.sh OUT rows; none measured yet).
# docs/performance.md §10 and §4 "Rows on the GPU" hold the figures.
AUTO_MODELS = {"cpu": ("logreg", "mlp", "craft-mlp"), "cuda": ()}

_SAID: set[str] = set()


def forget_notices() -> None:
    """Forget which reasons were logged: the next :func:`run_entries` says each again."""
    _SAID.clear()


def _say_once(reason: str) -> None:
    if reason not in _SAID:
        _SAID.add(reason)
        log.info("client-execution: %s", reason)


# -- rows: the batched trainer -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Group:
    """What the rows trained together share."""

    # Every step's batch padded to this many examples: the rows' own widest batch (the batch
    # size; a client smaller than a batch: its size; full batches: the client's size), so rows
    # of another width train apart. Never the widest batch among the rows beside: MKL's
    # batched matmul rounds a batch's rows differently for another number of rows (9 against
    # 16 on AVX512), so a row padded to its neighbours' width moved its last digits with how a
    # round's clients fell over the workers.
    batch: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    loss: RowLoss | None = None  # how the rows weight their examples' losses (None: the plain mean)


_GATHER_BYTES = 256 * 2**20
# plain SGD's update parameter by parameter (False: through the flat (rows, D) gradient, as the
# methods' terms, momentum and weight decay take it; the same bits: tests/test_vectorised.py)
PER_PARAMETER_UPDATE = True  # a round's batches gathered up front up to this size, else step by step


@dataclasses.dataclass
class _Batches:
    """Every (step, row)'s batch of the rows (ordered by their number of steps, most first), packed
    step by step: step k trains rows 0..width[k]−1, its (row, example) pairs at start[k]:start[k+1]
    of ``packed`` (indices into the pooled X / Y), each row's batch padded to ``bs`` examples; the
    per-pair tensors (``weight``, ``per_row``, ``active``) are laid out the same way."""

    X: torch.Tensor
    steps: list[int]  # each row's number of steps
    width: list[int]  # per step: the rows still training
    start: list[int]  # per step: where its pairs start (one more entry: the end)
    full: list[bool]  # per step: every row of the prefix has a batch
    active: torch.Tensor  # (pairs,) which pairs have a batch
    weight: torch.Tensor  # (pairs, bs) 1 for an example, 0 for padding
    per_row: torch.Tensor  # (pairs, 1) real examples (at least 1)
    packed: torch.Tensor  # (pairs, bs)
    labels: torch.Tensor  # (pairs, bs)
    per_example: torch.Tensor  # (pairs, bs) d(mean batch loss)/d(example loss)
    row_of: torch.Tensor  # (pairs,) each pair's row
    gathered: torch.Tensor | None  # X[packed], where that fits in _GATHER_BYTES
    noise: list[torch.Tensor]  # per dropout module: (S, B, bs, *features)

    @classmethod
    def pack(cls, rows: Sequence[Row], bs: int, forward: Forward, dev: torch.device) -> _Batches:
        steps = [len(r.steps) for r in rows]
        S, B = steps[0], len(rows)
        X, Y, offsets = _pool(rows, dev)
        # the prefix per step: the rows with more than k steps (B minus those with at most k)
        width = (B - np.cumsum(np.bincount(steps, minlength=S))[:S]).tolist()
        start = [0]
        for m_ in width:
            start.append(start[-1] + m_)
        index, weight, lens, row_of = _scatter(rows, offsets, steps, start, bs)
        every = lens.tolist()
        full = [all(every[a:b]) for a, b in zip(start[:-1], start[1:])]  # every row of the prefix takes a step
        packed = torch.from_numpy(index).to(dev)  # (pairs, bs)
        weight_t = torch.from_numpy(weight).to(dev)
        counts = torch.from_numpy(lens.astype(np.float32)).to(dev)  # (pairs,) real examples per pair
        per_row = counts.clamp_min(1.0)[:, None]  # (pairs, 1)
        gathered = X[packed] if packed.numel() * X[:1].numel() * X.element_size() <= _GATHER_BYTES else None
        return cls(X=X, steps=steps, width=width, start=start, full=full, active=counts > 0, weight=weight_t,
                   per_row=per_row, packed=packed, labels=Y[packed], per_example=weight_t / per_row,
                   row_of=torch.from_numpy(row_of).to(dev), gathered=gathered,
                   noise=_noise(rows, forward, X, S, bs, dev))

    def inputs(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step k's examples and labels (rows, bs, ...)."""
        a, b = self.start[k], self.start[k + 1]
        return (self.gathered[a:b] if self.gathered is not None else self.X[self.packed[a:b]]), self.labels[a:b]


def _pool(rows: Sequence[Row], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The rows' examples in one pool, and where each row's start (rows on the same data, as
    Ditto's two, share theirs)."""
    sources: dict[int, int] = {}  # id(x) -> offset in the pool
    xs, ys, off = [], [], 0
    offsets = []
    for r in rows:
        if id(r.x) not in sources:
            sources[id(r.x)] = off
            xs.append(r.x.to(dev))
            ys.append(r.y.to(dev))
            off += r.y.shape[0]
        offsets.append(sources[id(r.x)])
    return torch.cat(xs), torch.cat(ys), offsets


def _scatter(rows: Sequence[Row], offsets: list[int], steps: list[int], start: list[int],
             bs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (step, row) pair's batch scattered into (pairs, bs) index (into the pool) and weight (1
    for an example, 0 for padding) arrays in one go (on the host: a few array operations whatever
    the number of pairs), with each pair's number of examples and its row. Pair (k, b) is
    start[k] + b: the rows are ordered by their number of steps, so step k's rows are a prefix."""
    idxs = [i for r in rows for i in r.steps]  # row by row, step by step
    pairs = start[-1]
    index = np.zeros((pairs, bs), dtype=np.int64)
    weight = np.zeros((pairs, bs), dtype=np.float32)
    lens = np.zeros(pairs, dtype=np.int64)
    row_of = np.zeros(pairs, dtype=np.int64)
    if idxs:
        n_steps = np.asarray(steps, dtype=np.int64)
        row = np.repeat(np.arange(len(rows), dtype=np.int64), n_steps)  # each (row, step)'s row
        step = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(n_steps) - n_steps, n_steps)
        pair = np.asarray(start[:-1], dtype=np.int64)[step] + row
        each = np.asarray([i.shape[0] for i in idxs], dtype=np.int64)
        lens[pair] = each
        row_of[pair] = row
        flat = torch.cat(idxs).cpu().numpy()  # every index, in the same order
        at = np.repeat(pair * bs - (np.cumsum(each) - each), each) + np.arange(len(flat), dtype=np.int64)
        index.reshape(-1)[at] = flat + np.repeat(np.asarray(offsets, dtype=np.int64)[row], each)
        weight.reshape(-1)[at] = 1.0
    return index, weight, lens, row_of


def _noise(rows: Sequence[Row], forward: Forward, X: torch.Tensor, S: int, bs: int,
           dev: torch.device) -> list[torch.Tensor]:
    """Per dropout module: every (step, row)'s noise, (S, B, bs, *features), zero-padded."""
    if not forward.drops:
        return []
    noise = [torch.zeros(S, len(rows), bs, *shape, device=dev) for shape in forward.dropout_shapes(X)]
    for b, r in enumerate(rows):
        for k, per_module in enumerate(r.masks or []):
            for j, z in enumerate(per_module):
                noise[j][k, b, : len(z)] = z
    return noise


class _Layout:
    """All of a row's parameters in one flat (D,) vector, the model's views cut out of the rows'
    (rows, D) tensor: the update is a few whole-tensor operations per step, whatever the layers."""

    def __init__(self, init: Sequence[torch.Tensor], dev: torch.device) -> None:
        self.shapes = [tuple(t.shape) for t in init]
        self.cuts = [0]
        for t in init:
            self.cuts.append(self.cuts[-1] + t.numel())
        self.dev = dev

    def flat(self, ts: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1).to(self.dev) for t in ts])

    def views(self, p: torch.Tensor) -> list[torch.Tensor]:
        return [p[:, a:b].view(p.shape[0], *shape) for a, b, shape in zip(self.cuts[:-1], self.cuts[1:], self.shapes)]

    def columns(self, p: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's (rows, numel) columns of the rows' (rows, D) tensor."""
        return [p[:, a:b] for a, b in zip(self.cuts[:-1], self.cuts[1:])]


@dataclasses.dataclass
class _Trained:
    """What the steps change: the rows' parameters, momentum buffer, carried scalars and losses."""

    params: torch.Tensor  # (B, D)
    lr: torch.Tensor  # (B, 1)
    terms: list[Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]]  # the methods' gradient terms
    carried: torch.Tensor  # (B,) float64: what the rows' loss carries (FedeRage's β)
    losses: torch.Tensor  # each (step, row) pair's mean batch loss (0 where a row took none)
    buffers: list[torch.Tensor]  # each of the model's buffers, (B, *shape) (BatchNorm's running statistics)
    buf: torch.Tensor | None = None  # the momentum buffer, from the first step

    @classmethod
    def start(cls, rows: Sequence[Row], layout: _Layout, pairs: int) -> _Trained:
        dev = layout.dev
        params = torch.cat([t.reshape(-1).to(dev) for r in rows for t in r.init]).view(len(rows), -1)
        count = {len(r.buffers or ()) for r in rows}
        if len(count) > 1:
            raise ValueError("rows with and without the model's buffers cannot train together")
        buffers = [torch.stack([r.buffers[i].to(dev) for r in rows]) for i in range(count.pop())]
        return cls(params=params, lr=torch.tensor([r.lr for r in rows], dtype=params.dtype, device=dev)[:, None],
                   terms=_gradient_terms(rows, layout, params),
                   carried=torch.tensor([float(r.carried) for r in rows], dtype=torch.float64, device=dev),
                   losses=torch.zeros(pairs, device=dev), buffers=buffers)


def _gradient_terms(rows: Sequence[Row], layout: _Layout, params: torch.Tensor) -> list[Callable]:
    """Each kind of term of the rows, stacked by its own class (a row without one: None), in a
    fixed order (by class), so that a row's numbers do not depend on the rows beside it."""
    kinds = sorted({type(t) for r in rows for t in r.terms}, key=lambda c: (c.__module__, c.__qualname__))
    out = []
    for kind in kinds:
        mine = [next((t for t in r.terms if type(t) is kind), None) for r in rows]
        add = kind.stack(mine, rows, layout.flat, params)
        if add is not None:
            out.append(add)
    return out


class _Coefficient:
    """d(total)/d(ce) per example of one step (``wn`` = d(mean batch loss)/d(ce), or the rows'
    loss's weights); the rows' mean batch losses (``plain``) and the gradient of what the loss
    carries (``grad``) on the side. The hand-written chain's backward calls it inside."""

    def __init__(self, loss: RowLoss | None, wn: torch.Tensor, real: torch.Tensor, count: torch.Tensor,
                 carried: torch.Tensor) -> None:
        self.loss, self.wn, self.real, self.count, self.carried = loss, wn, real, count, carried
        self.plain: torch.Tensor | None = None
        self.grad: torch.Tensor | None = None

    def __call__(self, ce: torch.Tensor) -> torch.Tensor:
        e = ce.detach()
        self.plain = (e * self.wn).sum(1)  # (rows,) each row's mean batch loss
        if self.loss is None:
            return self.wn
        c, self.grad = self.loss.coefficient(e, self.plain, self.real, self.count, self.carried)
        return c


def train_rows(model: nn.Module, rows: Sequence[Row], group: Group) -> list[RowResult]:
    """Train every row for its own number of steps; one batched step of all rows per step.

    The rows are ordered by their number of steps (most first), so the rows still training at
    step k are a prefix and step k computes on that prefix alone: a round whose clients' sizes
    differ (Synthetic's are lognormal: 45 to 5,353 examples) costs the longest client's steps
    on fewer and fewer rows, not every row padded to the longest."""
    forward = forward_for(model)
    dev = model_info(model).device
    order = sorted(range(len(rows)), key=lambda b: -len(rows[b].steps))  # stable: ties keep their order
    ordered = [rows[b] for b in order]
    if not ordered[0].steps:  # no row has a batch: every row keeps its start
        return [RowResult(params=[t.clone() for t in r.init], num_steps=0, train_loss=0.0, carried=float(r.carried),
                          buffers=r.buffers) for r in rows]
    batches = _Batches.pack(ordered, group.batch, forward, dev)
    layout = _Layout(ordered[0].init, dev)
    state = _Trained.start(ordered, layout, batches.start[-1])
    _train_steps(forward, batches, layout, state, group)
    results = _results(batches, layout, state)
    out: list[RowResult] = [results[0]] * len(rows)
    for b, at in enumerate(order):
        out[at] = results[b]
    return out


def _train_steps(forward: Forward, batches: _Batches, layout: _Layout, state: _Trained, group: Group) -> None:
    """The steps: each one batch's gradient of every row still training, the methods' terms, the
    carried scalars' step and the SGD update (rows without a batch at that step are kept)."""
    by_hand = not forward.drops and (forward.chain if forward.chain is not None else
                                     forward.is_chain(layout.views(state.params[:1]), batches.X[batches.packed[:1]]))
    # plain SGD (no term, momentum or weight decay): each parameter's gradient updates its own
    # columns of the rows with the same elementwise operations, no (rows, D) gradient laid out
    flat = not PER_PARAMETER_UPDATE or bool(state.terms or group.momentum or group.weight_decay)
    widths: dict[int, tuple] = {}  # per number of rows m: the views of rows 0..m-1 (the params never move)
    for k, m in enumerate(batches.width):  # rows 0..m-1 still train
        a, b = batches.start[k], batches.start[k + 1]
        at_m = widths.get(m)
        if at_m is None:
            p = state.params[:m]
            at_m = widths[m] = (p, layout.views(p), layout.columns(p), state.carried[:m], state.lr[:m])
        p, views, columns, carried, lr = at_m
        act = None if batches.full[k] else batches.active[a:b]
        coefficient = _Coefficient(group.loss, batches.per_example[a:b], batches.weight[a:b], batches.per_row[a:b],
                                   carried)
        xb, yb = batches.inputs(k)
        if by_hand:
            _, grads = forward.chain_grads(views, xb, yb, coefficient)
        else:
            grads, stats = _autograd_step(forward, views, xb, yb, [z[k, :m] for z in batches.noise],
                                          batches.weight[a:b], coefficient)
            _update_running(forward, state, stats, m, act)
        state.losses[a:b] = coefficient.plain  # 0 for a row of the prefix without a batch at this step
        if group.loss is not None:
            moved = group.loss.step(carried, coefficient.grad)
            state.carried[:m] = moved if act is None else torch.where(act, moved, carried)
        with torch.no_grad():
            if flat:
                g = torch.cat(grads, 1)
                for add in state.terms:
                    g = add(g, p, m)
                _sgd_update(state, g, m, act, group)
            else:
                _plain_update(columns, lr, grads, act)


def _autograd_step(forward: Forward, views: list[torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                   noise: list[torch.Tensor], real: torch.Tensor,
                   coefficient: _Coefficient) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The rows' gradients of Σ coefficient(ce)·ce by autograd through the forward, (rows, numel)
    per parameter, and the forward's BatchNorm statistics."""
    m, bs = yb.shape
    # one leaf per parameter (views of the flat rows): their gradients are cut apart, not summed
    leaves = [v.detach().requires_grad_(True) for v in views]
    logits, stats = forward(leaves, xb, noise, real)
    ce = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view(m, bs)
    total = (coefficient(ce).detach() * ce).sum()
    return [t.reshape(m, -1) for t in torch.autograd.grad(total, leaves)], stats


@torch.no_grad()
def _update_running(forward: Forward, state: _Trained, stats: list[tuple[torch.Tensor, torch.Tensor]], m: int,
                    act: torch.Tensor | None) -> None:
    """Each BatchNorm's running statistics of rows 0..m−1 after a step's forward, as the module
    updates its own in the loop (the momentum's moving average, or with momentum None the
    cumulative one, 1/num_batches_tracked); a row outside ``act`` (no batch) keeps them."""
    for norm, (mean, var) in zip(forward.norms, stats):
        if norm.at is None:
            continue
        rm, rv, tracked = (state.buffers[i] for i in norm.at)
        count = tracked[:m] + 1
        wide = (m,) + (1,) * (rm.dim() - 1)
        f = norm.momentum if norm.momentum is not None else (1.0 / count.double()).to(rm.dtype).view(wide)
        for buf, new in ((rm, f * mean + (1 - f) * rm[:m]), (rv, f * var + (1 - f) * rv[:m]), (tracked, count)):
            buf[:m] = new if act is None else torch.where(act.view((m,) + (1,) * (new.dim() - 1)), new, buf[:m])


def _sgd_update(state: _Trained, g: torch.Tensor, m: int, act: torch.Tensor | None, group: Group) -> None:
    """``torch.optim.SGD``'s step (weight decay, momentum, lr) of rows 0..m−1, written out; a row
    outside ``act`` (no batch at this step) keeps its parameters and momentum."""
    p = state.params[:m]
    mask = None if act is None else act[:, None]
    if group.weight_decay:
        g = g + group.weight_decay * p
    if group.momentum:
        if state.buf is None:
            state.buf = torch.zeros_like(state.params)
            g = g.clone()
        elif mask is None:
            g = state.buf[:m] * group.momentum + g
        else:
            g = torch.where(mask, state.buf[:m] * group.momentum + g, state.buf[:m])
        state.buf[:m] = g
    if mask is None:
        p.addcmul_(state.lr[:m], g, value=-1.0)
    else:
        state.params[:m] = torch.where(mask, p - state.lr[:m] * g, p)


def _plain_update(columns: list[torch.Tensor], lr: torch.Tensor, grads: list[torch.Tensor],
                  act: torch.Tensor | None) -> None:
    """:func:`_sgd_update` without weight decay and momentum, parameter by parameter: each
    parameter's columns of rows 0..m−1 (``columns``, views of the rows' (B, D) tensor) take the
    same elementwise operations on the same gradient values as the whole rows would (an
    elementwise result does not depend on where the element lies: ``tests/test_vectorised.py``
    checks the bits against the flat update)."""
    if act is None:
        for c, g in zip(columns, grads):
            c.addcmul_(lr, g, value=-1.0)
    else:
        mask = act[:, None]
        for c, g in zip(columns, grads):
            c.copy_(torch.where(mask, c - lr * g, c))


def _results(batches: _Batches, layout: _Layout, state: _Trained) -> list[RowResult]:
    """Each row's parameters, steps, mean batch loss (summed in float64) and carried scalar."""
    dev = state.params.device
    steps = batches.steps
    loss_sum = torch.zeros(len(steps), dtype=torch.float64, device=dev).index_add_(
        0, batches.row_of, state.losses.double()).tolist()
    carried = state.carried.tolist()
    params = list(zip(*(v.unbind(0) for v in layout.views(state.params))))
    buffers = list(zip(*(t.unbind(0) for t in state.buffers))) if state.buffers else None
    return [RowResult(params=list(params[b]), num_steps=steps[b], train_loss=loss_sum[b] / max(steps[b], 1),
                      carried=carried[b], buffers=list(buffers[b]) if buffers else None)
            for b in range(len(steps))]


# -- jobs → rows: each method's row form -----------------------------------------------------------
def job_batches(job: TrainJob, dev: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                          list[torch.Tensor]]:
    """The job's (x, y, per-step indices) drawn exactly as :func:`local_sgd` draws them (the
    generator's batch draws and the augmentation's draws in the same order). An augmentation
    with ``draw``/``apply`` (:class:`client_app.data.augment.CropFlip`) has its steps' draws
    taken in that order and applied to all of them at once; another is called step by step.
    ``dev``: the model's device (None: looked up)."""
    dev = dev if dev is not None else next(job.model.parameters()).device
    x, y = job.x.to(dev), job.y.to(dev)
    cfg = job.cfg
    n = y.shape[0]
    batches = (sampled_batches(n, cfg.batch_size, cfg.local_steps, job.generator) if cfg.local_steps > 0
               else batch_indices(n, cfg.batch_size, cfg.local_epochs, job.generator))
    if job.augment is None:
        return x, y, _to_device(list(batches), dev)
    idxs, draws = [], []
    split = hasattr(job.augment, "draw") and hasattr(job.augment, "apply")
    for idx in batches:  # the augmentation draws after each step's batch, as in the loop
        idxs.append(idx)
        if split:
            draws.append(job.augment.draw(len(idx), job.generator))
        else:
            draws.append(job.augment(x[idx.to(dev)], job.generator))
    if not idxs:
        return x[:0], y[:0], []
    picked = torch.cat(idxs).to(dev)
    xs = job.augment.apply(x[picked], tuple(torch.cat(d) for d in zip(*draws))) if split else torch.cat(draws)
    return xs, y[picked], list(torch.arange(len(picked), device=dev).split([len(i) for i in idxs]))


def _to_device(idxs: list[torch.Tensor], dev: torch.device) -> list[torch.Tensor]:
    """Index tensors on the device in one copy."""
    if not idxs or dev.type == "cpu":
        return idxs
    return list(torch.cat(idxs).to(dev).split([len(i) for i in idxs]))


def dropout_noise(job: TrainJob, steps: list[torch.Tensor], forward: Forward) -> list[list[torch.Tensor]] | None:
    """Each step's dropout noise (``Bernoulli(1 − p) / (1 − p)``) as the per-client path draws
    it after ``seed_torch(job.train_seed)``: one draw per dropout module per forward, of the
    shape its input has there (:func:`_generator_noise` on the CPU, :func:`_fused_noise` on CUDA)."""
    if not forward.drops:
        return None
    if job.train_seed is None:
        raise NotCovered("the job has no train seed for its dropout draws")
    dev = next(job.model.parameters()).device
    probs = [m.p for _, m in dropout_modules(job.model)]
    features = forward.dropout_shapes(job.x[:1].to(dev))
    shapes = [[(len(idx), *shape) for shape in features] for idx in steps]
    draw = _generator_noise if row_forward.device_kind(job.model) == "cpu" else _fused_noise
    return draw(int(job.train_seed), probs, shapes, dev)


def _generator_noise(seed: int, probs: list[float], shapes: list[list[tuple]], dev: torch.device) -> list:
    """The CPU's ``F.dropout``: ``empty(shape).bernoulli_(1 − p).div_(1 − p)`` from torch's CPU
    generator, here one seeded with ``seed`` (the global one stays as it is)."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return [[torch.empty(shape).bernoulli_(1 - p, generator=gen).div_(1 - p) for p, shape in zip(probs, step)]
            for step in shapes]


def _fused_noise(seed: int, probs: list[float], shapes: list[list[tuple]], dev: torch.device) -> list:
    """CUDA's ``F.dropout``, the fused ``native_dropout`` kernel, which draws from the default
    generator of the tensor's device (Philox: the masks depend on the seed, the offset the earlier
    draws advanced and the shape): that generator seeded with ``seed``, as ``seed_torch`` seeds
    it for the loop, then one ``native_dropout`` of a fresh tensor of ones of the loop's shape per
    module and step, in the loop's order; the generator's own state is restored after. (On the
    CPU the same call draws ``bernoulli_`` from the CPU generator: what the tests check it by.)
    The rows' threads are all waiting meanwhile (:class:`client_app.batch_delivery._Collector`),
    so no draw interleaves."""
    gen = torch.default_generator if dev.type == "cpu" else \
        torch.cuda.default_generators[dev.index if dev.index is not None else torch.cuda.current_device()]
    saved = gen.get_state()
    try:
        gen.manual_seed(seed)
        return [[torch.native_dropout(torch.ones(shape, device=dev), p, True)[0] for p, shape in zip(probs, step)]
                for step in shapes]
    finally:
        gen.set_state(saved)


def plain_row(job: TrainJob, parameters: Sequence[torch.Tensor] | None = None) -> Row:
    """The job as plain SGD's row: the model's parameters, the job's batches (and dropout noise).
    ``parameters``: ``list(job.model.parameters())`` where the caller holds it."""
    info = model_info(job.model)
    x, y, steps = job_batches(job, info.device)
    noise = dropout_noise(job, steps, forward_for(job.model)) if info.has_dropout else None
    # a covered model's only buffers are its BatchNorms' (covers_model): without one it has none
    return Row(init=params_of(job.model, parameters), x=x, y=y, steps=steps, lr=float(job.lr), masks=noise,
               buffers=buffers_of(job.model) if info.has_norms else None)


@dataclasses.dataclass
class Plan:
    """A job's rows, the group they train in, and how the rows' results become its outcome."""

    rows: list[Row]
    group: Group
    finish: Callable[[list[RowResult]], TrainOutcome]


def plan(method: ClientMethod, job: TrainJob) -> Plan:
    """The rows of one job by its method's row form (raises :class:`NotCovered` where the model
    or the job's parts have none)."""
    info = model_info(job.model)
    if info.uncovered:
        raise NotCovered(info.uncovered)
    parameters = list(info.parameters)  # listed once: the row's start, then its result loaded into them
    base = plain_row(job, parameters)
    if info.has_norms and any(len(idx) < 2 for idx in base.steps):
        raise NotCovered("a batch of one example under BatchNorm (the loop's error or numbers)")
    form = method.row_form(job, base)
    batch = max((i.shape[0] for r in form.rows for i in r.steps), default=1)
    momentum = job.cfg.momentum if form.momentum is None else form.momentum  # FedFa's own γ
    group = Group(batch=batch, momentum=float(momentum), weight_decay=float(job.cfg.weight_decay),
                  loss=form.loss)
    return Plan(form.rows, group, functools.partial(_finish, job, form, parameters))


def _finish(job: TrainJob, form: RowForm, parameters: Sequence[torch.Tensor], results: list[RowResult]) -> TrainOutcome:
    """The first row's result into the job's model (its ``parameters`` as plan() listed them, in the
    same run_entries call) and the outcome; the method's extras."""
    load_params(job.model, results[0].params, results[0].buffers, parameters=parameters)
    outcome = TrainOutcome(num_steps=results[0].num_steps, train_loss=results[0].train_loss)
    if form.finish is not None:
        form.finish(results, outcome)
    return outcome


def _group_key(model: nn.Module, group: Group) -> tuple:
    return (model_info(model).layout, group)


@dataclasses.dataclass
class Entry:
    method: ClientMethod
    job: TrainJob
    outcome: TrainOutcome | None = None
    error: BaseException | None = None
    done: bool = False
    generator_state: torch.Tensor | None = None  # before plan() drew the batches (for a fallback)


def auto_rows(model: str | None, device: str) -> bool:
    """Rows under ``client-execution = 'auto'``: a model :data:`AUTO_MODELS` names for the device
    kind. The one rule, for the ClientApp (:func:`auto_picks`), the engine's batch
    (:func:`client_app.batch_delivery.wants_batch`) and the run's record
    (:func:`fedpcd_app.runtime.execution.choose`)."""
    return model in AUTO_MODELS.get(device, ())


def auto_picks(job: TrainJob) -> bool:
    """``auto`` under the local engine's batch (:func:`client_app.batch_delivery.deliver_batch`):
    rows by :func:`auto_rows` on the run's model, however many clients the batch holds (a
    worker's share of a round may be one client: the loop there would give other numbers than
    the rows in process)."""
    return auto_rows(getattr(job.cfg, "model", None), row_forward.device_kind(job.model))


def run_entries(entries: Sequence[Entry], mode: str) -> None:
    """Train the jobs: rows where covered (grouped), the per-client routine elsewhere. Each
    entry gets its outcome or its error."""
    plans: dict[tuple, list[tuple[Entry, Plan]]] = {}
    loop: list[Entry] = []
    for e in entries:
        if mode == "loop" or (mode == "auto" and not auto_picks(e.job)):
            loop.append(e)
            continue
        e.generator_state = e.job.generator.get_state()
        try:
            p = plan(e.method, e.job)
        except NotCovered as exc:
            _say_once(f"the per-client loop trains {e.method.name} on {type(e.job.model).__name__}: {exc}")
            e.job.generator.set_state(e.generator_state)
            loop.append(e)
            continue
        except Exception as exc:  # noqa: BLE001 - the routine's own error (e.g. a missing key): its reply
            e.error, e.done = exc, True
            continue
        plans.setdefault(_group_key(e.job.model, p.group), []).append((e, p))
    for items in plans.values():
        rows = [r for _, p in items for r in p.rows]
        try:
            results = train_rows(items[0][0].job.model, rows, items[0][1].group)
        except Exception as exc:  # noqa: BLE001 - a row-form failure falls back to the loop, said once
            _say_once(f"rows failed ({type(exc).__name__}: {exc}); the per-client loop trains instead")
            log.debug("rows failed", exc_info=True)
            for e, _ in items:
                e.job.generator.set_state(e.generator_state)
                loop.append(e)
            continue
        at = 0
        for e, p in items:
            mine = results[at: at + len(p.rows)]
            at += len(p.rows)
            try:
                e.outcome = p.finish(mine)
            except Exception as exc:  # noqa: BLE001
                e.error = exc
            e.done = True
    for e in loop:
        if e.done:
            continue
        try:
            if e.job.train_seed is not None:  # the global generator as the per-client path left it
                seed_torch(int(e.job.train_seed))
            e.outcome = e.method.train(e.job)
        except Exception as exc:  # noqa: BLE001
            e.error = exc
        e.done = True
