"""Figures from fake run folders: every PNG is written, non-empty and a real image."""

import json

import matplotlib.image as mpimg
import numpy as np
import pytest

from fedpcd_app import figures
from tests.test_report import make_run


def _is_png_with_content(path):
    img = mpimg.imread(path)
    # a blank canvas has a single colour; a plot has axes, lines and text
    return path.stat().st_size > 5000 and img.ndim == 3 and len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 20


@pytest.fixture
def history_out(tmp_path):
    rng = np.random.default_rng(0)
    for seed in range(2):
        digits = {"dataset": "digits", "num-clients": 10, "dirichlet-alpha": 0.1}
        make_run(tmp_path, "digits", "fedavg", seed, list(rng.uniform(0.3, 0.9, 10)), extra=digits,
                 curve={10: 0.4, 20: 0.55, 30: 0.6})
        for h in (0, 2, 5):
            make_run(tmp_path, "digits", "fedpcd", seed, list(rng.uniform(0.4 + 0.05 * h, 0.9, 10)), extra=digits,
                     registered="fedpcd", grid={"fedpcd-history": h},
                     curve={10: 0.45, 20: 0.6, 30: 0.65 + 0.01 * h},
                     strategy={r: {"fedpcd-active": min(h, r) + seed, "fedpcd-constraints": 5} for r in range(1, 31)})
    (tmp_path / "digits" / "fedavg" / "base" / "seed0" / "availability.json").write_text(
        json.dumps({"probabilities": list(np.linspace(0.05, 0.5, 10))}))
    return tmp_path


def test_all_figures_written_and_non_empty(history_out):
    paths = figures.make_figures(history_out)
    names = sorted(p.name for p in paths)
    assert names == sorted(f"digits_{k}.png" for k in
                           ("convergence", "client_hist", "frontier", "history", "labels", "availability"))
    for p in paths:
        assert p.parent == history_out / "figures"
        assert _is_png_with_content(p), p


def test_mean_active_constraints_reads_strategy_records(history_out):
    run = next(r for r in figures.load_runs(history_out)
               if r.method == "fedpcd" and r.grid == {"fedpcd-history": 5} and r.seed == 1)
    # rounds 1..30 of min(5, r) + 1: (1+2+3+4+5 + 25·5)/30 + 1
    assert figures.mean_active(run) == pytest.approx((15 + 125) / 30 + 1)


def test_no_history_or_availability_figure_without_their_data(tmp_path):
    for seed in range(2):
        make_run(tmp_path, "s", "fedavg", seed, [0.5, 0.7, 0.9])
    names = {p.name for p in figures.make_figures(tmp_path)}
    assert {"s_convergence.png", "s_client_hist.png", "s_frontier.png", "s_labels.png"} == names


def test_history_figure_needs_several_windows(tmp_path):
    for seed in range(2):
        make_run(tmp_path, "s", "fedpcd", seed, [0.5, 0.7, 0.9], registered="fedpcd", extra={"num-clients": 3},
                 grid={"fedpcd-history": 10})
    run_paths = {p.name for p in figures.make_figures(tmp_path)}
    assert "s_history.png" not in run_paths and "s_convergence.png" in run_paths
