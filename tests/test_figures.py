"""Figures from fake run folders: every PNG is written, non-empty and a real image."""

import json

import matplotlib.image as mpimg
import numpy as np
import pytest

from fedpcd_app.analysis import figures
from tests.helpers import make_run


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
                           ("convergence", "client_hist", "frontier", "history", "labels", "availability",
                            "client_ecdf", "paired_scatter", "acc_vs_size", "heatmap"))
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
    assert {f"s_{k}.png" for k in ("convergence", "client_hist", "frontier", "labels", "client_ecdf", "acc_vs_size",
                                   "heatmap")} == names  # one method: no paired scatter


def test_history_figure_needs_several_windows(tmp_path):
    for seed in range(2):
        make_run(tmp_path, "s", "fedpcd", seed, [0.5, 0.7, 0.9], registered="fedpcd", extra={"num-clients": 3},
                 grid={"fedpcd-history": 10})
    run_paths = {p.name for p in figures.make_figures(tmp_path)}
    assert "s_history.png" not in run_paths and "s_convergence.png" in run_paths


# -- the figures' content, inspected before saving ------------------------------------------
@pytest.fixture
def drawn(monkeypatch):
    """Figures by file name, kept open instead of written."""
    figs = {}

    def keep(fig, path):
        fig.canvas.draw()
        figs[path.name] = fig
        return path

    monkeypatch.setattr(figures, "save_figure", keep)
    yield figs
    for fig in figs.values():
        figures.plt.close(fig)


BASE_ACC = [0.5, 0.6, 0.7, 0.9]


@pytest.fixture
def short_out(tmp_path):
    """3 rounds (an evaluation each round), 2 seeds: FedAvg, FedPCD at a grid point, and an
    entry identical to FedPCD (its points and curves coincide)."""
    for seed in range(2):
        make_run(tmp_path, "s", "fedavg", seed, BASE_ACC, rounds=3, curve={1: 0.3, 2: 0.5, 3: 0.675})
        for name in ("fedpcd", "twin"):
            make_run(tmp_path, "s", name, seed, [0.6, 0.6, 0.6, 0.9], registered="fedpcd", rounds=3,
                     grid={"fedpcd-tau": 0.02}, curve={1: 0.4, 2: 0.6, 3: 0.675})
    return tmp_path


def _legend_texts(fig):
    return [t.get_text() for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
            for t in leg.get_texts()]


def test_short_runs_get_integer_round_ticks(short_out, drawn):
    figures.make_figures(short_out)
    for ax in drawn["s_convergence.png"].axes[:2]:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    heat = drawn["s_heatmap.png"].axes[0]
    assert [t.get_text() for t in heat.get_xticklabels()] == ["1", "2", "3"]


@pytest.mark.parametrize("name", ["s_convergence.png", "s_client_ecdf.png", "s_frontier.png"])
def test_legends_name_the_grid_point(short_out, drawn, name):
    figures.make_figures(short_out)
    assert any("fedpcd [fedpcd-tau=0.02]" in t for t in _legend_texts(drawn[name])), _legend_texts(drawn[name])


@pytest.mark.parametrize("name", ["s_convergence.png", "s_client_ecdf.png"])
def test_identical_curves_are_named_in_the_legend(short_out, drawn, name):
    figures.make_figures(short_out)
    assert any(t.endswith("= fedpcd") and t.startswith("twin") for t in _legend_texts(drawn[name]))


def test_frontier_shows_a_point_that_coincides_with_another(short_out, drawn):
    figures.make_figures(short_out)
    fig = drawn["s_frontier.png"]
    ax = fig.axes[0]
    # the marker of each errorbar container: fedavg, fedpcd, twin
    centres = [tuple(np.round(c.lines[0].get_xydata()[0], 6)) for c in ax.containers]
    assert len(centres) == 3 and len(set(centres)) == 3, centres  # no marker hidden under another
    note = " ".join(t.get_text() for t in ax.texts)
    assert "fedpcd [fedpcd-tau=0.02] = twin [fedpcd-tau=0.02]" in note


def test_availability_uses_one_axis_and_its_legend_covers_no_data(history_out, drawn):
    figures.make_figures(history_out)
    fig = drawn["digits_availability.png"]
    assert len(fig.axes) == 1  # probabilities and sampled fractions on one scale
    ax = fig.axes[0]
    probs = np.linspace(0.05, 0.5, 10)
    sampled = np.array([(i % 3) * 5 for i in range(10)]) / 30
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= max(probs.max(), sampled.max())
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert not box.overlaps(ax.get_window_extent())


