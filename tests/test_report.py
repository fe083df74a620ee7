"""The report table from fake run folders: hand-computed means/stds, best grid point, rounds."""

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from fedpcd_app.analysis import report
from fedpcd_app.server.results import write_json_atomic
from tests.helpers import make_run

# per seed: client accuracies (10 clients) → final mean_acc = their mean
FEDAVG = {0: [0.5] * 5 + [0.9] * 5, 1: [0.6] * 5 + [0.9] * 5, 2: [0.55] * 5 + [0.95] * 5}  # means .70 .75 .75
TAU1 = {0: [0.8] * 10, 1: [0.7] * 10, 2: [0.7] * 10}       # means .80 .70 .70 → mean .7333
TAU2 = {0: [0.78] * 10, 1: [0.76] * 10, 2: [0.74] * 10}    # means .78 .76 .74 → mean .76 (best by mean)
TAU5 = {0: [0.6] * 10, 1: [0.65] * 10, 2: [0.6] * 10}      # mean .6167: makes τ=0.02 interior to the grid
CURVES = {  # eval rounds 10/20/30; target = FedAvg's mean final = (0.70+0.75+0.75)/3 = 0.7333...
    0: {10: 0.60, 20: 0.74, 30: 0.78},  # reaches at 20
    1: {10: 0.74, 20: 0.75, 30: 0.76},  # reaches at 10
    2: {10: 0.50, 20: 0.60, 30: 0.74},  # reaches at 30
}


@pytest.fixture
def sweep_out(tmp_path):
    for seed in range(3):
        acc = FEDAVG[seed]
        make_run(tmp_path, "alpha0.1", "fedavg", seed, acc, central=0.6 + 0.01 * seed,
                 curve={10: 0.3, 20: 0.5, 30: sum(acc) / len(acc)})
        make_run(tmp_path, "alpha0.1", "fedpcd", seed, TAU1[seed], grid={"fedpcd-tau": 0.01})
        make_run(tmp_path, "alpha0.1", "fedpcd", seed, TAU2[seed], grid={"fedpcd-tau": 0.02}, curve=CURVES[seed])
        make_run(tmp_path, "alpha0.1", "fedpcd", seed, TAU5[seed], grid={"fedpcd-tau": 0.05})
    return tmp_path


def test_best_grid_point_is_chosen_by_mean_over_seeds(sweep_out):
    # Prepare: τ=0.01 wins seed 0 (0.80 vs 0.78) but τ=0.02 has the higher mean (0.76 vs 0.7333)
    runs = [r for r in report.load_runs(sweep_out) if r.method == "fedpcd"]
    # Execute
    best, by_variant = report.best_variant(runs)
    # Assert
    assert best == "fedpcd-tau=0.02"
    assert sorted(by_variant) == ["fedpcd-tau=0.01", "fedpcd-tau=0.02", "fedpcd-tau=0.05"]


def test_report_numbers_equal_hand_computed(sweep_out):
    md, csv_path = report.report(sweep_out)
    rows = {r["method"]: r for r in csv.DictReader(open(csv_path)) if r["selected"] == "1"}
    assert set(rows) == {"fedavg", "fedpcd"}
    assert rows["fedpcd"]["hyperparameters"] == "fedpcd-tau=0.02"
    fedavg_means = [0.70, 0.75, 0.75]
    assert float(rows["fedavg"]["mean_acc_mean"]) == pytest.approx(statistics.mean(fedavg_means))
    assert float(rows["fedavg"]["mean_acc_std"]) == pytest.approx(statistics.stdev(fedavg_means))
    # σ_c of two equal halves a, b is |a − b| / 2 (population std over the 10 clients)
    spreads = [0.2, 0.15, 0.2]
    assert float(rows["fedavg"]["std_acc_mean"]) == pytest.approx(statistics.mean(spreads))
    assert float(rows["fedavg"]["std_acc_std"]) == pytest.approx(statistics.stdev(spreads))
    # worst-10% of 10 clients = the single lowest; best-10% = the single highest
    assert float(rows["fedavg"]["worst10_acc_mean"]) == pytest.approx(statistics.mean([0.5, 0.6, 0.55]))
    assert float(rows["fedavg"]["best10_acc_mean"]) == pytest.approx(statistics.mean([0.9, 0.9, 0.95]))
    jain = [sum(a) ** 2 / (len(a) * sum(x * x for x in a)) for a in FEDAVG.values()]
    assert float(rows["fedavg"]["jain_mean"]) == pytest.approx(statistics.mean(jain))
    assert float(rows["fedavg"]["jain_std"]) == pytest.approx(statistics.stdev(jain))
    assert float(rows["fedavg"]["central_acc_mean"]) == pytest.approx(0.61)
    assert float(rows["fedpcd"]["mean_acc_mean"]) == pytest.approx(0.76)
    assert float(rows["fedpcd"]["mean_acc_std"]) == pytest.approx(0.02)
    assert float(rows["fedpcd"]["std_acc_mean"]) == pytest.approx(0.0, abs=1e-12)
    assert float(rows["fedpcd"]["jain_mean"]) == pytest.approx(1.0)
    # rounds to FedAvg's final mean (0.7333): fedpcd seeds reach it at 20, 10, 30
    assert float(rows["fedpcd"]["target_acc"]) == pytest.approx(statistics.mean(fedavg_means))
    assert float(rows["fedpcd"]["rounds_to_target_mean"]) == pytest.approx(20.0)
    assert float(rows["fedpcd"]["rounds_to_target_std"]) == pytest.approx(10.0)
    assert rows["fedpcd"]["seeds_reaching_target"] == "3"
    # FedAvg's seed 0 ends at 0.70 < target: 2 of 3 seeds reach it, both at round 30
    assert rows["fedavg"]["seeds_reaching_target"] == "2"
    assert float(rows["fedavg"]["rounds_to_target_mean"]) == pytest.approx(30.0)


