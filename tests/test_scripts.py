"""scripts/run_default.sh and scripts/flwr_run.sh: overrides compose key by key, and a bad
override stops the script with one line before anything starts."""

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


from fedcore import overrides as run_config  # noqa: E402 - what scripts/run_config.py runs
from tests.helpers import ctrl_c, interruptible, read_until  # noqa: E402 - after the sys.path set-up above


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
    ("output-dir='/proc/fedpcd-out/run'", "'output-dir'"),  # cannot be written (even by root)
    ("no-such-key=1", "no-such-key"),
    ("lr=-1", "'lr'"),
    ("method='nope'", "'method'"),
]


@pytest.mark.parametrize(("override", "needle"), BAD_SYNTAX)
def test_compose_rejects_what_flwr_would_misread(override, needle):
    with pytest.raises(run_config.OverrideError) as err:
        run_config.compose("method='fedpcd'", override)
    assert needle in str(err.value) and "\n" not in str(err.value)


# Through each script (a process and its imports, 5-10 s a case): one misread syntax and the config
# errors of two kinds; every other case of BAD_SYNTAX is the same function's, tested above in process,
# and BAD_CONFIG's others are load_config's (tests/test_config.py).
THROUGH_SCRIPTS = [BAD_SYNTAX[0], BAD_CONFIG[0], BAD_CONFIG[1]]


@pytest.mark.parametrize("script", ["run_default.sh", "flwr_run.sh"])
@pytest.mark.parametrize(("override", "needle"), THROUGH_SCRIPTS)
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


# -- flwr_run.sh: the run it started, its status, its processes ------------------------
def test_federation_config_overrides_the_defaults_key_by_key():
    from fedpcd_app.runtime.flwr_run import compose_federation

    assert compose_federation(20, []) == "num-supernodes=20 client-resources-num-cpus=1"
    assert compose_federation(20, ["num-supernodes=2"]) == "num-supernodes=2 client-resources-num-cpus=1"
    assert compose_federation(4, ["client-resources-num-cpus=2", "num-supernodes=3 client-resources-num-gpus=0.5"]) \
        == "num-supernodes=3 client-resources-num-cpus=2 client-resources-num-gpus=0.5"


def test_the_run_id_is_read_from_flwr_runs_json_output():
    from fedpcd_app.runtime.flwr_run import last_json

    out = 'Flower App configuration warnings...\n{"success": true, "run-id": "123", "fab-id": "x/y"}\n'
    assert last_json(out)["run-id"] == "123" and last_json("no json here") is None


def _marked_env(tmp_path: Path) -> tuple[dict[str, str], str]:
    """The scripts' environment with a marker every process it starts inherits (Ray's too)."""
    mark = uuid.uuid4().hex
    return {**_env(tmp_path), "FEDPCD_TEST_MARK": mark}, mark


def _processes_with(mark: str) -> list[int]:
    """Live processes whose environment holds the marker (zombies have none)."""
    found = []
    needle = f"FEDPCD_TEST_MARK={mark}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _tiny(out: Path, extra: str = "") -> list[str]:
    return ["--run-config", f"num-clients=2 num-server-rounds=1 eval-every=1 output-dir='{out}' {extra}"]


@pytest.mark.slow
def test_a_run_that_fails_is_a_failure(tmp_path):
    """A run that fails inside the ServerApp (here: client-data='node' on simulated nodes, which
    have no data of their own) exits 1 with the run's status and the app's one line last;
    before, the script printed the status of another run and exited 0."""
    env, mark = _marked_env(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPTS / "flwr_run.sh"),
                           *_tiny(out, "client-data='node' eval-mode='federated'")],
                          env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 1, log
    assert re.search(r"run \d+ status: finished:failed", proc.stdout), log
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "reported no data of its own" in last, log
    # the app's one line is the last line of the run's log (Flower's traceback left out)
    streamed = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("run ")]
    assert "reported no data of its own" in streamed[-1], log
    assert "Traceback" not in proc.stdout, log
    assert not (out / "summary.json").exists()
    assert _processes_with(mark) == []


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_everything_it_started(tmp_path):
    """SIGINT to the script's process group (a terminal's Ctrl-C) during round 1 or 2 of 50:
    exit 130 with one line, the run stopped, no process left (before: exit 0, 'completed', and
    the simulation went on as an orphan)."""
    env, mark = _marked_env(tmp_path)
    out = tmp_path / "out"
    with interruptible(["bash", str(SCRIPTS / "flwr_run.sh"), "--run-config",
                        f"num-clients=2 num-server-rounds=50 eval-every=0 output-dir='{out}'"], env=env) as proc:
        seen = read_until(proc.stdout, r"round +\d+/50")
        rest, err = ctrl_c(proc, timeout=300)
    assert proc.returncode == 130, "".join(seen[-20:]) + rest[-2000:] + err[-2000:]
    assert err.strip().splitlines()[-1].startswith("interrupted: run "), err[-2000:]
    assert "Traceback" not in err and "finished:completed" not in rest
    if (out / "summary.json").exists():  # the ServerApp got the stop as SIGTERM: an interrupted summary
        summary = json.loads((out / "summary.json").read_text())
        assert summary["complete"] is False and summary["incomplete_reason"].startswith("interrupted at round")
    assert _processes_with(mark) == []


