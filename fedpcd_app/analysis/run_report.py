"""What a finished run leaves to look at (run-config ``figures``).

With ``figures = "auto"`` (the default) the ServerApp ends every run, on either engine and
under ``flwr run``, by writing into its ``output-dir``:

* ``report.md`` / ``report.csv``: :func:`fedpcd_app.analysis.report.report` of the run (final mean,
  worst-10 %, Jain, rounds to the target, ...);
* ``figures/client_hist.png``: the final per-client accuracy histogram,
  ``figures/convergence.png``: the mean and worst-10 % (W₁₀) accuracy per evaluation round,
  ``figures/heatmap.png``: every client's accuracy at every evaluation round
  (:mod:`fedpcd_app.analysis.figures`' own functions, for one run).

``figures = "none"`` writes nothing (a sweep's runs: ``python -m fedpcd_app.sweep`` sets it
and draws the sweep's report and figures once, at its end). A figure that cannot be drawn
is a warning, never a failed run. The ServerApp runs ``python -m fedpcd_app.analysis.run_report
--wait`` in a process of its own, started with the run (``start_report_drawer`` of
:mod:`fedpcd_app.server.server_app`): it imports matplotlib and the reporting modules while the
rounds run and draws once the run writes its folder on its stdin, so the run returns about the
figures' drawing time after its summary, with the files written. matplotlib stays out of the
run's process, the reporting modules (which read sweeps) out of the ServerApp's imports, and
torch and flwr out of this process (a test checks it: their imports cost more than the drawing).
"""

from __future__ import annotations

import sys
from pathlib import Path

FIGURES = ("client_hist.png", "convergence.png", "heatmap.png")


def write(out_dir: str | Path) -> list[Path]:
    """``report.md``/``report.csv`` and the run's figures (``figures/``) in ``out_dir``, which
    holds a finished run (its ``summary.json``); the paths written."""
    from fedpcd_app.analysis import figures
    from fedpcd_app.analysis.report import load_runs, report

    out = Path(out_dir)
    md, csv_path = report(out)
    runs = load_runs(out)
    chosen = figures._chosen(runs, [])  # the run, keyed as the figures module keys methods
    setting = runs[0].setting
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    hist, conv, heat = (fig_dir / name for name in FIGURES)
    written = [md, csv_path, figures.client_histograms(chosen, setting, hist),
               figures.convergence(chosen, setting, conv)]
    drawn = figures.heatmap(chosen, next(iter(chosen)), setting, heat)  # None without evaluation rounds
    return written + ([drawn] if drawn is not None else [])


def _warm() -> None:
    """Import what :func:`write` needs (matplotlib, numpy, the reporting modules): the seconds of a
    run's report that are not drawing, paid by ``--wait`` while the run still trains."""
    from fedpcd_app.analysis import figures, report  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--wait"]:  # started with the run: import now, then the folder comes on stdin
        _warm()
        line = sys.stdin.readline().strip()
        if not line:  # stdin closed: the run ended without a report
            return 0
        args = [line]
    if len(args) != 1 or args[0].startswith("--"):
        print("usage: python -m fedpcd_app.analysis.run_report <output-dir of a finished run> | --wait "
              "(the folder then comes on stdin)", file=sys.stderr)
        return 2
    try:
        paths = write(args[0])
    except Exception as exc:  # noqa: BLE001 - one line: the run's results stand without them
        print(f"report/figures not written: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return 1
    print(f"report and figures: {paths[0]}, {Path(args[0]) / 'figures'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