def test_markdown_percentages_and_bold_best(sweep_out):
    md, _ = report.report(sweep_out)
    text = md.read_text()
    fedpcd = next(line for line in text.splitlines() if line.startswith("| fedpcd"))
    fedavg = next(line for line in text.splitlines() if line.startswith("| fedavg"))
    assert "**76.00 ± 2.00**" in fedpcd              # best ā, in %, 2 decimals
    assert "**0.00 ± 0.00**" in fedpcd               # lowest σ_c is best
    assert "**1.0000 ± 0.0000**" in fedpcd           # Jain as an index
    assert "73.33 ± 2.89" in fedavg and "**73.33" not in fedavg
    assert "**61.00 ± 1.00**" in fedavg              # best central accuracy
    assert "**20.0 ± 10.0**" in fedpcd               # all seeds reached: fastest is bold
    assert "30.0 ± 0.0 (2/3 seeds)" in fedavg
    assert "rounds to 73.33%" in text


def test_explicit_target_and_unreached(sweep_out):
    _, csv_path = report.report(sweep_out, target=0.99)
    rows = {r["method"]: r for r in csv.DictReader(open(csv_path))}
    assert rows["fedpcd"]["seeds_reaching_target"] == "0"
    assert "not reached (0/3)" in (sweep_out / "report.md").read_text()


def test_report_of_empty_folder_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no finished run"):
        report.report(tmp_path)


def test_no_bold_without_a_comparison(tmp_path):
    for seed in range(2):
        make_run(tmp_path, "solo", "fedavg", seed, [0.5, 0.7, 0.9])
    md, _ = report.report(tmp_path)
    assert "**" not in md.read_text()


def test_manifest_limits_the_report_to_the_current_sweep(sweep_out):
    # the sweep file now lists only FedAvg: the old FedPCD folders are not in the table
    runs = [{"setting": "alpha0.1", "method": "fedavg", "folder": f"alpha0.1/fedavg/base/seed{k}"} for k in range(3)]
    (sweep_out / "sweep.json").write_text(json.dumps({"name": "only-fedavg", "runs": runs}))
    _, csv_path = report.report(sweep_out)
    assert [r["method"] for r in csv.DictReader(open(csv_path))] == ["fedavg"]


# -- any folder holding runs, --all, one seed, paired comparison -------------------------------------
def test_a_single_run_folder_is_a_report_without_plus_minus(tmp_path):
    folder = make_run(tmp_path, "s", "fedavg", 4, [0.5, 0.7, 0.9], labels=False, folder=tmp_path / "run")
    md, csv_path = report.report(folder)
    assert md.parent == folder
    line = next(x for x in md.read_text().splitlines() if x.startswith("| fedavg"))
    assert "70.00" in line and "±" not in line  # one seed: no spread to show
    (row,) = csv.DictReader(open(csv_path))
    assert row["seeds"] == "4" and float(row["mean_acc_mean"]) == pytest.approx(0.7)


@pytest.mark.parametrize(("cells", "expected"), [
    ((0.7, 0.0, True, 1), "70.00"),
    ((0.7, 0.05, True, 3), "70.00 ± 5.00"),
    ((0.95, 0.0, False, 1), "0.9500"),
    ((0.95, 0.01, False, 2), "0.9500 ± 0.0100"),
    ((float("nan"), float("nan"), True, 0), "—"),
])
def test_cells_show_plus_minus_only_over_several_seeds(cells, expected):
    assert report.format_cell(*cells) == expected


@pytest.fixture
def loose_runs(tmp_path):
    """Runs as `flwr run` leaves them (no run.json), nested at different depths."""
    root = tmp_path / "outputs"
    for seed in range(2):
        make_run(root, "", "fedavg", seed, [0.6, 0.7 + 0.01 * seed], labels=False,
                 folder=root / "fedavg" / f"seed{seed}-x")
        for tau in (0.01, 0.02):
            make_run(root, "", "", seed, [0.7, 0.8 + tau], labels=False, registered="fedpcd",
                     grid={"fedpcd-tau": tau}, folder=root / "deeper" / "fedpcd" / f"tau{tau}" / f"seed{seed}")
    # another federation (other dirichlet-alpha): another setting
    make_run(root, "", "fedavg", 0, [0.5, 0.5], labels=False, extra={"dirichlet-alpha": 1.0}, folder=root / "alpha1")
    return root


def test_runs_without_labels_are_grouped_by_their_config(loose_runs):
    runs = report.load_runs(loose_runs)
    got = sorted((r.setting, r.method, r.variant, r.seed) for r in runs)
    assert got == sorted([
        ("dirichlet-alpha=0.3", "fedavg", "base", 0), ("dirichlet-alpha=0.3", "fedavg", "base", 1),
        *[("dirichlet-alpha=0.3", "fedpcd", f"fedpcd-tau={t}", s) for t in (0.01, 0.02) for s in (0, 1)],
        ("dirichlet-alpha=1.0", "fedavg", "base", 0),
    ])


def test_a_repeated_seed_uses_the_newest_run(tmp_path, capsys):
    import os

    old = make_run(tmp_path, "", "fedavg", 0, [0.1, 0.2], labels=False, folder=tmp_path / "a")
    make_run(tmp_path, "", "fedavg", 0, [0.8, 0.9], labels=False, folder=tmp_path / "b")
    os.utime(old / "summary.json", (1, 1))
    (run,) = report.load_runs(tmp_path)
    assert run.folder == tmp_path / "b" and "newest" in capsys.readouterr().err


