"""A lean ClientApp process (issue 53): what a train and an evaluate message load, and the local
step that loads no ``torch._dynamo``.

Flower 1.42 starts a fresh ClientApp process for every message, so every module a message imports
is paid again at every message: ``torch.optim.SGD``'s first step alone imported ``torch._dynamo``
(sympy, triton, torch's compiler: ~165 MiB resident, ~1 s). :class:`client_app.optim.SGD` computes
torch's update without it; these tests hold it to ``torch.optim.SGD`` bit for bit, and a fresh
process that runs the ClientApp's two handlers to the modules it may load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from client_app.optim import SGD
from client_app.training import batch_indices, local_sgd
from fedcore.seeding import torch_generator

ROOT = Path(__file__).resolve().parent.parent

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# (momentum, dampening, weight decay, nesterov): what torch.optim.SGD takes, this app's (momentum,
# weight decay) and the rest
SETTINGS = [(0.0, 0.0, 0.0, False), (0.9, 0.0, 0.0, False), (0.0, 0.0, 1e-3, False), (0.9, 0.0, 5e-4, False),
            (0.5, 0.1, 1e-2, False), (0.9, 0.0, 1e-3, True)]


def _net(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10)).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum,dampening,weight_decay,nesterov", SETTINGS)
def test_sgd_steps_are_torch_optim_sgds_bit_for_bit(device, momentum, dampening, weight_decay, nesterov):
    """Twelve steps of the same model on the same batches: every parameter and every momentum
    buffer equal to ``torch.optim.SGD``'s, bit for bit, after each step; a parameter without a
    gradient at a step (the conv bias at steps 3 and 7) is left alone by both, and a learning rate
    changed between steps (``param_groups[0]["lr"]``) is taken by both."""
    ours, theirs = _net(device), _net(device)
    kw = dict(momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
    opt_ours, opt_theirs = SGD(ours.parameters(), lr=0.05, **kw), torch.optim.SGD(theirs.parameters(), lr=0.05, **kw)
    gen = torch.Generator().manual_seed(1)
    for step in range(12):
        x, y = torch.randn(16, 1, 8, 8, generator=gen).to(device), torch.randint(10, (16,), generator=gen).to(device)
        if step == 5:
            opt_ours.param_groups[0]["lr"] = opt_theirs.param_groups[0]["lr"] = 0.02
        for net, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            if step in (3, 7):
                net[0].bias.grad = None
            opt.step()
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
            assert torch.equal(a, b), f"step {step}: {name} differs from torch.optim.SGD's"
            if momentum:
                assert torch.equal(opt_ours.state[a]["momentum_buffer"], opt_theirs.state[b]["momentum_buffer"])


def _local_sgd_with_torch_optim(model, x, y, *, epochs, batch_size, lr, generator, momentum, weight_decay):
    """client_app.training.local_sgd as it was before issue 53 (torch.optim.SGD), for the comparison."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    model.train()
    for idx in batch_indices(len(y), batch_size, epochs, generator):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 1e-3)])
def test_local_sgd_trains_as_torch_optim_did(model_name, momentum, weight_decay):
    """The loop's local training (two epochs of digits-shaped batches) gives the model bytes the
    torch.optim.SGD loop gave."""
    from client_app.models import build_model

    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(70, 1, 8, 8, generator=gen), torch.randint(10, (70,), generator=gen)
    torch.manual_seed(0)
    ours = build_model(model_name, (1, 8, 8), 10)
    theirs = build_model(model_name, (1, 8, 8), 10)
    theirs.load_state_dict(ours.state_dict())
    kw = dict(epochs=2, batch_size=16, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    local_sgd(ours, x, y, generator=torch_generator(0, "t"), **kw)
    _local_sgd_with_torch_optim(theirs, x, y, generator=torch_generator(0, "t"), **kw)
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), f"{model_name}: {name} differs from the torch.optim.SGD loop's"


def test_sgd_refuses_what_torch_refuses_in_one_line():
    p = [nn.Parameter(torch.zeros(2))]
    for kw, text in ((dict(lr=-1.0), "Invalid learning rate"), (dict(lr=0.1, momentum=-0.5), "Invalid momentum"),
                     (dict(lr=0.1, weight_decay=-1.0), "Invalid weight_decay"),
                     (dict(lr=0.1, nesterov=True), "Nesterov momentum requires")):
        with pytest.raises(ValueError, match=text):
            SGD(p, **kw)
    with pytest.raises(TypeError, match="float learning rate"):
        SGD(p, lr=torch.tensor(0.1))


# What a ClientApp message must not load: torch's compiler stack, the server, the analysis, the
# plotting and solver libraries, the local engine, the batched trainer (a lone message trains on
# the loop), the other client methods and the readers of data the message does not use.
FORBIDDEN = ("torch._dynamo", "torch._inductor", "sympy", "triton", "scipy", "matplotlib", "pandas", "sklearn",
             "ray", "tensorboard", "clarabel", "cvxpy", "datasets", "flwr_datasets", "pyarrow", "PIL",
             "strategies", "fedpcd_app.server", "fedpcd_app.analysis", "fedpcd_app.runtime.grid",
             "fedpcd_app.runtime.node", "fedpcd_app.runtime.pool", "client_app.vectorised", "client_app.row_forward",
             "client_app.foreign", "client_app.methods.fedprox", "client_app.methods.scaffold",
             "client_app.methods.ditto", "client_app.methods.federage")


def _fresh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_fresh_clientapp_process_loads_only_what_its_messages_need():
    """A fresh process imports the ClientApp and answers one train (momentum and weight decay:
    the optimizer's whole update) and one evaluate message on digits; then no module of
    :data:`FORBIDDEN` (nor a submodule of one) is loaded, and the message's own are."""
    done = _fresh(str(ROOT / "tests" / "client_probe.py"), "mlp", "1", json.dumps({"momentum": 0.9,
                                                                                    "weight-decay": 0.001}))
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["model_moved"] and out["train"]["num-examples"] > 0 and out["evaluate"]["num-test"] > 0
    loaded = set(out["loaded"])
    heavy = sorted(f for f in FORBIDDEN if any(m == f or m.startswith(f + ".") for m in loaded))
    assert not heavy, f"a ClientApp message loaded {heavy} (or their submodules)"
    assert {"torch", "flwr.clientapp", "client_app.client_app", "client_app.methods.sgd", "client_app.optim",
            "client_app.models", "client_app.data.builtin"} <= loaded


def test_a_client_method_loads_its_own_module_alone():
    """``get_client_method(name)`` imports that method's module (and what it stands on) only; an
    unknown name still lists every known one."""
    code = ("import sys, json\n"
            "from client_app.methods import get_client_method\n"
            "get_client_method('fedprox')\n"
            "first = sorted(m for m in sys.modules if m.startswith('client_app.methods.'))\n"
            "try:\n    get_client_method('no-such-method')\nexcept ValueError as exc:\n    err = str(exc)\n"
            "print(json.dumps([first, err]))\n")
    done = _fresh("-c", code)
    assert done.returncode == 0, done.stderr[-4000:]
    first, err = json.loads(done.stdout.splitlines()[-1])
    assert first == ["client_app.methods.fedprox"]  # the loop and the rows' drivers are the package's own
    assert "unknown client method 'no-such-method'" in err
    assert all(m in err for m in ("ditto", "federage", "fedprox", "scaffold", "sgd"))