def test_paired_scatter_counts_clients_above_and_below_the_diagonal(short_out, drawn):
    figures.make_figures(short_out)
    titles = [ax.get_title() for ax in drawn["s_paired_scatter.png"].axes if ax.get_visible()]
    # per seed: 0.6 vs 0.5 better, vs 0.6 same, vs 0.7 worse, 0.9 vs 0.9 same; 2 seeds
    assert titles == [f"{n} [fedpcd-tau=0.02]\nclient-seeds better: 2, worse: 2, same: 4 (of 8)"
                      for n in ("fedpcd", "twin")]


def test_heatmap_rows_follow_the_baseline_order(tmp_path, drawn):
    make_run(tmp_path, "s", "fedavg", 0, [0.9, 0.5, 0.7], rounds=2, curve={1: 0.35, 2: 0.7})
    make_run(tmp_path, "s", "other", 0, [0.2, 0.4, 0.6], rounds=2, curve={1: 0.2, 2: 0.4})
    figures.make_figures(tmp_path, baseline="fedavg")
    fig = drawn["s_heatmap.png"]
    other = next(ax for ax in fig.axes if ax.get_title() == "other")
    # fedavg's final order (lowest first): clients 1, 2, 0; round 1 is half of round 2
    assert np.allclose(other.images[0].get_array(), [[20, 40], [30, 60], [10, 20]])
    assert [t.get_text() for t in other.get_yticklabels()] == ["1", "2", "0"]


def test_accuracy_vs_size_reports_spearman(tmp_path, drawn):
    make_run(tmp_path, "s", "fedavg", 0, [0.2, 0.4, 0.5, 0.9])  # num_train 10, 13, 16, 19: rising
    figures.make_figures(tmp_path)
    ax = drawn["s_acc_vs_size.png"].axes[0]
    assert ax.get_title().endswith("Spearman ρ = 1.00")
    assert np.allclose(ax.collections[0].get_offsets(), [[10, 20], [13, 40], [16, 50], [19, 90]])


def test_a_single_run_folder_gets_its_figures(tmp_path):
    folder = make_run(tmp_path, "", "fedavg", 0, [0.5, 0.7, 0.9], labels=False, folder=tmp_path / "run")
    names = {p.name for p in figures.make_figures(folder)}
    assert {"default_convergence.png", "default_heatmap.png", "default_client_ecdf.png"} <= names
    assert all((folder / "figures" / n).is_file() for n in names)