def test_all_lists_every_grid_point_and_marks_the_chosen(sweep_out):
    md, csv_path = report.report(sweep_out, all_points=True)
    rows = list(csv.DictReader(open(csv_path)))
    assert [(r["method"], r["hyperparameters"], r["chosen"], r["selected"]) for r in rows] == [
        ("fedavg", "base", "1", "1"), ("fedpcd", "fedpcd-tau=0.01", "0", "0"), ("fedpcd", "fedpcd-tau=0.02", "1", "1"),
        ("fedpcd", "fedpcd-tau=0.05", "0", "0")]
    assert float(rows[1]["mean_acc_mean"]) == pytest.approx((0.8 + 0.7 + 0.7) / 3)
    lines = [x for x in md.read_text().splitlines() if x.startswith("| fedpcd")]
    assert len(lines) == 3 and "★" in lines[1] and "★" not in lines[0] + lines[2]
    # the default report.md keeps one row per method; report.csv holds every configuration
    md, csv_path = report.report(sweep_out)
    assert len([x for x in md.read_text().splitlines() if x.startswith("| fedpcd")]) == 1
    assert [(r["hyperparameters"], r["selected"]) for r in csv.DictReader(open(csv_path))] == [
        ("base", "1"), ("fedpcd-tau=0.01", "0"), ("fedpcd-tau=0.02", "1"), ("fedpcd-tau=0.05", "0")]


# baseline and method final ā per seed: differences .05 .02 .07 -.01 .03 (no ties in |d|)
BASE = [0.70, 0.72, 0.74, 0.76, 0.78]
METHOD = [0.75, 0.74, 0.81, 0.75, 0.81]


@pytest.fixture
def paired_out(tmp_path):
    for seed, (b, m) in enumerate(zip(BASE, METHOD)):
        make_run(tmp_path, "s", "fedavg", seed, [b] * 4)
        make_run(tmp_path, "s", "fedpcd", seed, [m] * 4, registered="fedpcd")
    make_run(tmp_path, "s", "other", 0, [0.9] * 4, registered="qffl")  # one paired seed only
    return tmp_path


def test_paired_comparison_equals_hand_computed(paired_out):
    from scipy import stats

    md, _ = report.report(paired_out, baseline="fedavg", mixed_weightings=True)
    rows = {(r["method"], r["metric"]): r for r in csv.DictReader(open(paired_out / "report_paired.csv"))}
    acc = rows[("fedpcd", "mean_acc")]
    d = [m - b for m, b in zip(METHOD, BASE)]
    assert float(acc["mean_difference"]) == pytest.approx(statistics.mean(d))
    t = statistics.mean(d) / (statistics.stdev(d) / len(d) ** 0.5)
    assert float(acc["ttest_p"]) == pytest.approx(2 * stats.t.sf(abs(t), df=len(d) - 1))
    # Wilcoxon, exact: |d| ranks 4 2 5 1 3, the negative one has rank 1; of the 2^5 sign
    # patterns, W- <= 1 in 2 ({}, {1}): two-sided p = 2 * 2/32
    assert float(acc["wilcoxon_p"]) == pytest.approx(0.125)
    assert (acc["seeds_better"], acc["seeds_tied"], acc["num_seeds"]) == ("4", "0", "5")
    # σ_c is 0 for both on every seed: all tied, no test
    spread = rows[("fedpcd", "std_acc")]
    assert (spread["seeds_better"], spread["seeds_tied"]) == ("0", "5")
    assert spread["ttest_p"] == "nan" and spread["wilcoxon_p"] == "nan"
    # one paired seed: a difference but no p-value
    one = rows[("other", "mean_acc")]
    assert one["num_seeds"] == "1" and float(one["mean_difference"]) == pytest.approx(0.2)
    assert one["ttest_p"] == "nan"
    text = md.read_text()
    assert "paired comparison against fedavg" in text
    line = next(x for x in text.splitlines() if x.startswith("| fedpcd") and "| ā |" in x)
    assert "+3.20 pp" in line and "| 0.125 |" in line and "| 4/5 (p = 0.375) |" in line


def test_baseline_can_be_named_by_its_registered_method(paired_out):
    report.report(paired_out, baseline="qffl", mixed_weightings=True)
    rows = list(csv.DictReader(open(paired_out / "report_paired.csv")))
    assert {r["baseline"] for r in rows} == {"other"}


