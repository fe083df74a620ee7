"""The strategies compute the algorithms as the papers write them (tests/oracles.py).

Random federations of several rounds — clients returning, leaving the cache, conflicting with
the average — go through the strategy (cached Gram, dual QP, reused buffers; per-group Gram
systems) and through the plain float64 reference, from the same θ_t every round.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from tests.helpers import aggregate_round, build_strategy, make_replies
from tests.oracles import FedPCDMemory, craft_round, fedpcd_round

TEMPLATE = ArrayRecord({
    "fc1.weight": Array(np.zeros((6, 5), dtype=np.float32)), "fc1.bias": Array(np.zeros(6, dtype=np.float32)),
    "fc2.weight": Array(np.zeros((3, 6), dtype=np.float32)), "fc2.bias": Array(np.zeros(3, dtype=np.float32)),
})
D = 30 + 6 + 18 + 3


def federation(seed: int, rounds: int = 7, clients: int = 8, per_round: int = 3):
    """Per round: the clients, their local-model offsets and sizes. Each client has a fixed
    'task' direction (two camps pulling apart) plus noise, so constraints conflict."""
    rng = np.random.default_rng(seed)
    camps = rng.normal(size=(2, D))
    task = np.stack([camps[c % 2] + 0.6 * rng.normal(size=D) for c in range(clients)])
    plan = []
    for _ in range(rounds):
        pids = sorted(rng.choice(clients, size=per_round, replace=False).tolist())
        offsets = [-0.05 * task[p] + 0.01 * rng.normal(size=D) for p in pids]
        plan.append((pids, offsets, rng.integers(5, 60, size=per_round).tolist()))
    return plan


FEDPCD_CASES = [
    dict(tau=0.2, history=2),
    dict(tau=0.3, history=0),
    dict(tau=0.2, history=3, normalize="none"),
    dict(tau=0.2, history=2, normalize="ema", ema_beta=0.5),
    dict(tau=0.1, history=2, primary="none"),
]


@pytest.mark.parametrize("case", FEDPCD_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("server_lr", [0.0, 0.3])
def test_fedpcd_kernel_is_algorithm_1(case, server_lr):
    lr = 0.05
    strategy = build_strategy("fedpcd", lr=lr, **{"server-lr": server_lr},
                              **{f"fedpcd-{k.replace('_', '-')}": v for k, v in case.items()})
    memory, theta, corrected = FedPCDMemory(), np.random.default_rng(9).normal(size=D), 0
    for t, (pids, offsets, n) in enumerate(federation(1), start=1):
        locals_ = [theta + o for o in offsets]
        got, metrics = aggregate_round(strategy, t, theta, TEMPLATE, make_replies(TEMPLATE, locals_, pids, n=n))
        theta32 = torch.tensor(np.float32(theta), dtype=torch.float64)  # θ_t as the kernel saw it
        local32 = torch.tensor(np.float32(np.stack(locals_)), dtype=torch.float64)
        want = fedpcd_round(theta32, local32, torch.tensor(n, dtype=torch.float64), pids, memory, t,
                            eta_l=lr, eta_g=server_lr or lr, **case)
        step = np.linalg.norm(want.numpy() - theta32.numpy())
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=2e-4 * step + 1e-6, err_msg=f"round {t}")
        corrected += int(metrics["fedpcd-corrected"])
        theta = got
    assert corrected >= 2, "the federation must make FedPCD correct ḡ in some rounds"


@pytest.mark.parametrize("layerwise", [True, False])
@pytest.mark.parametrize("rho", ["data-size", "uniform"])
def test_craft_kernel_is_the_papers_update(layerwise, rho):
    strategy = build_strategy("craft", **{"craft-layerwise": layerwise, "craft-rho": rho, "craft-step": 0.5})
    theta, reference = np.random.default_rng(3).normal(size=D), None
    for t, (pids, offsets, n) in enumerate(federation(2), start=1):
        locals_ = [theta + o for o in offsets]
        got, _ = aggregate_round(strategy, t, theta, TEMPLATE, make_replies(TEMPLATE, locals_, pids, n=n))
        groups = strategy.method.groups(strategy.spec)
        assert len(groups) == (2 if layerwise else 1)  # fc1, fc2 (weight + bias each)
        theta32 = torch.tensor(np.float32(theta), dtype=torch.float64)
        local32 = torch.tensor(np.float32(np.stack(locals_)), dtype=torch.float64)
        want, reference = craft_round(theta32, local32, torch.tensor(n, dtype=torch.float64), groups, reference,
                                      step=0.5, rho=rho)
        step = np.linalg.norm(want.numpy() - theta32.numpy())
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-4 * step + 1e-6, err_msg=f"round {t}")
        theta = got


def test_reference_fedpcd_is_fedavg_without_conflict():
    """Algorithm 1's degenerate case: τ = 0 and agreeing clients → the FedAvg step."""
    rng = np.random.default_rng(0)
    theta = torch.tensor(rng.normal(size=D))
    common = torch.tensor(rng.normal(size=D))
    local = torch.stack([theta - 0.1 * (common + 0.01 * torch.tensor(rng.normal(size=D))) for _ in range(4)])
    n = torch.tensor([10.0, 20.0, 30.0, 40.0], dtype=torch.float64)
    got = fedpcd_round(theta, local, n, [0, 1, 2, 3], FedPCDMemory(), 1, eta_l=0.1, eta_g=0.1, tau=0.0)
    fedavg = (n / n.sum()) @ local
    torch.testing.assert_close(got, fedavg, rtol=0, atol=1e-10)
