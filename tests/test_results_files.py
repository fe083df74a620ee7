"""What a run leaves to take away: final_model.pt (a plain state_dict) and checkpoints, both
readable with torch.load(weights_only=True); docs/running.md's loading snippet scores the model."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

from client_app.client_app import app as client_app
from fedcore.config import load_config
from fedpcd_app.server import checkpoint
from fedpcd_app.server.server_app import Experiment
from tests.fakegrid import ClientAppGrid, task_identity

RUNNING = Path(__file__).resolve().parent.parent / "docs" / "running.md"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = load_config({"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2,
                       "checkpoint-every": 1, "output-dir": str(out)})
    with task_identity():
        Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg).run()
    return out


@pytest.mark.slow
def test_final_model_and_checkpoints_load_with_weights_only(run_dir):
    state = torch.load(run_dir / "final_model.pt", weights_only=True)
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())
    for ckpt in (run_dir / "checkpoints").glob("round-*.pt"):
        tree = torch.load(ckpt, weights_only=True)
        assert tree["format"] == checkpoint.FORMAT  # the run state whole


@pytest.mark.slow
def test_the_docs_snippet_scores_the_final_model_as_the_run_did(run_dir):
    block = re.search(r"```python\n(import json\n.*?final_model\.pt.*?)```", RUNNING.read_text(), re.S)
    snippet = textwrap.dedent(block.group(1))
    made = re.search(r"^run = simulate\(.*$", snippet, re.M).group(0)  # the run it makes: this module's instead
    code = snippet.replace(made, f"run = Path({str(run_dir)!r})").replace("print(", "result = (")
    scope: dict = {}
    exec(compile("from pathlib import Path\n" + code, "docs snippet", "exec"), scope)  # noqa: S102 - the docs' own example
    summary = json.loads((run_dir / "summary.json").read_text())
    assert scope["result"][0] == pytest.approx(summary["central_acc"], abs=1e-9)
