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
<output-dir>`` in a process of its own (:func:`draw`): matplotlib stays out of the run's
process, and the reporting modules (which read sweeps) stay out of the ServerApp's imports.
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m fedpcd_app.analysis.run_report <output-dir of a finished run>", file=sys.stderr)
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