@pytest.mark.parametrize(("args", "needle"), [
    (["--baseline", "nope"], "--baseline 'nope' is not a method"),
    (["--methods", "fedavg,nope"], "--methods: 'nope' is not a method"),
])
def test_cli_errors_are_one_line(short_out, capsys, args, needle):
    assert figures.main([str(short_out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_methods_option_keeps_and_orders_entries(short_out, drawn):
    figures.make_figures(short_out, methods=["twin", "fedavg"])
    names = [t.get_text() for t in drawn["s_client_ecdf.png"].axes[1].get_yticklabels()]
    assert names == ["twin [fedpcd-tau=0.02]", "fedavg"]


def test_pareto_front_and_the_page_figures_are_drawn_from_the_csvs_alone(tmp_path, capsys):
    import csv as csv_mod

    # (mean, worst-10 %): (0.9, 0.2) and (0.8, 0.4) are on the front; (0.7, 0.3) and (0.85, 0.1) are dominated
    assert figures.pareto_front([(0.9, 0.2), (0.8, 0.4), (0.7, 0.3), (0.85, 0.1)]) == [0, 1]
    assert figures.pareto_front([(0.5, 0.5), (0.5, 0.5)]) == [0, 1]  # equal points dominate neither
    fields = ["setting", "method", "hyperparameters", "selected", "val_mean_acc_mean", "val_worst10_acc_mean"]
    with open(tmp_path / "report.csv", "w", newline="") as fh:
        w = csv_mod.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for i, (m, wst) in enumerate([(0.9, 0.2), (0.8, 0.4), (0.7, 0.3)]):
            w.writerow({"setting": "s", "method": "fedpcd", "hyperparameters": f"lr={i}", "selected": int(i == 0),
                        "val_mean_acc_mean": m, "val_worst10_acc_mean": wst})
    (tmp_path / "report_paired.csv").write_text(
        "setting,method,baseline,metric,num_seeds,mean_difference,ci95_low,ci95_high,p_holm\n"
        "s,fedpcd,fedavg,mean_acc,10,0.02,0.01,0.03,0.01\ns,fedpcd,fedavg,worst10_acc,2,0.05,-0.2,0.3,0.04\n")
    assert figures.main([str(tmp_path), "--page"]) == 0
    for name in ("forest.png", "pareto.png"):
        img = mpimg.imread(tmp_path / name)
        assert img.shape[0] > 100 and np.ptp(img) > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert figures.main([str(empty), "--page"]) == 2


def test_frontier_colours_do_not_repeat_for_many_methods():
    from matplotlib.colors import to_rgba

    for n in (3, 14, 25):
        colours = [to_rgba(c) for c in figures.distinct_colours(n)]
        assert len(set(colours)) == n


def _frontier_rows(n_methods=14, per_method=3):
    """report.csv rows: ``n_methods`` entries × ``per_method`` configurations (the middle one
    selected) and one unscored configuration (empty numbers)."""
    rows = []
    for m in range(n_methods):
        for k in range(per_method):
            rows.append({"setting": "s", "method": f"m{m}", "hyperparameters": f"lr={k}", "selected": str(int(k == 1)),
                         "mean_acc_mean": str(0.5 + 0.02 * m + 0.01 * k), "mean_acc_std": "0.01",
                         "worst10_acc_mean": str(0.2 + 0.01 * ((m * 7 + k * 3) % 11)), "worst10_acc_std": "0.02"})
    rows.append({"setting": "s", "method": "m0", "hyperparameters": "lr=9", "selected": "0", "mean_acc_mean": "",
                 "mean_acc_std": "", "worst10_acc_mean": "", "worst10_acc_std": ""})
    return rows


def test_configurations_frontier_styles_every_method_apart_and_draws_every_configuration(tmp_path, drawn):
    from matplotlib.colors import to_rgba

    rows = _frontier_rows()
    figures.configurations_frontier(rows, tmp_path / "frontier.png", split="test")
    fig = drawn["frontier.png"]
    ax_all, ax_zoom = fig.axes[:2]
    # every scored configuration drawn (faint), once per method in the method's colour and marker
    faint = [c for c in ax_all.collections if c.get_offsets().shape[0] and c.get_alpha() is not None
             and c.get_alpha() < 0.5]
    assert sum(c.get_offsets().shape[0] for c in faint) == 14 * 3
    assert {tuple(np.round(p, 6)) for c in faint for p in c.get_offsets()} == {
        (round(100 * float(r["mean_acc_mean"]), 6), round(100 * float(r["worst10_acc_mean"]), 6))
        for r in rows if r["mean_acc_mean"]}
    assert "1 unscored" in ax_all.get_title()
    # the 14 selections bold: one errorbar each, and one legend entry per method, no style repeated
    assert len(ax_all.containers) == 14 and len(ax_zoom.containers) == 14
    legend = ax_zoom.get_legend()
    entries = [h for h in legend.legend_handles if h.get_linestyle() == "None"]  # the methods; the fronts are lines
    styles = [(to_rgba(h.get_color()), h.get_marker()) for h in entries]
    assert len(styles) == 14 and len(set(styles)) == 14
    assert len({c for c, _ in styles}) == 14  # no colour shared
    assert [t.get_text() for t in legend.get_texts()][:14] == [f"m{m} [lr=1]" for m in range(14)]
    # the legend lies outside both axes: it covers no data
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    for ax in (ax_all, ax_zoom):
        assert not box.overlaps(ax.get_window_extent(renderer))
    # the Pareto fronts: every configuration's and the selections', each the non-dominated points
    pts = [(100 * float(r["mean_acc_mean"]), 100 * float(r["worst10_acc_mean"])) for r in rows if r["mean_acc_mean"]]
    sel = [(100 * float(r["mean_acc_mean"]), 100 * float(r["worst10_acc_mean"])) for r in rows if r["selected"] == "1"]
    fronts = [sorted(map(tuple, np.round(line.get_xydata(), 6))) for line in ax_all.lines
              if line.get_linestyle() in (":", "-") and line.get_marker() == "o"]
    expect = [sorted(tuple(np.round(p, 6)) for p in (xs[i] for i in figures.pareto_front(xs))) for xs in (pts, sel)]
    assert fronts == expect


def test_page_frontier_option_writes_frontier_png_from_report_csv(tmp_path):
    import csv as csv_mod

    rows = [{**r, "val_mean_acc_mean": r["mean_acc_mean"], "val_worst10_acc_mean": r["worst10_acc_mean"]}
            for r in _frontier_rows(3, 2)]  # the page's frontier reads the validation split (issue 52)
    with open(tmp_path / "report.csv", "w", newline="") as fh:
        w = csv_mod.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert figures.main([str(tmp_path), "--page"]) == 0
    assert not (tmp_path / "frontier.png").exists()  # only on request: the other pages keep their files
    assert figures.main([str(tmp_path), "--page", "--frontier"]) == 0
    assert _is_png_with_content(tmp_path / "frontier.png")
    assert figures.main([str(tmp_path), "--frontier"]) == 2


def test_page_forest_keeps_the_worst10_selection_apart(tmp_path, drawn):
    # the same comparison label under two selections (different grid points) never shares one forest
    head = "setting,method,hyperparameters,baseline,metric,num_seeds,mean_difference,ci95_low,ci95_high,p_holm\n"
    (tmp_path / "report_paired_vs_fedavg.csv").write_text(
        head + "s,fedpcd,lr=0.1,fedavg,mean_acc,10,0.02,0.01,0.03,0.01\n")
    (tmp_path / "report_paired_worst10_vs_fedavg.csv").write_text(
        head + "s,fedpcd,lr=0.3,fedavg,mean_acc,10,-0.05,-0.08,-0.02,0.02\n"
        "s,ditto,lr=0.3,fedavg,mean_acc,10,0.1,0.0,0.2,0.3\n")
    names = [p.name for p in figures.page_figures(tmp_path)]
    assert names == ["forest.png", "forest_worst10.png"]

    def drawn_means(fig):
        return sorted(round(line.get_xdata()[0], 6) for line in fig.axes[0].lines if line.get_marker() == "o")

    assert drawn_means(drawn["forest.png"]) == [2.0]
    assert drawn_means(drawn["forest_worst10.png"]) == [-5.0, 10.0]


def test_page_figures_are_per_setting_and_validation_only(tmp_path, drawn):
    """Issue 52: a page of two settings gets one Pareto figure and one forest per setting (never one
    front pooled over settings), drawn from the validation columns; a CSV without them gets none."""
    import csv as csv_mod

    fields = ["setting", "method", "hyperparameters", "selected", "mean_acc_mean", "worst10_acc_mean",
              "val_mean_acc_mean", "val_worst10_acc_mean"]
    with open(tmp_path / "report.csv", "w", newline="") as fh:
        w = csv_mod.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for setting, shift in (("skewed", 0.0), ("uniform", 0.3)):
            for i, (m, wst) in enumerate([(0.5, 0.1), (0.4, 0.3)]):
                # the test split says the opposite of the validation split: the figure must not read it
                w.writerow({"setting": setting, "method": "fedavg", "hyperparameters": f"lr={i}",
                            "selected": int(i == 0), "mean_acc_mean": 1 - m, "worst10_acc_mean": 1 - wst,
                            "val_mean_acc_mean": m + shift, "val_worst10_acc_mean": wst + shift})
    head = "setting,method,baseline,metric,num_seeds,mean_difference,ci95_low,ci95_high,p_holm\n"
    (tmp_path / "report_paired_vs_fedavg.csv").write_text(
        head + "skewed,fedpcd,fedavg,mean_acc,10,0.02,0.01,0.03,0.01\n"
        "uniform,fedpcd,fedavg,mean_acc,10,0.01,-0.01,0.03,1\n")
    names = sorted(p.name for p in figures.page_figures(tmp_path, frontier=True))
    assert names == ["forest_skewed.png", "forest_uniform.png", "frontier_skewed.png", "frontier_uniform.png",
                     "pareto_skewed.png", "pareto_uniform.png"]
    points = sorted(tuple(np.round(p, 6)) for c in drawn["pareto_uniform.png"].axes[0].collections
                    for p in c.get_offsets())
    assert (80.0, 40.0) in points and (50.0, 90.0) not in points  # validation numbers of its own setting
    with pytest.raises(ValueError, match="2 settings"):
        figures.pareto(list(csv_mod.DictReader(open(tmp_path / "report.csv"))), tmp_path / "x.png")
    rows = [{k: v for k, v in r.items() if not k.startswith("val_")}
            for r in csv_mod.DictReader(open(tmp_path / "report.csv"))]
    assert figures.pareto(rows, tmp_path / "y.png", "skewed") is None  # no validation columns: no front


def test_the_declared_iterates_forest_is_forest_png(tmp_path, drawn):
    """A page declaring the averaged iterate (FedeRage's) keeps the last beside it in
    ``report_paired_last_vs_*.csv``: the declared iterate's forest is ``forest.png`` and the other's
    ``forest_last.png`` (it was the other way round: the last iterate was taken for the declared one)."""
    head = "setting,method,baseline,metric,num_seeds,mean_difference,ci95_low,ci95_high,p_holm,iterate\n"
    row = "default,federage,fedavg,mean_acc,5,0.01,-0.01,0.03,1,"
    (tmp_path / "report_paired_vs_fedavg.csv").write_text(head + row + "averaged\n")
    (tmp_path / "report_paired_last_vs_fedavg.csv").write_text(head + row + "last\n")
    names = sorted(p.name for p in figures.page_figures(tmp_path))
    assert names == ["forest.png", "forest_last.png"]