@pytest.mark.parametrize(("args", "needle"), [
    (["--baseline", "nope"], "--baseline 'nope' is not a method"),
    (["--baseline", "fedavg", "--metrics", "mean_acc,bogus"], "unknown metric 'bogus'"),
])
def test_cli_errors_are_one_line(paired_out, capsys, args, needle):
    assert report.main([str(paired_out), "--mixed-weightings", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_cli_empty_folder_is_one_line(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("error: no finished run")


def test_several_sweeps_below_one_folder_keep_their_settings_apart(tmp_path):
    for name in ("sweep-a", "sweep-b"):
        make_run(tmp_path / name, "default", "fedavg", 0, [0.5, 0.6])
        (tmp_path / name / "sweep.json").write_text(json.dumps({"name": name, "runs": [
            {"setting": "default", "method": "fedavg", "folder": "default/fedavg/base/seed0"}]}))
    assert sorted(r.setting for r in report.load_runs(tmp_path)) == ["sweep-a/default", "sweep-b/default"]


def _add_validation(folder: Path, val_mean_acc: float) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    write_json_atomic(folder / "summary.json", {**summary, "val_mean_acc": val_mean_acc})


def test_grid_point_is_selected_on_validation_when_the_runs_have_it(sweep_out):
    # Prepare: on test τ=0.02 is best (0.76 vs 0.733); on validation τ=0.01 is (0.9 vs 0.5)
    for folder in sweep_out.rglob("summary.json"):
        _add_validation(folder.parent, 0.9 if "fedpcd-tau=0.01" in str(folder) else 0.5)
    runs = [r for r in report.load_runs(sweep_out) if r.method == "fedpcd"]
    # Execute
    best, _ = report.best_variant(runs)
    md, csv_path = report.report(sweep_out)
    # Assert: selected on validation, reported on test, and the report says so
    assert best == "fedpcd-tau=0.01"
    row = {r["method"]: r for r in csv.DictReader(open(csv_path)) if r["selected"] == "1"}["fedpcd"]
    assert row["hyperparameters"] == "fedpcd-tau=0.01"
    assert float(row["mean_acc_mean"]) == pytest.approx((0.8 + 0.7 + 0.7) / 3)  # the test numbers
    text = md.read_text()
    assert "on the validation split" in text and "Warning" not in text
    # a seed stopped before any evaluation (no val_mean_acc) does not turn the selection to the test split
    folder = sweep_out / "alpha0.1" / "fedpcd" / "fedpcd-tau=0.05" / "seed2"
    summary = {k: v for k, v in json.loads((folder / "summary.json").read_text()).items() if k != "val_mean_acc"}
    write_json_atomic(folder / "summary.json",
                      {**summary, "complete": False, "incomplete_reason": "diverged at round 1"})
    runs = [r for r in report.load_runs(sweep_out) if r.method == "fedpcd"]
    assert report.selection_split(runs) == "validation" and report.best_variant(runs)[0] == "fedpcd-tau=0.01"


def test_selecting_on_test_is_said_and_warned_about(sweep_out):
    runs = [r for r in report.load_runs(sweep_out) if r.method == "fedpcd"]
    with pytest.warns(UserWarning, match="selected on the test accuracy"):
        report.best_variant(runs)
    with pytest.warns(UserWarning):
        md, _ = report.report(sweep_out)
    text = md.read_text()
    assert "on the test split" in text and "**Warning:** hyperparameters selected on the test split" in text


# -- equal terms: which iterate was scored, and runs that diverged ------------------------------------
def _iterate_runs(tmp_path, fedpcd_iterate="averaged"):
    for seed in range(3):
        make_run(tmp_path, "s", "fedavg", seed, FEDAVG[seed], summary={"scored_iterate": "averaged",
                                                                       "scored_split": "test"})
        make_run(tmp_path, "s", "fedpcd", seed, TAU2[seed], summary={"scored_iterate": fedpcd_iterate,
                                                                     "scored_split": "test"})
    return tmp_path


def test_each_table_states_the_scored_iterate_and_split(tmp_path):
    md, csv_path = report.report(_iterate_runs(tmp_path))
    text = md.read_text()
    assert "Scored: the averaged iterate θ̄_T (mean of θ_1..θ_T), on the test split(s)." in text
    rows = list(csv.DictReader(open(csv_path)))
    assert {(r["scored_iterate"], r["scored_split"], r["status"]) for r in rows} == {("averaged", "test", "scored")}


def test_runs_scored_on_different_iterates_are_refused_in_one_table(tmp_path, capsys):
    out = _iterate_runs(tmp_path, fedpcd_iterate="last")
    with pytest.raises(report.ReportError, match="mixes runs scored on different iterates") as exc:
        report.report(out)
    assert "averaged: fedavg" in str(exc.value) and "last: fedpcd" in str(exc.value)
    assert report.main([str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--mixed-iterates" in err and len(err.splitlines()) == 1
    # allowed when asked for: the table says so and has an iterate column
    assert report.main([str(out), "--mixed-iterates"]) == 0
    text = (out / "report.md").read_text()
    assert "**mixed iterates**" in text and "| method | weighting | hyperparameters | seeds | iterate |" in text


def test_runs_written_before_the_field_are_read_by_what_they_scored(tmp_path):
    """No scored_iterate: AFL (its own averaged iterate) and FedeRage with the retired
    federage-averaged-iterate are 'averaged', the others 'last'."""
    make_run(tmp_path, "s", "fedavg", 0, [0.5, 0.6])
    make_run(tmp_path, "s", "afl", 0, [0.5, 0.7], registered="afl")
    runs = {r.method: r for r in report.load_runs(tmp_path)}
    assert (runs["fedavg"].iterate, runs["afl"].iterate) == ("last", "averaged")
    with pytest.raises(report.ReportError, match="last: fedavg"):
        report.report(tmp_path)


def test_one_diverged_seed_is_counted_a_majority_makes_the_point_unstable(sweep_out):
    # Prepare: τ=0.02 (the best by mean) diverged on seed 1 (1 of 3: a minority)
    folder = sweep_out / "alpha0.1" / "fedpcd" / "fedpcd-tau=0.02" / "seed1"
    summary = json.loads((folder / "summary.json").read_text())
    write_json_atomic(folder / "summary.json", {**summary, "complete": False,
                                                "incomplete_reason": "diverged at round 12"})
    md, csv_path = report.report(sweep_out, all_points=True, baseline="fedavg")
    rows = {r["hyperparameters"]: r for r in csv.DictReader(open(csv_path)) if r["method"] == "fedpcd"}
    # one seed's failure does not drop the point: it counts at its last evaluation (its summary's numbers)
    assert rows["fedpcd-tau=0.02"]["chosen"] == "1" and rows["fedpcd-tau=0.02"]["status"] == "scored"
    assert float(rows["fedpcd-tau=0.02"]["mean_acc_mean"]) == pytest.approx(0.76)
    assert "seed 1 (counted at its last evaluation): diverged at round 12" in md.read_text()
    # Prepare: a second seed fails (2 of 3: a majority): unstable, no score, never selected
    folder = sweep_out / "alpha0.1" / "fedpcd" / "fedpcd-tau=0.02" / "seed2"
    summary = json.loads((folder / "summary.json").read_text())
    write_json_atomic(folder / "summary.json", {**summary, "complete": False,
                                                "incomplete_reason": "diverged at round 9"})
    md, csv_path = report.report(sweep_out, all_points=True, baseline="fedavg")
    rows = {r["hyperparameters"]: r for r in csv.DictReader(open(csv_path)) if r["method"] == "fedpcd"}
    assert rows["fedpcd-tau=0.01"]["chosen"] == "1" and rows["fedpcd-tau=0.02"]["chosen"] == "0"
    bad = rows["fedpcd-tau=0.02"]
    assert (bad["status"] == "diverged" and bad["mean_acc_mean"] == ""
            and "seed 1: diverged at round 12" in bad["incomplete"])
    text = md.read_text()
    line = next(x for x in text.splitlines() if x.startswith("| fedpcd | data-size | fedpcd-tau=0.02"))
    assert "diverged (2/3 seeds)" in line and "%" not in line and "76" not in line
    assert "- fedpcd [fedpcd-tau=0.02] seed 1: diverged at round 12" in text
    paired = list(csv.DictReader(open(sweep_out / "report_paired.csv")))
    assert {r["hyperparameters"] for r in paired} == {"fedpcd-tau=0.01", "fedpcd-tau=0.05"}


def test_ditto_is_scored_on_its_personal_models_beside_any_iterate(tmp_path):
    for seed in range(2):
        make_run(tmp_path, "s", "fedavg", seed, FEDAVG[seed], summary={"scored_iterate": "averaged"})
        make_run(tmp_path, "s", "ditto", seed, TAU2[seed], registered="ditto", summary={"scored_iterate": "averaged"})
    md, csv_path = report.report(tmp_path, mixed_weightings=True)
    rows = {r["method"]: r["scored_iterate"] for r in csv.DictReader(open(csv_path))}
    assert rows == {"fedavg": "averaged", "ditto": "personal"}
    assert "each client's personal model (Ditto)" in md.read_text() and "mixed iterates" not in md.read_text()


def test_a_selection_interior_along_lines_only_is_marked_not_bracketed(tmp_path):
    # alpha tried at one value at the selected gamma (digits uniform FedeRage): interior along lr only
    points = [({"a": 0.1, "g": 0.1}, 0.80), ({"a": 0.01, "g": 0.1}, 0.70), ({"a": 0.1, "g": 0.03}, 0.90),
              ({"a": 0.1, "g": 0.3}, 0.60), ({"a": 0.01, "g": 0.3}, 0.5)]
    for seed in range(2):
        for grid, acc in points:
            make_run(tmp_path, "s", "fr", seed, [acc] * 4, grid=grid)
    rows = report.summarize(report.load_runs(tmp_path), all_points=True)
    best = next(r for r in rows if r.chosen)
    assert best.runs[0].grid == {"a": 0.1, "g": 0.03}
    assert best.neighbourhood == "not bracketed: a (single value at the selection)"
    md, csv_path = report.report(tmp_path)
    assert "⚠ not bracketed" in md.read_text() or "⚠ edge" in md.read_text()
    assert next(csv.DictReader(open(csv_path)))["neighbourhood"].startswith("not bracketed")


# -- weighting, edges, budget, corrected statistics ----------------------------------------------------
def _weighting_runs(tmp_path, uniform_fedavg: bool):
    for seed in range(3):
        make_run(tmp_path, "s", "fedavg", seed, FEDAVG[seed])
        make_run(tmp_path, "s", "afl", seed, TAU2[seed], registered="afl", summary={"scored_iterate": "last"})
        if uniform_fedavg:
            make_run(tmp_path, "s", "fedavg-uniform", seed, TAU1[seed], registered="fedavg",
                     extra={"fedavg-weighting": "uniform"})
    return tmp_path


def test_every_table_has_a_weighting_column(tmp_path):
    out = _weighting_runs(tmp_path, uniform_fedavg=True)
    md, csv_path = report.report(out)
    rows = {r["method"]: r["weighting"] for r in csv.DictReader(open(csv_path))}
    assert rows == {"fedavg": "data-size", "afl": "loss", "fedavg-uniform": "uniform"}
    text = md.read_text()
    assert "| method | weighting | hyperparameters |" in text
    assert "| fedavg-uniform | uniform |" in text and "| afl | loss |" in text


def test_the_weighting_a_run_recorded_is_used(tmp_path):
    make_run(tmp_path, "s", "fedavg", 0, [0.5, 0.6])  # no field: resolved from its config
    make_run(tmp_path, "s", "x", 0, [0.5, 0.7], registered="not-here", summary={"weighting": "uniform"})
    assert {r.method: r.weighting for r in report.load_runs(tmp_path)} == {"fedavg": "data-size", "x": "uniform"}


def test_mixed_weightings_without_both_fedavgs_are_refused_in_one_line(tmp_path, capsys):
    out = _weighting_runs(tmp_path, uniform_fedavg=False)
    assert report.main([str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert ("data-size: fedavg; loss: afl" in err and "fedavg-weighting = 'uniform'" in err
            and 'method = "fedavg", fedavg-weighting = "uniform"' in err and "--mixed-weightings" in err)
    assert report.main([str(out), "--mixed-weightings"]) == 0
    assert "Weighting: the rows weight their clients differently (data-size, loss)" in (out / "report.md").read_text()


def test_a_selection_on_the_grid_edge_is_marked_and_never_best(tmp_path):
    for seed in range(3):
        make_run(tmp_path, "s", "fedavg", seed, FEDAVG[seed])
        make_run(tmp_path, "s", "fedpcd", seed, TAU1[seed], grid={"lr": 0.01}, registered="fedpcd")
        make_run(tmp_path, "s", "fedpcd", seed, TAU2[seed], grid={"lr": 0.03}, registered="fedpcd")
    md, csv_path = report.report(tmp_path)
    rows = {(r["method"], r["hyperparameters"]): r for r in csv.DictReader(open(csv_path))}
    sel = rows[("fedpcd", "lr=0.03")]
    assert (sel["selected"], sel["on_edge"], sel["edge"]) == ("1", "1", "lr=0.03 (largest tried)")
    assert rows[("fedpcd", "lr=0.01")]["edge"] == "lr=0.01 (smallest tried)"
    assert rows[("fedavg", "base")]["on_edge"] == "0"
    text = md.read_text()
    line = next(x for x in text.splitlines() if x.startswith("| fedpcd"))
    assert "⚠ edge" in line and "**" not in line  # 76 % is the highest ā, but not called best
    assert "selections on the edge of the grid tried" in text and "fedpcd: lr=0.03 (largest tried)" in text
    report.report(tmp_path, baseline="fedpcd")
    text = (tmp_path / "report.md").read_text()
    assert "⚠ edge: the baseline fedpcd [lr=0.03]'s selected grid point lies on its grid's edge" in text
    assert list(csv.DictReader(open(tmp_path / "report_paired.csv")))[0]["on_edge"] == "0"  # fedavg: no grid


def test_the_grid_edge_is_read_along_each_key_through_the_selection():
    grids = [{"a": 1, "b": 10}, {"a": 2, "b": 10}, {"a": 3, "b": 10}, {"a": 2, "b": 20}, {"a": 2, "b": 5}]
    assert report.grid_edges({"a": 2, "b": 10}, grids) == []
    assert report.grid_edges({"a": 2, "b": 20}, grids) == ["b=20 (largest tried)"]  # a: only 2 along b=20
    assert report.grid_edges({"a": 1, "b": 10}, grids) == ["a=1 (smallest tried)"]
    assert report.grid_edges({"m": "x", "flag": True}, [{"m": "x", "flag": True}, {"m": "y", "flag": False}]) == []
    lr = [{"lr": 0.3}, {"lr": 1.0}]  # lr's declared upper bound is 1.0 (tuning.LR): no further extension
    assert report.grid_edges({"lr": 1.0}, lr, "fedavg") == ["lr=1.0 (largest tried, at its declared bound)"]
    assert report.grid_edges({"lr": 0.3}, lr, "fedavg") == ["lr=0.3 (smallest tried)"]


def test_budget_line_states_equal_unequal_and_declared_budgets(sweep_out):
    text = report.report(sweep_out)[0].read_text()
    assert "Budget: **unequal** — configurations per method entry and seed: fedavg 1, fedpcd 3" in text
    rows = report.summarize(report.load_runs(sweep_out), all_points=True)
    assert report.budget_line([r for r in rows if r.method == "fedpcd"]) == (
        "Budget: 3 configurations per method entry and seed, the same for every entry. "
        "Values tried — fedpcd: fedpcd-tau {0.01, 0.02, 0.05}.")
    # fedavg ran one configuration (its defaults) beside fedpcd's three: marked untuned
    assert report.budget_line(rows, budget=3) == (
        "Budget: 3 configurations per method entry and seed ([tuning] budget = 3); points beyond it (edge and "
        "neighbour extensions, reductions, the shared lr axis, equal-budget top-ups): fedavg -2. Counted after "
        "them the budgets are **unequal**: fedavg 1, fedpcd 3. Values tried — fedpcd: fedpcd-tau "
        "{0.01, 0.02, 0.05}. **Untuned** (run at their defaults beside tuned entries: not on equal terms): fedavg.")
    assert "| fedavg | data-size | untuned: its defaults |" in text
    (sweep_out / "sweep.json").write_text(json.dumps({"name": "x", "source": {"tuning": {"budget": 3}}, "runs": [
        {"setting": "alpha0.1", "method": m, "folder": str(f.parent.relative_to(sweep_out))}
        for f in sweep_out.rglob("summary.json") for m in [f.parts[-4]]]}))
    assert "([tuning] budget = 3)" in report.report(sweep_out)[0].read_text()


def test_paired_statistics_are_holm_corrected_over_the_table(paired_out):
    from scipy import stats as sps

    report.report(paired_out, baseline="fedavg", mixed_weightings=True)
    rows = list(csv.DictReader(open(paired_out / "report_paired.csv")))
    by = {(r["method"], r["metric"]): r for r in rows}
    acc = by[("fedpcd", "mean_acc")]
    d = [m - b for m, b in zip(METHOD, BASE)]
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=statistics.mean(d), scale=sps.sem(d))
    assert (float(acc["ci95_low"]), float(acc["ci95_high"])) == pytest.approx((lo, hi))
    assert float(acc["effect_dz"]) == pytest.approx(statistics.mean(d) / statistics.stdev(d))
    assert float(acc["sign_test_p"]) == pytest.approx(0.375)  # 4 of 5: 2 * 6/32
    # the family: the defined t-tests of the table (fedpcd's ā and W10; σ_c all tied; 'other' has one seed)
    defined = [r for r in rows if r["ttest_p"] != "nan"]
    assert {r["family_size"] for r in defined} == {str(len(defined))} and len(defined) == 2
    p = sorted(float(r["ttest_p"]) for r in defined)
    holm = {p[0]: min(1, 2 * p[0]), p[1]: max(min(1, 2 * p[0]), p[1])}
    for r in defined:
        assert float(r["p_holm"]) == pytest.approx(holm[float(r["ttest_p"])])
        assert r["significant"] == str(int(float(r["p_holm"]) < 0.05))
    # report.csv carries the first metric's adjusted p per row (blank for rows not compared)
    main = {r["method"]: r for r in csv.DictReader(open(paired_out / "report.csv"))}
    assert float(main["fedpcd"]["p_holm"]) == pytest.approx(float(acc["p_holm"]))
    assert main["fedavg"]["p_holm"] == ""
    text = (paired_out / "report.md").read_text()
    assert "Family: the 2 comparisons of the whole report" in text and "5/5 is p = 0.0625" in text


def test_a_two_seed_comparison_is_exploratory_never_significant(tmp_path):
    # differences .05 .051: a t-test with one degree of freedom gives a tiny p; no verdict may rest on it
    for seed, (b, m) in enumerate([(0.70, 0.75), (0.72, 0.771)]):
        make_run(tmp_path, "s", "fedavg", seed, [b] * 4)
        make_run(tmp_path, "s", "fedpcd", seed, [m] * 4, registered="fedpcd")
    md, _ = report.report(tmp_path, baseline="fedavg", mixed_weightings=True)
    acc = next(r for r in csv.DictReader(open(tmp_path / "report_paired.csv")) if r["metric"] == "mean_acc")
    assert float(acc["p_holm"]) < 0.05  # what the old report printed as "significant: yes"
    assert acc["significant"] == "0" and acc["verdict"] == "exploratory, 2 seeds"
    line = next(x for x in md.read_text().splitlines() if x.startswith("| fedpcd") and "| ā |" in x)
    assert "| exploratory, 2 seeds |" in line and "yes" not in line


def test_holm_is_over_the_whole_report_unless_the_sweep_declares_the_setting(tmp_path):
    for setting in ("a", "b"):
        for seed, (b, m) in enumerate(zip(BASE, METHOD)):
            make_run(tmp_path, setting, "fedavg", seed, [b] * 4)
            make_run(tmp_path, setting, "fedpcd", seed, [m + (0.01 * seed if setting == "b" else 0)] * 4,
                     registered="fedpcd")
    rows = report.summarize(report.load_runs(tmp_path))
    page = report.compare(rows, "fedavg", ("mean_acc",))
    assert {p.family for p in page} == {2} and {p.family_name for p in page} == {"page"}
    per_setting = report.compare(rows, "fedavg", ("mean_acc",), family="setting")
    assert {p.family for p in per_setting} == {1}
    assert all(a.p_holm >= b.p_holm for a, b in zip(page, per_setting))
    # an equivalence margin gives the TOST p; without one there is none (never "equivalent")
    tost = report.compare(rows, "fedavg", ("mean_acc",), margin=0.5)
    assert all(0 <= p.tost_p < 0.05 and p.verdict in ("significant", "equivalent") for p in tost)
    assert all(math.isnan(p.tost_p) for p in page)


def test_check_wording_cli(tmp_path, capsys):
    """report --check-wording runs the claim checker (fedpcd_app.analysis.claims; its planted set:
    tests/test_claims.py): exit 1 on an unsupported claim, 0 on none, 2 without the page."""
    page = tmp_path / "page.md"
    page.write_text("# R\n\nFedPCD wins on every seed.\nThe gain is significant after Holm (p_holm = 0.01).\n")
    assert report.main(["--check-wording", str(page)]) == 1  # no CSV beside it: FedPCD is not on the page
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and out[0].startswith(f"{page}:3: unsupported (names FedPCD")
    (tmp_path / "report_paired.csv").write_text(
        "setting,method,baseline,metric,num_seeds,differences,mean_difference,p_holm\n"
        "default,fedpcd,fedavg,mean_acc,5,0.01 0.02 0.03 0.02 0.02,0.02,0.01\n")
    page.write_text("# R\n\nFedPCD − FedAvg: +2.00 pp ā, significant after Holm (p_holm = 0.01).\n")
    assert report.main(["--check-wording", str(page)]) == 0  # the CSV's row supports it
    page.write_text("# R\n\nThe gain is significant after Holm (p_holm = 0.01).\n")
    assert report.main(["--check-wording", str(page)]) == 1  # which pair: not said
    (tmp_path / "report_paired.csv").write_text(
        "setting,method,baseline,metric,num_seeds,differences,mean_difference,p_holm\n"
        "default,fedpcd,fedavg,mean_acc,2,0.01 0.03,0.02,0.01\n")
    page.write_text("# R\n\nFedPCD − FedAvg: +2.00 pp ā, significant after Holm (p_holm = 0.01).\n")
    assert report.main(["--check-wording", str(page)]) == 1  # two seeds: not a finding
    page.write_text("Nothing is claimed.\n")
    assert report.main(["--check-wording", str(page)]) == 0
    assert report.main(["--check-wording", str(tmp_path / "missing.md")]) == 2


def test_restat_rederives_page_wide_holm_and_verdicts_from_the_stored_csvs(paired_out, tmp_path):
    from fedpcd_app.analysis import stats as ours

    report.report(paired_out, baseline="fedavg", mixed_weightings=True)
    first = (paired_out / "report_paired.csv").read_text()
    (paired_out / "report_paired_vs_fedavg.csv").write_text(first)  # a duplicate table: counted once
    report.report(paired_out, baseline="fedpcd", mixed_weightings=True)
    assert report.main(["--restat", str(paired_out)]) == 0
    rows = {}
    for path in sorted(paired_out.glob("report_paired*.csv")):
        for r in csv.DictReader(open(path)):
            rows[(r["method"], r["baseline"], r["metric"])] = r
    # fedpcd − fedavg and fedavg − fedpcd are one comparison (the same test): counted once
    distinct = {k: float(r["ttest_p"]) for k, r in rows.items() if k[:2] != ("fedavg", "fedpcd")}
    expected = dict(zip(distinct, ours.holm(list(distinct.values()))))
    for k, r in rows.items():
        want = expected.get(k, expected.get((k[1], k[0], k[2])))
        assert float(r["p_holm_page"]) == pytest.approx(want, nan_ok=True)
        assert r["page_family_size"] == str(sum(not math.isnan(p) for p in distinct.values()))
        assert r["verdict"] == ours.verdict(int(r["num_seeds"]), float(r["p_holm_page"]), math.nan)
    assert rows[("other", "fedavg", "mean_acc")]["verdict"] == "exploratory, 1 seed"
    rendered = (paired_out / "paired.md").read_text()  # the tables re-rendered from the CSVs
    line = next(x for x in rendered.splitlines() if x.startswith("| fedpcd") and "| ā |" in x)
    p_page = float(rows[("fedpcd", "fedavg", "mean_acc")]["p_holm_page"])
    assert f"| {p_page:.3f} |" in line and "the whole report" in rendered
    assert report.main(["--restat", str(tmp_path / "nothing")]) == 2


def test_the_worst10_selection_is_reported_beside_the_mean_one(tmp_path):
    # lr=0.1 has the higher mean (0.80 vs 0.78), lr=0.03 the higher worst-10 % (one client of ten at 0.7 vs 0.3)
    for seed in range(2):
        make_run(tmp_path, "s", "fedavg", seed, [0.7] * 10)
        make_run(tmp_path, "s", "fedpcd", seed, [0.3] + [0.855] * 9, grid={"lr": 0.1}, registered="fedpcd")
        make_run(tmp_path, "s", "fedpcd", seed, [0.7] + [0.79] * 9, grid={"lr": 0.03}, registered="fedpcd")
    report.report(tmp_path, baseline="fedavg", mixed_weightings=True)
    md, csv_path = report.report(tmp_path, baseline="fedavg", mixed_weightings=True, objective="worst10")
    assert md.name == "report_worst10.md" and (tmp_path / "report_paired_worst10.csv").is_file()
    chosen = {o: next(r for r in csv.DictReader(open(tmp_path / f)) if r["method"] == "fedpcd" and r["chosen"] == "1")
              for o, f in (("mean", "report.csv"), ("worst10", "report_worst10.csv"))}
    assert chosen["mean"]["hyperparameters"] == "lr=0.1" and chosen["worst10"]["hyperparameters"] == "lr=0.03"
    assert chosen["worst10"]["objective"] == "worst10" and chosen["mean"]["objective"] == "mean"


def test_restat_corrects_equivalence_like_significance_in_each_declared_family(tmp_path):
    """Issue 52: the comparisons the sweep declares primary form one Holm family, the rest the exploratory
    one; within each, the TOST p-values are Holm-adjusted as the t-test's are, and "equivalent" reads the
    adjusted TOST (the fairness page's rows as issue 42 left them: AFL − uniform FedAvg, TOST p 0.021, and
    FedFV's 0.0033 were "equivalent" uncorrected and are not after the correction)."""
    import shutil

    from fedpcd_app.analysis import stats as ours

    fixture = Path(__file__).parent / "data" / "claims" / "fairness"
    for path in fixture.glob("report_paired*.csv"):
        shutil.copy(path, tmp_path / path.name)
    assert report.main(["--restat", str(tmp_path), "--sweep", str(fixture / "sweep.toml")]) == 0
    rows = {}
    for path in sorted(tmp_path.glob("report_paired*.csv")):
        for r in csv.DictReader(open(path)):
            key = (r["setting"], frozenset({(r["method"], r["hyperparameters"]),
                                            (r["baseline"], r["baseline_hyperparameters"])}), r["metric"])
            rows.setdefault(key, r)
    families = {}
    for key, r in rows.items():
        families.setdefault(r["comparison_family"], []).append((key, r))
    assert set(families) == {"primary", "exploratory"} and len(families["primary"]) == 6
    for members in families.values():
        t = ours.holm([float(r["ttest_p"]) for _, r in members])
        tost = ours.holm([ours.tost_p([float(x) for x in r["differences"].split()], 0.01) for _, r in members])
        for (_, r), a, b in zip(members, t, tost):
            assert float(r["p_holm_family"]) == pytest.approx(a, nan_ok=True)
            assert float(r["tost_p_holm_family"]) == pytest.approx(b, nan_ok=True)
            assert r["comparison_family_size"] == str(sum(not math.isnan(x) for x in t))
            assert r["verdict"] == ours.verdict(int(r["num_seeds"]), a, b)
            assert (r["verdict"] == "equivalent") == (b < 0.05 and not a < 0.05)
    afl = next(r for _, r in families["exploratory"] if r["method"] == "afl" and r["baseline"] == "fedavg-uniform"
               and r["metric"] == "mean_acc")
    assert float(afl["tost_p"]) < 0.05 <= float(afl["tost_p_holm_family"]) and afl["verdict"] == "inconclusive"
    pcd = next(r for _, r in families["primary"]
               if r["metric"] == "mean_acc" and "fedpcd" in (r["method"], r["baseline"]))
    assert pcd["verdict"] == "significant"  # +2.74 pp, raw p 0.0014: inconclusive over 165, significant over 6
    rendered = report.render_paired(tmp_path)
    assert "primary comparisons against the baselines their papers name" in rendered
    assert "the page's declared primary comparisons" in rendered and "exploratory comparisons" in rendered