@pytest.mark.slow
def test_two_runs_at_once_from_one_checkout_both_complete(tmp_path):
    """Two scripts started together, each with its own SuperLink and port: both complete with
    their own results; one runs 4 partitions on 2 SuperNodes and still samples all 4; the other
    is the README's `bash scripts/run_default.sh "method='fedavg'"` as a user types it (2 rounds, a
    further override, as overrides compose, into a temporary folder)."""
    env, mark = _marked_env(tmp_path)
    outs = [tmp_path / "a", tmp_path / "b"]
    cmds = [
        ["bash", str(SCRIPTS / "flwr_run.sh"), "--run-config",
         f"num-clients=4 fraction-train=1.0 num-server-rounds=1 output-dir='{outs[0]}'",
         "--federation-config", "num-supernodes=2"],
        _readme_example() + ["num-server-rounds=2", f"output-dir='{outs[1]}'"],
    ]
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (o, e) in zip(procs, results):
        assert p.returncode == 0, o[-3000:] + e[-2000:]
        assert re.search(r"run \d+ status: finished:completed", o), o[-3000:]
    ids = [re.search(r"run (\d+) status", o).group(1) for o, _ in results]
    assert ids[0] != ids[1]
    a, b = (json.loads((d / "summary.json").read_text()) for d in outs)
    assert a["config"]["num-clients"] == 4
    assert b["method"] == "fedavg" and b["rounds"] == 2  # the README's override, then the later one
    assert b["config"]["method"] == "fedavg" and b["config"]["num-server-rounds"] == 2
    from fedpcd_app.server.results import read_rounds

    assert len(read_rounds(outs[1])) == 2 and 0.0 <= b["mean_acc"] <= 1.0
    assert (outs[1] / "report.md").is_file() and (outs[1] / "figures" / "client_hist.png").is_file()  # flwr run too
    rows = (outs[0] / "clients.csv").read_text().splitlines()
    header = rows[0].split(",")
    sampled = [int(r.split(",")[header.index("times_sampled")]) for r in rows[1:]]
    assert sampled == [1, 1, 1, 1]  # every partition, though only 2 SuperNodes
    assert _processes_with(mark) == []


def _fake_python(tmp_path: Path) -> Path:
    """A ``python3`` whose ``-m venv DIR`` makes DIR/bin/python: a shim logging its arguments
    (what setup.sh asks pip to do) and exiting 0, so the install's steps run in seconds."""
    fake = tmp_path / "python3"
    fake.write_text('#!/usr/bin/env bash\nif [ "$1" = --version ]; then echo "Python 3.fake"; exit 0; fi\n'
                    'mkdir -p "$3/bin"\nprintf \'#!/usr/bin/env bash\\necho "$*" >> "%s"\\n\' '
                    f'"{tmp_path / "pip.log"}" > "$3/bin/python"\nchmod +x "$3/bin/python"\n')
    fake.chmod(0o755)
    return fake


def test_setup_says_each_step(tmp_path):
    """The first install names each step on stderr (it takes minutes: no silence), keeps pip -q
    without a terminal (CI logs), and a second call says it is up to date, installing nothing."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "setup.sh").write_text((SCRIPTS / "setup.sh").read_text())
    (checkout / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    env = {k: v for k, v in os.environ.items() if k != "FEDPCD_VENV"}
    env["PYTHON"] = str(_fake_python(tmp_path))

    def setup() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "scripts/setup.sh"], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=60)

    first = setup()
    assert first.returncode == 0, first.stderr
    steps = [line for line in first.stderr.splitlines() if line.startswith("setup: ")]
    assert [s.split()[1] for s in steps] == ["creating", "installing", "done:"], first.stderr
    assert "Python 3.fake" in steps[0] and "pip -q" in steps[1]
    assert (tmp_path / "pip.log").read_text().split() == ["-m", "pip", "install", "-q", "-e", ".[all,test,docs]"]
    second = setup()
    assert second.returncode == 0 and "up to date" in second.stderr, second.stderr
    assert len((tmp_path / "pip.log").read_text().splitlines()) == 1  # nothing installed again


def test_setup_installs_the_docs_extra_and_ci_builds_the_site_with_warnings_as_errors():
    assert '".[all,test,docs]"' in (ROOT / "scripts" / "setup.sh").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci and re.search(r"-m sphinx -W --keep-going .*docs build/docs/html", ci)
