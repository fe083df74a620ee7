"""Guards shared by every test."""

import numpy as np
import pytest
import torch


@pytest.fixture
def rng():
    """A seeded numpy generator (seed 0)."""
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _autograd_stays_on():
    """A test (or code it calls) must not leave autograd switched off for later tests."""
    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("autograd was left disabled (torch.set_grad_enabled(False) without restore)")


@pytest.fixture(autouse=True)
def _no_end_of_run_figures(request, monkeypatch):
    """Runs inside tests skip the end-of-run report and figures (``figures = 'auto'``: a
    process of its own that imports matplotlib, seconds per run); tests marked ``figures``
    keep them. Runs in subprocesses (``flwr run``) draw them as users get them."""
    if request.node.get_closest_marker("figures") is None:
        monkeypatch.setattr("fedpcd_app.server.report_process.draw_report", lambda out_dir, drawer=None: None)
        monkeypatch.setattr("fedpcd_app.server.report_process.start_report_drawer", lambda: None)
