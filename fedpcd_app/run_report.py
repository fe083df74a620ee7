"""What a finished run leaves to look at (run-config ``figures``).

With ``figures = "auto"`` (the default) the ServerApp ends every run, on either engine and
under ``flwr run``, by writing into its ``output-dir``:

* ``report.md`` / ``report.csv``: :func:`fedpcd_app.report.report` of the run (final mean,
  worst-10 %, Jain, rounds to the target, ...);
* ``figures/client_hist.png``: the final per-client accuracy histogram,
  ``figures/convergence.png``: the mean and worst-10 % (W₁₀) accuracy per evaluation round,
  ``figures/heatmap.png``: every client's accuracy at every evaluation round
  (:mod:`fedpcd_app.figures`' own functions, for one run).

``figures = "none"`` writes nothing (a sweep's runs: ``python -m fedpcd_app.sweep`` sets it
and draws the sweep's report and figures once, at its end). A figure that cannot be drawn
is a warning, never a failed run.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fedcore.config import RunConfig

KEY = "figures"
CHOICES = ("auto", "none")
FIGURES = ("client_hist.png", "convergence.png", "heatmap.png")

log = logging.getLogger("fedpcd")


def enabled(cfg: RunConfig) -> bool:
    return cfg.get_choice(KEY, CHOICES, "auto") == "auto"


def write(out_dir: str | Path) -> list[Path]:
    """``report.md``/``report.csv`` and the run's figures (``figures/``) in ``out_dir``, which
    holds a finished run (its ``summary.json``); the paths written."""
    from fedpcd_app import figures
    from fedpcd_app.report import load_runs, report

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


def write_quietly(out_dir: str | Path) -> list[Path]:
    """:func:`write`, with any failure logged as one warning (the run's results stand)."""
    try:
        paths = write(out_dir)
    except Exception as exc:  # noqa: BLE001 - a figure must not fail a finished run
        log.warning("report/figures not written: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return []
    log.info("report and figures: %s, %s/", paths[0], Path(out_dir) / "figures")
    return paths
