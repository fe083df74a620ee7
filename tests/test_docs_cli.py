"""What the docs say about the commands, held by the commands themselves (issue 44).

* ``--help`` names the command a user types (``usage: python -m fedpcd_app.simulate``, not
  ``simulate.py``) for every ``python -m fedpcd_app.<command>``;
* ``--workers``' help states the default the code applies (``auto``);
* a nonexistent ``dataset-path`` and a ``resume-from`` of a finished run are refused in one line
  before a SuperLink, Ray or a worker starts, by ``python -m fedpcd_app.flwr_run``
  (``scripts/flwr_run.sh``, ``scripts/run_default.sh``) and ``python -m fedpcd_app.simulate``
  (both engines). "Before anything starts" is asserted by replacing the launchers with one
  that fails the test when called, never by timing."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from fedpcd_app.runtime import flwr_run, grid
from fedpcd_app.runtime import simulate as runtime_simulate
from tests.helpers import fedavg_config, run_honest

PROJECT = Path(__file__).resolve().parent.parent
COMMANDS = {  # the published entry point -> the module whose main() parses its arguments
    "simulate": "fedpcd_app.runtime.simulate",
    "flwr_run": "fedpcd_app.runtime.flwr_run",
    "sweep": "fedpcd_app.analysis.sweep",
    "report": "fedpcd_app.analysis.report",
    "figures": "fedpcd_app.analysis.figures",
    "robustness": "fedpcd_app.analysis.robustness",
}


# -- --help names the command ---------------------------------------------------------------------

def test_every_published_command_is_listed():
    shims = {p.stem for p in (PROJECT / "fedpcd_app").glob("*.py")} - {"__init__", "server_app"}
    assert shims == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_names_the_command_a_user_types(command, capsys):
    main = importlib.import_module(COMMANDS[command]).main
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m fedpcd_app.{command} ")


def test_simulate_help_from_the_shell():
    out = subprocess.run([sys.executable, "-m", "fedpcd_app.simulate", "--help"], cwd=PROJECT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m fedpcd_app.simulate ")


def test_workers_help_states_the_default_the_code_applies(capsys):
    with pytest.raises(SystemExit):
        runtime_simulate.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default 'auto'" in text
    # 'auto' is what no --workers means: the same value (None), chosen by auto_workers()
    assert runtime_simulate._workers_arg("auto") is None


# -- refused in one line before anything starts -----------------------------------------------------

@pytest.fixture
def no_launch(monkeypatch):
    """Every launcher replaced by one that records it was called."""
    started = []

    def launcher(name):
        def start(*args, **kwargs):
            started.append(name)
            raise AssertionError(f"{name} started before the config was refused")
        return start

    monkeypatch.setattr(flwr_run, "run_app", launcher("flwr run (SuperLink, Ray)"))
    monkeypatch.setattr(flwr_run, "LocalSuperLink", launcher("SuperLink"))
    monkeypatch.setattr(grid, "run_local", launcher("local engine"))
    return started


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 4-round FedAvg run with checkpoints at rounds 2 and 4 (fake grid: no processes)."""
    exp = run_honest(fedavg_config(tmp_path_factory.mktemp("finished") / "run"))
    return exp.writer.dir


def _resume_config(finished: Path, out: Path) -> str:
    return (f"method='fedavg' num-clients=6 fraction-train=0.5 num-server-rounds=4 eval-every=1 checkpoint-every=2 "
            f"figures='none' resume-from='{finished}' output-dir='{out}'")


def _missing_data_config(tmp_path: Path) -> str:
    return f"dataset-path='{tmp_path / 'no-such-folder'}' output-dir='{tmp_path / 'out'}'"


def _one_line(captured, *words: str) -> str:
    text = (captured.err + captured.out).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    for word in words:
        assert word in lines[0]
    return lines[0]


def _runs(kind: str, config: str) -> int:
    if kind == "flwr_run":
        return flwr_run.main(["--run-config", config])
    engine = kind.split(":")[1]
    return runtime_simulate.main(["--engine", engine, "--run-config", config])


KINDS = ["flwr_run", "simulate:local", "simulate:ray"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_dataset_path_is_refused_before_anything_starts(kind, tmp_path, no_launch, capsys):
    code = _runs(kind, _missing_data_config(tmp_path))
    assert no_launch == []
    assert code == 2
    _one_line(capsys.readouterr(), "dataset-path", "no-such-folder")


@pytest.mark.parametrize("kind", KINDS)
def test_resuming_a_finished_run_is_refused_before_anything_starts(kind, finished_run, tmp_path, no_launch, capsys):
    code = _runs(kind, _resume_config(finished_run, tmp_path / "again"))
    assert no_launch == []
    assert code == 2
    _one_line(capsys.readouterr(), "num-server-rounds", "already at round 4", "above 4")
    assert not (tmp_path / "again").exists()


def test_resuming_an_unfinished_run_still_passes_the_check(finished_run, tmp_path):
    # Prepare: the same run asked for 6 rounds: 2 are left, the check lets it through
    from fedcore.config import parse_overrides, resolve
    from fedpcd_app.server.config import check

    raw = resolve(parse_overrides(_resume_config(finished_run, tmp_path / "more").replace(
        "num-server-rounds=4", "num-server-rounds=6")))
    assert check(raw).resume_from == str(finished_run)
