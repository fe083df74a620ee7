"""The end-of-run report (``report.md`` and the run's figures), drawn by
:mod:`fedpcd_app.analysis.run_report` in a process of its own, started with the run so that
its imports overlap the rounds."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("fedpcd")

def _report_command(*args: str) -> tuple[list[str], Any]:
    import sys
    from pathlib import Path

    app_root = Path(__file__).resolve().parents[2]  # this app's copy (flwr run installs one)
    return [sys.executable, "-m", "fedpcd_app.analysis.run_report", *args], app_root


def start_report_drawer():
    """The process that will draw the run's report (:mod:`fedpcd_app.analysis.run_report`
    ``--wait``), started when the run starts: it imports matplotlib and the reporting modules
    while the rounds run, then waits for the run's folder on its stdin (:func:`draw_report`).
    Its own session: a Ctrl-C meant for the run does not reach it; it exits when its stdin
    closes (the run ended without a report, or died)."""
    import subprocess

    cmd, cwd = _report_command("--wait")
    try:
        return subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError:  # no process to spare now: draw_report starts one at the end
        return None


def draw_report(out_dir, drawer=None) -> None:
    """``report.md`` and the run's figures in ``out_dir`` (:mod:`fedpcd_app.analysis.run_report`, in a
    process of its own: ``drawer``, started ahead by :func:`start_report_drawer`, else one started
    now); the files exist when this returns. A failure there is one warning, the run's results stand."""
    import subprocess

    if drawer is not None:
        try:
            out, err = drawer.communicate(f"{out_dir}\n")
        except OSError:  # it died before reading (its stderr then says why)
            drawer.kill()
            out, err = "", (drawer.stderr.read() if drawer.stderr else "")
            drawer.wait()
        returncode = drawer.returncode
    else:
        cmd, cwd = _report_command(str(out_dir))
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
        out, err, returncode = proc.stdout, proc.stderr, proc.returncode
    lines = (out if returncode == 0 else err).strip().splitlines()
    message = lines[-1] if lines else f"exit code {returncode}"
    if returncode == 0:
        log.info("%s", message)
    else:
        log.warning("%s", message)
