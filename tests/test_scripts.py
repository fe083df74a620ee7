"""scripts/run_default.sh and scripts/flwr_run.sh: overrides compose key by key, and a bad
override stops the script with one line before anything starts."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


from fedcore import overrides as run_config  # noqa: E402 - what scripts/run_config.py runs


def _env(tmp_path: Path) -> dict[str, str]:
    # The environment running these tests, used as is (setup.sh installs nothing into it);
    # a private FLWR_HOME so that no SuperLink of another checkout is touched.
    return {**os.environ, "FEDPCD_VENV": sys.prefix, "FLWR_HOME": str(tmp_path / "flwr_home"),
            "FEDPCD_OUTPUT_ROOT": str(tmp_path / "outputs")}


@pytest.mark.parametrize(("args", "expected"), [
    # the README's case: the script's default method is replaced, not repeated
    (["method='fedpcd' output-dir='/o'", "method='fedavg'"], "method='fedavg' output-dir='/o'"),
    (["method='fedpcd' seed=1", "seed=2 lr=0.05", "num-server-rounds=2"],
     "method='fedpcd' seed=2 lr=0.05 num-server-rounds=2"),
    (["seed=1 seed=3"], "seed=3"),
    (["", "  "], ""),
    (["output-dir='/a b/c' tensorboard=true fedpcd-eps=1e-12"],
     "output-dir='/a b/c' tensorboard=true fedpcd-eps=1e-12"),
    (['dataset="digits"', "dataset='mnist'"], "dataset='mnist'"),
])
def test_overrides_compose_key_by_key(args, expected):
    assert run_config.render(run_config.compose(*args)) == expected


def test_a_toml_preset_composes_like_a_string(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text("method = \"craft\"\nnum-server-rounds = 5\ntensorboard = false\nlr = 0.5\nnote = \"it's\"\n")
    merged = run_config.compose("method='fedpcd' seed=1", str(preset), "lr=0.1")
    assert run_config.render(merged) == (
        "method='craft' seed=1 num-server-rounds=5 tensorboard=false lr=0.1 note=\"it's\"")


# (override, text the one-line error must contain): what flwr would misread or reject
BAD_SYNTAX = [
    ("method=fedpcd", "\"method='fedpcd'\""),            # unquoted string: the fix, quoted
    ("lr=abc", "\"lr='abc'\""),
    ("tensorboard=yes", "tensorboard=true or tensorboard=false"),
    ("tensorboard=True", "tensorboard=true or tensorboard=false"),
    ("method = 'fedpcd'", "without spaces around '='"),  # flwr would silently drop it
    ("seed=1 fedpcd", "'fedpcd'"),
    ("output-dir='/tmp/x", "unbalanced quote"),
    ("lr=[0.1,0.2]", "is a list"),
]
# well-formed overrides that the config validation rejects (before any SuperLink or Ray start)
BAD_CONFIG = [
    ("no-such-key=1", "no-such-key"),
    ("lr=-1", "'lr'"),
    ("method='nope'", "'method'"),
]


@pytest.mark.parametrize(("override", "needle"), BAD_SYNTAX)
def test_compose_rejects_what_flwr_would_misread(override, needle):
    with pytest.raises(run_config.OverrideError) as err:
        run_config.compose("method='fedpcd'", override)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("script", ["run_default.sh", "flwr_run.sh"])
@pytest.mark.parametrize(("override", "needle"), BAD_SYNTAX + BAD_CONFIG)
def test_bad_override_is_one_line_before_anything_starts(tmp_path, script, override, needle):
    argv = ["bash", str(SCRIPTS / script)]
    argv += [override] if script == "run_default.sh" else ["--run-config", override]
    proc = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.stdout, err)
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert needle in err, err
    assert "Traceback" not in proc.stdout + err and "run status" not in proc.stdout
    assert not (tmp_path / "flwr_home").exists() or not any((tmp_path / "flwr_home").iterdir())


def _readme_example() -> list[str]:
    """The README's `bash scripts/run_default.sh "..."` example, as a user would type it."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"`(bash scripts/run_default\.sh \"[^`]+\")`", readme)
    assert match, "the README no longer shows a run_default.sh example with an override"
    return shlex.split(match.group(1))


def test_readme_example_overrides_the_default_method():
    argv = _readme_example()
    merged = run_config.compose("method='fedpcd' output-dir='/o'", *argv[2:])
    assert merged["method"] == "'fedavg'" and merged["output-dir"] == "'/o'"


def _foreign_superlink() -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", 39091)) == 0


@pytest.mark.slow
def test_readme_example_runs_as_written(tmp_path):
    """`bash scripts/run_default.sh "method='fedavg'"` through flwr run, 2 rounds (a further
    override, as overrides compose), into a temporary folder."""
    if _foreign_superlink():
        pytest.skip("another local SuperLink holds 127.0.0.1:39091 (flwr run's fixed port)")
    out = tmp_path / "out"
    argv = _readme_example() + ["num-server-rounds=2", f"output-dir='{out}'"]
    proc = subprocess.run(argv, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run status: finished:completed" in proc.stdout, log
    assert proc.returncode == 0, log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "fedavg" and summary["rounds"] == 2, log
    assert summary["config"]["method"] == "fedavg" and summary["config"]["num-server-rounds"] == 2
