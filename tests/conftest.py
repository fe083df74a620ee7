"""Guards shared by every test, and a Ctrl-C that ends the suite at once."""

import os
import sys
from types import SimpleNamespace

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


def pytest_collection_modifyitems(config, items):
    """The files that start real processes first: those with a ``deployment`` test, then those
    with a ``slow`` one, each rank in collection order. scripts/test.sh gives each file to one
    worker (``--no-loadscope-reorder`` keeps this order); started last, a 2-3 minute deployment file
    ran on alone while the other workers sat idle."""
    def file_of(item) -> str:
        return item.nodeid.split("::")[0]

    rank: dict[str, int] = {}
    for item in items:
        r = 0 if item.get_closest_marker("deployment") else 1 if item.get_closest_marker("slow") else 2
        rank[file_of(item)] = min(rank.get(file_of(item), 2), r)
    items.sort(key=lambda item: rank[file_of(item)])  # stable: the order within a file kept


@pytest.fixture(autouse=True)
def _no_full_collections_in_flowers_array_conversions(monkeypatch):
    """Flower's ``ArrayRecord`` conversions (``to_numpy_ndarrays`` / ``from_numpy_ndarrays`` without
    ``keep_input``, which its QFedAvg, Bulyan and FedAdam call per reply) run ``gc.collect()``: a
    full collection, ~0.12 s each in a test process that holds torch, 22 s for one 3-round QFedAvg
    test. It frees memory and changes no number; the tests compare numbers."""
    from flwr.app.message import arrayrecord

    monkeypatch.setattr(arrayrecord, "gc", SimpleNamespace(collect=lambda *args, **kwargs: 0))


# -- Ctrl-C ------------------------------------------------------------------------------------------------
# A Ctrl-C reaches the test as KeyboardInterrupt (the app's RunInterrupted and flwr_run's Interrupted are
# KeyboardInterrupts; tests that raise one on purpose raise tests.helpers.SimulatedCtrlC and catch only
# that), so pytest stops and prints its summary. The process then leaves without the interpreter's
# teardown: collecting torch's and Flower's objects took seconds more (measured 4-6 s here, loaded).
_interrupted = False


def pytest_keyboard_interrupt(excinfo):
    global _interrupted
    _interrupted = True


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _interrupted:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(pytest.ExitCode.INTERRUPTED))
