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
