"""The in-process entry point fails fast and quietly: an output-dir that
cannot be written is one line before anything loads, Ctrl-C is one line and exit 130, the log
prefix names the level and the method, the ETA leaves out the first round's start-up; and a
Ctrl-C stops the test suite itself (no test takes it for an error and goes on)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from fedcore.config import ConfigError, resolve
from fedpcd_app.runtime import simulate
from tests.helpers import ctrl_c, interruptible, read_until

ROOT = Path(__file__).resolve().parent.parent


def test_an_unwritable_output_dir_is_one_line_before_the_run(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for bad in ("/proc/fedpcd-out", str(blocker / "run")):
        code = simulate.main(["--workers", "0", "--run-config", f"output-dir='{bad}'"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "'output-dir'" in err, err


@pytest.mark.slow
def test_the_log_names_the_method_and_the_eta_leaves_out_the_first_round(tmp_path, capfd):
    simulate.simulate({"method": "fedprox", "num-clients": 2, "num-server-rounds": 3, "eval-every": 0,
                       "output-dir": str(tmp_path / "run")}, workers=0)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if re.match(r"\d\d:\d\d:\d\d [A-Z]+ \[", ln)]
    assert lines and all("[fedprox]" in ln for ln in lines), lines
    assert all(ln.split()[1] == "INFO" for ln in lines if "round" in ln), lines  # every line carries its level
    rounds = {int(m.group(1)): ln for ln in lines if (m := re.search(r"round +(\d+)/3:", ln))}
    assert "ETA" not in rounds[1] and "ETA" in rounds[2], rounds  # round 1 carries the start-up


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    with interruptible([sys.executable, "-m", "fedpcd_app.simulate", "--workers", "0", "--run-config",
                        f"num-clients=2 num-server-rounds=500 eval-every=0 output-dir='{tmp_path / 'run'}'"],
                       cwd=ROOT, env=env) as proc:
        seen = read_until(proc.stderr, r"round +1/500")
        _, err = ctrl_c(proc, timeout=120)
    assert proc.returncode == 130, "".join(seen[-10:]) + err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted: "), err
    assert len([ln for ln in err.splitlines() if not re.match(r"\d\d:\d\d:\d\d [A-Z]+ \[", ln)]) == 1, err


def test_a_one_line_error_ends_flowers_report_of_it(tmp_path):
    """The ServerApp's ConfigError leaves main() and Flower logs it the way
    flwr 1.42's simulation process does (the exception with its traceback, then the exit-code
    message): the traceback is left out and the app's one line is the last line."""
    import io
    from logging import ERROR

    from flwr.common.logger import console_handler
    from flwr.common.logger import log as flwr_log

    from fedpcd_app.runtime.grid import run_local
    from fedpcd_app.server.server_app import make_server_app

    with pytest.raises(ConfigError) as err:
        run_local(make_server_app(), "client_app.client_app:app", 2, workers=0,
                  run_config={**resolve({"output-dir": str(tmp_path)}), "method": "no-such-method"})
    stream, old = io.StringIO(), console_handler.stream
    console_handler.stream = stream
    try:
        flwr_log(ERROR, "%s raised an exception", "Simulation", exc_info=err.value)
        flwr_log(ERROR, "Exit Code: 700\nAn unhandled exception occurred when running the simulation.")
    finally:
        console_handler.stream = old
    lines = stream.getvalue().strip().splitlines()
    assert "Traceback" not in stream.getvalue() and "raised an exception" not in stream.getvalue(), lines
    assert lines[-1] == f"error: {err.value}" and "'method'" in lines[-1] and "\n" not in str(err.value), lines
    assert lines[0].endswith("Exit Code: 700")  # Flower's own message stays, before it


def test_every_log_line_carries_its_level(capfd):
    from fedpcd_app.server.logs import log, setup_logging

    setup_logging()
    log.info("progress")
    log.warning("a warning")
    err = capfd.readouterr().err.splitlines()
    assert re.match(r"\d\d:\d\d:\d\d INFO \[[\w-]+\] progress$", err[-2]), err
    assert re.match(r"\d\d:\d\d:\d\d WARNING \[[\w-]+\] a warning$", err[-1]), err


@pytest.mark.slow
def test_ctrl_c_stops_the_suite_inside_a_run(tmp_path):
    """pytest over two tests, the first inside a long in-process run: Ctrl-C there ends the
    session (exit 2, the interrupt reported, the second test never runs)."""
    (tmp_path / "test_two.py").write_text(
        "from fedpcd_app.runtime import simulate\n\n"
        "def test_long(tmp_path):\n"
        "    simulate.simulate({'num-clients': 2, 'num-server-rounds': 500, 'eval-every': 0, 'figures': 'none',\n"
        "                       'output-dir': str(tmp_path / 'run')}, workers=0)\n\n"
        "def test_after():\n"
        "    print('THE SECOND TEST RAN')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}
    with interruptible([sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        str(tmp_path / "test_two.py")], cwd=tmp_path, env=env) as proc:
        read_until(proc.stderr, r"round +1/500")
        out, err = ctrl_c(proc, timeout=120)
    assert proc.returncode == 2, out[-2000:] + err[-2000:]
    assert "THE SECOND TEST RAN" not in out and "Interrupted" in out + err, out[-2000:]


def test_the_interrupts_the_app_raises_are_keyboard_interrupts():
    """What a Ctrl-C (or SIGTERM) becomes inside the app stops a caller's loop as Ctrl-C does: the
    `flwr run` driver's Interrupted was an Exception, so a test runner counted it as one failed
    test and went on with the next."""
    from fedpcd_app.runtime.flwr_run import Interrupted
    from fedpcd_app.server.divergence import RunInterrupted

    assert issubclass(Interrupted, KeyboardInterrupt) and issubclass(RunInterrupted, KeyboardInterrupt)
    assert not issubclass(Interrupted, Exception)
