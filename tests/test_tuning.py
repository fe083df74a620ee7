"""fedpcd_app.analysis.tuning: declared spaces filled to one budget, refusals in one line,
and grid edges extended (geometric step, bounded, resumable) until the selection is interior."""

import dataclasses
import json
import math

import pytest

from fedpcd_app.analysis import sweep as sweep_mod
from fedpcd_app.analysis import tuning


def make_sweep(budget=4, methods=({"name": "fedavg", "method": "fedavg"},), **tuning_keys):
    return sweep_mod.parse_sweep({"name": "t", "seeds": [0, 1], "base": {"dataset": "digits"},
                                  "tuning": {"budget": budget, **tuning_keys}, "methods": list(methods)})


def configs(sw, label):
    return sorted({r.grid for r in sw.runs if r.method == label})


def test_every_entry_gets_the_same_budget_and_lr_is_always_tuned():
    sw = make_sweep(budget=8, methods=[{"name": "fedavg", "method": "fedavg"}, {"name": "fedpcd", "method": "fedpcd"}],
                    grids={"fedpcd": {"fedpcd-tau": [0.01, 0.02]}})
    avg, pcd = configs(sw, "fedavg"), configs(sw, "fedpcd")
    # fedpcd: 2 tau x the declared 4 lr; fedavg: the 4 lr extended by their geometric step
    # r = (0.1 / 0.003) ** (1/3) = 3.2183, alternately above and below: 0.322, 0.000932, 1.04 -> bound 1.0, 0.00029
    budget = [g for g in pcd if dict(g)["lr"] in (0.003, 0.01, 0.03, 0.1)]
    assert len(avg) == len(budget) == 8
    assert sorted(dict(g)["lr"] for g in avg) == [0.00029, 0.000932, 0.003, 0.01, 0.03, 0.1, 0.322, 1.0]
    # coverage: the lr axis is shared, so fedpcd also tries the baseline's other four lr, at its default tau 0.02
    assert sorted(set(pcd) - set(budget)) == sorted(
        (("fedpcd-tau", 0.02), ("lr", lr)) for lr in (0.00029, 0.000932, 0.322, 1.0))
    assert len(sw.runs) == (8 + 12) * 2  # (fedavg's budget + fedpcd's budget and coverage) x seeds
    assert all(r.overrides["lr"] == dict(r.grid)["lr"] for r in sw.runs)


def test_a_scalar_in_the_entry_fixes_a_declared_key():
    sw = make_sweep(budget=4, methods=[{"name": "q", "method": "qffl", "qffl-q": 1.0}])
    assert {r.overrides["qffl-q"] for r in sw.runs} == {1.0}
    assert len(configs(sw, "q")) == 4


@pytest.mark.parametrize("budget,methods,needle", [
    (4, [{"name": "q", "method": "qffl"}], "has 20 configurations (lr 4 × qffl-q 5), more than"),
    (18, [{"name": "fv", "method": "fedfv", "fedfv-tau": 1, "fedfv-alpha": [0.0, 0.1, 0.2, 0.33]}],
     "not a multiple of its non-lr configurations (4)"),
    (6, [{"name": "a", "method": "fedavg", "lr": 0.1}], "a fixed lr"),
])
def test_budgets_that_cannot_be_met_are_refused_in_one_line(budget, methods, needle):
    with pytest.raises(sweep_mod.SweepError, match=".*") as err:
        make_sweep(budget=budget, methods=methods)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("table,needle", [({"budget": 0}, "'budget' must be"), ({"budget": 2, "x": 1}, "unknown key"),
                                          ({"budget": 2, "extend-edges": "yes"}, "extend-edges"),
                                          ({"budget": 2, "grids": {"nope": {"lr": [0.1]}}}, "method entry names"),
                                          ({"budget": 2, "extend-objectives": "worst10"}, "extend-objectives"),
                                          ({"budget": 2, "extend-objectives": []}, "extend-objectives"),
                                          ({"budget": 2, "extend-objectives": ["mean", "median"]}, "among mean"),
                                          ({"budget": 2, "extend-objectives": ["mean", "mean"]}, "distinct")])
def test_malformed_tuning_tables(table, needle):
    with pytest.raises(sweep_mod.SweepError, match=needle):
        sweep_mod.parse_sweep({"name": "t", "tuning": table, "methods": [{"name": "fedavg", "method": "fedavg"}]})
    with pytest.raises(sweep_mod.SweepError) as err:
        sweep_mod.parse_sweep({"name": "t", "tuning": table, "methods": [{"name": "fedavg", "method": "fedavg"}]})
    assert "\n" not in str(err.value)


def finish(sw, out, score, val=True, worst=None):
    """Write summary.json for every unfinished run: its score a function of the grid point
    (``worst``: its validation worst-10 % too)."""
    n = 0
    for run in sw.runs:
        folder = run.folder(out)
        if (folder / "summary.json").is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        s = score(dict(run.grid)) + 0.001 * run.seed
        summary = {"mean_acc": s - 0.01, **({"val_mean_acc": s} if val else {}), "complete": True}
        if worst is not None:
            summary.update(worst10_acc=worst(dict(run.grid)) - 0.01, val_worst10_acc=worst(dict(run.grid)))
        (folder / "summary.json").write_text(json.dumps(summary))
        n += 1
    return n


def peak_at(lr_star):
    return lambda g: 0.9 - (math.log10(g["lr"]) - math.log10(lr_star)) ** 2


def test_an_edge_selection_is_extended_until_interior(tmp_path):
    sw = make_sweep(budget=4)
    finish(sw, tmp_path, peak_at(0.3))
    # the best of 0.003..0.1 is the largest: one step beyond, 0.1 * (0.1 / 0.03) = 0.333
    new = tuning.extensions(sw, tmp_path)
    assert sorted({dict(r.grid)["lr"] for r in new}) == [0.333] and {r.seed for r in new} == {0, 1}
    assert all(r.overrides["lr"] == 0.333 for r in new)
    passes = []

    def run_pass():
        passes.append(finish(sw, tmp_path, peak_at(0.3)))
        return []

    assert tuning.extend_edges(sw, tmp_path, run_pass, log=lambda _: None) == []
    lrs = sorted({dict(g)["lr"] for g in configs(sw, "fedavg")})
    # 0.333 is best and on the edge: 0.333 * 3.33 = 1.11 is clamped to lr's bound 1.0; then 0.333 is interior
    assert lrs == [0.003, 0.01, 0.03, 0.1, 0.333, 1.0]
    assert passes == [2, 2]
    best, _ = tuning.selected_points(sw, tmp_path)[("default", "fedavg")]
    assert dict(best)["lr"] == 0.333
    # resumable: the same sweep parsed again recomputes the same extensions from the finished runs
    again = make_sweep(budget=4)
    assert tuning.extend_edges(again, tmp_path, lambda: [finish(again, tmp_path, peak_at(0.3))] and [],
                               log=lambda _: None) == []
    assert sorted({dict(g)["lr"] for g in configs(again, "fedavg")}) == lrs


def test_a_selection_at_the_declared_bound_is_not_extended(tmp_path):
    sw = make_sweep(budget=4, grids={"fedavg": {"lr": [0.1, 0.3, 0.6, 1.0]}})
    finish(sw, tmp_path, peak_at(5.0))
    assert tuning.extensions(sw, tmp_path) == []
    low = make_sweep(budget=2, grids={"fedavg": {"lr": [0.01, 0.1]}})
    finish(low, tmp_path / "low", peak_at(1e-3))
    assert sorted({dict(r.grid)["lr"] for r in tuning.extensions(low, tmp_path / "low")}) == [0.001]


def test_unfinished_or_diverged_points_are_not_selected(tmp_path):
    # the rule before issue 42, now declared: one failed seed makes its point unstable
    sw = make_sweep(budget=4, unstable="any")
    finish(sw, tmp_path, peak_at(0.3))
    bad = [r for r in sw.runs if dict(r.grid)["lr"] == 0.1 and r.seed == 1][0]
    (bad.folder(tmp_path) / "summary.json").write_text(json.dumps({"mean_acc": 0.1, "complete": False}))
    best, _ = tuning.selected_points(sw, tmp_path)[("default", "fedavg")]
    assert dict(best)["lr"] == 0.03  # interior among the complete points: nothing to extend
    assert tuning.extensions(sw, tmp_path) == []
    bad.folder(tmp_path).joinpath("summary.json").unlink()  # unfinished: never a candidate, whatever the rule
    assert dict(tuning.selected_points(make_sweep(budget=4), tmp_path)[("default", "fedavg")][0])["lr"] == 0.03


def test_one_failed_seed_does_not_drop_a_grid_point(tmp_path):
    # FedPW's case: 1 of 10 seeds stalls at the best lr; the other nine score far above the next point
    sw = sweep_mod.parse_sweep({"name": "t", "seeds": list(range(10)), "base": {"dataset": "digits"},
                                "tuning": {"budget": 4}, "methods": [{"name": "fedavg", "method": "fedavg"}]})
    finish(sw, tmp_path, lambda g: {0.003: 0.5, 0.01: 0.7, 0.03: 0.86, 0.1: 0.6}[g["lr"]])
    stalled = [r for r in sw.runs if dict(r.grid)["lr"] == 0.03 and r.seed == 0][0]
    path = stalled.folder(tmp_path) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "complete": False, "val_mean_acc": 0.2,
                                "incomplete_reason": "diverged at round 199: the train loss was at chance"}))
    best, _ = tuning.selected_points(sw, tmp_path)[("default", "fedavg")]
    assert dict(best)["lr"] == 0.03  # counted at its last validation evaluation (0.2), not silently dropped
    rules = tuning.Rules()
    scores, split = tuning.point_scores({"p": [json.loads(path.read_text())] + [{"val_mean_acc": 0.86}] * 9}, rules)
    assert split == "validation" and scores["p"] == pytest.approx((0.2 + 9 * 0.86) / 10)
    # a majority failing makes the point unstable; 'zero' counts a failed seed at 0
    assert tuning.point_scores({"p": [{"complete": False}] * 6 + [{"val_mean_acc": 0.9}] * 4}, rules)[0] == {}
    zero = tuning.Rules(failed_score="zero")
    assert tuning.point_scores({"p": [{"complete": False, "val_mean_acc": 0.5}, {"val_mean_acc": 0.9}]},
                               zero)[0]["p"] == pytest.approx(0.45)


def test_an_exact_tie_goes_to_the_interior_point():
    # FedFV's case: alpha 0.0303 (the edge) and 0.1 (interior) bit-identical; the first in sweep order is the edge
    grids = {a: {"fedfv-alpha": a} for a in (0.0303, 0.1, 0.33)}
    assert tuning.choose({0.0303: 0.8745, 0.1: 0.8745, 0.33: 0.80}, grids) == 0.1
    assert tuning.choose({0.0303: 0.8746, 0.1: 0.8745, 0.33: 0.80}, grids) == 0.0303  # no tie: the best


def test_a_reduction_is_tried_at_every_baseline_lr():
    # FedeRage at gamma = 0 is FedAvg: its space must hold it at FedAvg's selected lr (0.3 on the digits page)
    lrs = [0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5]
    sw = make_sweep(budget=8, methods=[
        {"name": "fedavg", "method": "fedavg", "fedavg-weighting": "uniform", "lr": lrs},
        {"name": "federage", "method": "federage", "federage-alpha": [0.01, 0.1], "federage-gamma": [0.1, 0.3],
         "lr": [0.03, 0.1]},
        {"name": "q", "method": "qffl", "qffl-q": [1.0, 2.0], "lr": [0.01, 0.03, 0.1, 0.3]},
        {"name": "scaffold", "method": "scaffold", "lr": lrs}], **{"fedavg-both-weightings": False})
    fed = configs(sw, "federage")
    assert sorted(dict(g)["lr"] for g in fed if dict(g)["federage-gamma"] == 0.0) == lrs
    assert {dict(g)["federage-alpha"] for g in fed if dict(g)["federage-gamma"] == 0.0} == {0.1}  # its default
    assert len(fed) == 8 + 8  # the budget, and the reduction at each of the baseline's lr values
    q = configs(sw, "q")
    assert sorted(dict(g)["lr"] for g in q if dict(g)["qffl-q"] == 0.0) == lrs
    assert len(configs(sw, "scaffold")) == 8  # it already covers the baseline's lr axis: nothing added
    # the declarations the tuner reads
    from strategies.registry import strategy_class
    declared = {m: [(k, v) for k, v, to, _ in strategy_class(m).Params.reductions() if to == "fedavg"]
                for m in ("federage", "qffl", "fedprox", "fedavgm", "fedfv", "fedheal")}
    assert declared == {"federage": [("federage-alpha", 1.0), ("federage-gamma", 0.0)], "qffl": [("qffl-q", 0.0)],
                        "fedprox": [("fedprox-mu", 0.0)], "fedavgm": [("fedavgm-momentum", 0.0)],
                        "fedfv": [("fedfv-alpha", 1.0)], "fedheal": [("fedheal-beta", 0.0)]}


def test_both_neighbours_of_every_tuned_key_are_run_at_the_selection(tmp_path):
    # alpha tried at a single value at the selected gamma: its neighbours are added there
    sw = make_sweep(budget=4, methods=[{"name": "fr", "method": "federage", "federage-alpha": [0.01, 0.1],
                                        "federage-gamma": [0.1, 0.3], "lr": 0.1}])
    extra = [r for r in sw.runs if r.seed == 0][0]
    sw.runs.extend(dataclasses.replace(extra, grid=(("federage-alpha", 0.05), ("federage-gamma", 0.2)), seed=s,
                                       overrides={**extra.overrides, "federage-alpha": 0.05, "federage-gamma": 0.2})
                   for s in (0, 1))
    finish(sw, tmp_path, lambda g: 0.9 - abs(g["federage-alpha"] - 0.05) - abs(g["federage-gamma"] - 0.2))
    best, _ = tuning.selected_points(sw, tmp_path)[("default", "fr")]
    assert dict(best) == {"federage-alpha": 0.05, "federage-gamma": 0.2}
    new = sorted({r.grid for r in tuning.extensions(sw, tmp_path)})
    assert new == sorted([(("federage-alpha", 0.01), ("federage-gamma", 0.2)),
                          (("federage-alpha", 0.1), ("federage-gamma", 0.2)),
                          (("federage-alpha", 0.05), ("federage-gamma", 0.1)),
                          (("federage-alpha", 0.05), ("federage-gamma", 0.3))])


def test_the_worst10_selection_is_extended_when_listed_in_extend_objectives(tmp_path):
    # the fairness page's case: the mean selection (lr 0.03) is interior, the worst-10 % one (lr 0.1) is on the
    # edge; extensions followed the declared objective alone, so the worst-10 % selection stayed on its edge
    mean_peak, worst_peak = peak_at(0.03), peak_at(0.3)
    declared = make_sweep(budget=4)
    assert declared.tuning.objectives == ("mean",)
    finish(declared, tmp_path, mean_peak, worst=worst_peak)
    assert tuning.extensions(declared, tmp_path) == []
    both = make_sweep(budget=4, **{"extend-objectives": ["mean", "worst10"]})
    assert both.tuning.objectives == ("mean", "worst10") and both.tuning.rules.objective == "mean"
    assert dict(tuning.selected_points(both, tmp_path, "worst10")[("default", "fedavg")][0])["lr"] == 0.1
    new = tuning.extensions(both, tmp_path)
    assert sorted({dict(r.grid)["lr"] for r in new}) == [0.333] and {r.seed for r in new} == {0, 1}

    def run_pass():
        finish(both, tmp_path, mean_peak, worst=worst_peak)
        return []

    assert tuning.extend_edges(both, tmp_path, run_pass, log=lambda _: None) == []
    # 0.333 best on worst-10 % and on the edge: 1.11 clamped to lr's bound 1.0; then both selections are interior
    assert sorted({dict(g)["lr"] for g in configs(both, "fedavg")}) == [0.003, 0.01, 0.03, 0.1, 0.333, 1.0]
    assert dict(tuning.selected_points(both, tmp_path, "worst10")[("default", "fedavg")][0])["lr"] == 0.333
    assert dict(tuning.selected_points(both, tmp_path)[("default", "fedavg")][0])["lr"] == 0.03  # declared: mean


def test_the_worst10_selections_missing_neighbour_is_added(tmp_path):
    # two tuned keys; the worst-10 % selection (tau 0.05, lr 0.1) lacks neighbours tried elsewhere (lr 0.3 and
    # tau 0.02, both run only at the extra point): they are added at the selection, and tau (on its edge) is
    # extended one geometric step beyond
    def sweep(**keys):
        sw = make_sweep(budget=4, methods=[{"name": "p", "method": "fedpcd", "fedpcd-tau": [0.01, 0.05],
                                            "lr": [0.03, 0.1]}], **keys)
        extra = [r for r in sw.runs if r.seed == 0][0]
        sw.runs.extend(dataclasses.replace(extra, grid=(("fedpcd-tau", 0.02), ("lr", 0.3)), seed=s,
                                           overrides={**extra.overrides, "fedpcd-tau": 0.02, "lr": 0.3})
                       for s in (0, 1))
        return sw

    def mean(g):  # best at tau 0.01, lr 0.03: its own extensions elsewhere
        return 0.9 - abs(g["fedpcd-tau"] - 0.01) - abs(g["lr"] - 0.03)

    def worst(g):
        return 0.5 - abs(g["fedpcd-tau"] - 0.05) - abs(g["lr"] - 0.1)

    declared = sweep()
    finish(declared, tmp_path, mean, worst=worst)
    only_mean = {r.grid for r in tuning.extensions(declared, tmp_path)}
    both = {r.grid for r in tuning.extensions(sweep(**{"extend-objectives": ["mean", "worst10"]}), tmp_path)}
    assert sorted(both - only_mean) == sorted([(("fedpcd-tau", 0.05), ("lr", 0.3)),
                                               (("fedpcd-tau", 0.02), ("lr", 0.1)),
                                               (("fedpcd-tau", 0.125), ("lr", 0.1))])
    assert only_mean <= both
    worst_only = {r.grid for r in tuning.extensions(sweep(**{"extend-objectives": ["worst10"]}), tmp_path)}
    assert worst_only == both - only_mean | (worst_only & only_mean)


def test_extend_edges_is_off_without_tuning_or_when_disabled(tmp_path):
    plain = sweep_mod.parse_sweep({"name": "p", "methods": [{"name": "a", "method": "fedavg", "lr": [0.01, 0.1]}]})
    assert plain.tuning is None
    assert tuning.extend_edges(plain, tmp_path, lambda: pytest.fail("no pass")) == []
    off = make_sweep(budget=4, **{"extend-edges": False})
    finish(off, tmp_path, peak_at(0.3))
    assert tuning.extend_edges(off, tmp_path, lambda: pytest.fail("no pass")) == []


def test_the_sweep_command_runs_the_extension_passes(tmp_path, monkeypatch):
    """sweep.main: after the first pass, the edge extensions run in the same output folder."""
    (tmp_path / "s.toml").write_text('name = "t"\nseeds = [0]\n[tuning]\nbudget = 2\n'
                                     '[tuning.grids.fedavg]\nlr = [0.01, 0.03]\n'
                                     '[[methods]]\nname = "fedavg"\nmethod = "fedavg"\n')
    passes = []

    def fake_run_sweep(sweep, out, **_):
        passes.append(finish(sweep, out, peak_at(0.1)))
        return []

    monkeypatch.setattr(sweep_mod, "run_sweep", fake_run_sweep)
    monkeypatch.setattr(sweep_mod, "report_and_figures", lambda out: None)
    assert sweep_mod.main([str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")]) == 0
    # 0.03 best (edge) -> 0.09; 0.09 best (edge) -> 0.27; then 0.09 is interior
    assert passes == [2, 1, 1]
    points = sorted(p.parent.parent.name for p in (tmp_path / "out").rglob("summary.json"))
    assert points == ["lr=0.01", "lr=0.03", "lr=0.09", "lr=0.27"]


def test_fedavg_under_the_missing_weighting_is_added_when_weightings_differ():
    sw = make_sweep(budget=4, methods=[{"name": "fedavg", "method": "fedavg"},
                                       {"name": "afl", "method": "afl", "afl-lambda-lr": 0.1}])
    labels = list(dict.fromkeys(r.method for r in sw.runs))
    assert labels == ["fedavg", "afl", "fedavg-uniform"]
    added = {r.overrides["fedavg-weighting"] for r in sw.runs if r.method == "fedavg-uniform"}
    assert added == {"uniform"} and len(configs(sw, "fedavg-uniform")) == 4  # the same budget
    # one weighting only, or switched off: nothing added
    same = make_sweep(budget=4, methods=[{"name": "fedavg", "method": "fedavg"}, {"name": "p", "method": "fedprox",
                                                                                "fedprox-mu": 0.01}])
    assert {r.method for r in same.runs} == {"fedavg", "p"}
    off = make_sweep(budget=4, methods=[{"name": "afl", "method": "afl", "afl-lambda-lr": 0.1}],
                     **{"fedavg-both-weightings": False})
    assert {r.method for r in off.runs} == {"afl"}
    both = make_sweep(budget=4, methods=[{"name": "afl", "method": "afl", "afl-lambda-lr": 0.1}])
    assert list(dict.fromkeys(r.method for r in both.runs)) == ["afl"]  # a single rule: nothing to compare


def test_federage_declared_reductions_give_fedavg_weights():
    """The declarations the tuner reads hold in the client's maths: at γ = 0, and at α = 1 with
    β = β_min = 0 (losses are >= 0), every step's risk weight is exactly 1 (plain SGD), so β never
    moves (its step is η_β (1 − w) = 0). Measured end to end: FedAvg (uniform), FedeRage γ = 0 and
    FedeRage α = 1, γ = 0.1 give byte-identical final models (issue 42 report)."""
    import torch

    from client_app.methods.federage import risk_weights

    losses = torch.tensor([0.0, 0.3, 2.5, 7.0])
    assert torch.equal(risk_weights(losses, 1.0, 0.1, 0.0), torch.ones(4))
    assert torch.equal(risk_weights(losses, 0.0, 1.0, 0.1), torch.ones(4))
    assert not torch.equal(risk_weights(losses, 1.0, 0.1, 0.3), torch.ones(4))  # a real risk weight


# -- issue 52: the paper's iterate, three values per tuned key, equal budgets, declared primaries --------
def test_selection_reads_the_declared_iterate(tmp_path):
    """A run scored on the averaged iterate records its last one too (iterate_scores.last): with
    [tuning] iterate = "last" selection reads that; runs without it (AFL) keep their own."""
    sw = make_sweep(budget=4, iterate="last", **{"extend-iterates": ["last", "averaged"]})
    for run in sw.runs:
        folder = run.folder(tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        lr = dict(run.grid)["lr"]
        avg, last = peak_at(0.01)(dict(lr=lr)), peak_at(0.03)(dict(lr=lr))  # averaged: 0.01 best, last: 0.03
        (folder / "summary.json").write_text(json.dumps({
            "scored_iterate": "averaged", "mean_acc": avg, "val_mean_acc": avg,
            "iterate_scores": {"last": {"mean_acc": last, "val_mean_acc": last}}}))
    assert sw.tuning.rules.iterate == "last" and sw.tuning.iterates == ("last", "averaged")
    pick = {it: dict(tuning.selected_points(sw, tmp_path, iterate=it)[("default", "fedavg")][0])["lr"]
            for it in ("last", "averaged", "")}
    assert pick == {"last": 0.03, "averaged": 0.01, "": 0.01}
    assert dict(tuning.selected_points(sw, tmp_path)[("default", "fedavg")][0])["lr"] == 0.03  # declared: last
    s = {"scored_iterate": "averaged", "mean_acc": 0.5}
    assert tuning.view(s, "last") is s  # AFL: no last iterate recorded, its own numbers
    assert tuning.view({**s, "iterate_scores": {"last": {"mean_acc": 0.6}}}, "last")["scored_iterate"] == "last"
    with pytest.raises(sweep_mod.SweepError, match="'iterate'"):
        make_sweep(budget=4, iterate="final")


def test_min_values_gives_a_selection_at_a_bound_a_third_value():
    """β at its bound 0 with one neighbour (0.4) tried: min-values = 3 adds the next value beyond it
    (a linear step through 0: 0.8), so that no selection rests on two values."""
    class Space:
        low, high, integer = 0.0, 1.0, False

    points = {(("fedheal-beta", 0.0), ("lr", 0.1)): [], (("fedheal-beta", 0.4), ("lr", 0.1)): [],
              (("fedheal-beta", 0.0), ("lr", 0.03)): [], (("fedheal-beta", 0.0), ("lr", 0.3)): []}
    best = (("fedheal-beta", 0.0), ("lr", 0.1))
    steps = tuning.edge_steps("fedheal", best, points)
    assert ("fedheal-beta", 0.8) not in steps
    steps3 = tuning.edge_steps("fedheal", best, points, min_values=3)
    assert ("fedheal-beta", 0.8) in steps3 and set(steps) < set(steps3)


def test_equal_budgets_top_every_entry_up_to_the_largest_count(tmp_path):
    sw = make_sweep(budget=4, methods=[{"name": "fedavg", "method": "fedavg"},
                                       {"name": "fedprox", "method": "fedprox", "fedprox-mu": [0.01, 0.1],
                                        "lr": [0.01, 0.1]}],
                    **{"equal-budgets": True, "extend-edges": True})
    finish(sw, tmp_path, lambda g: peak_at(0.03)(g) - g.get("fedprox-mu", 0))

    def run_pass():
        finish(sw, tmp_path, lambda g: peak_at(0.03)(g) - g.get("fedprox-mu", 0))
        return []

    log = []
    assert tuning.extend_edges(sw, tmp_path, run_pass, log=log.append) == []
    counts = tuning.configuration_counts(sw)["default"]
    assert len(set(counts.values())) == 1, counts  # equal after extensions, reductions and top-ups
    assert any("equal-budget top-up" in line for line in log)
    lrs = sorted({dict(r.grid)["lr"] for r in sw.runs if r.method == "fedavg"})
    assert 0.0173 in lrs or 0.0548 in lrs  # a geometric midpoint next to the selected 0.03 first


def test_primary_comparisons_are_declared_in_the_sweep():
    sw = make_sweep(budget=4, methods=[{"name": "fedavg", "method": "fedavg"}, {"name": "fedpcd", "method": "fedpcd",
                                                                                "fedpcd-tau": 0.02}],
                    primary=[{"compare": ["fedpcd", "fedavg"], "metrics": ["mean_acc", "worst10_acc"],
                              "source": "FedPCD paper (000), Table 1"}])
    assert sw.tuning.primary == (tuning.Primary("fedpcd", "fedavg", ("mean_acc", "worst10_acc"), (),
                                                "FedPCD paper (000), Table 1"),)
    for bad, needle in (([{"compare": ["fedpcd"], "metrics": ["mean_acc"]}], "compare"),
                        ([{"compare": ["fedpcd", "nope"], "metrics": ["mean_acc"]}], "not a method entry"),
                        ([{"compare": ["fedpcd", "fedavg"], "metrics": ["accuracy"]}], "metrics")):
        with pytest.raises(sweep_mod.SweepError, match=needle):
            make_sweep(budget=4, methods=[{"name": "fedavg", "method": "fedavg"},
                                          {"name": "fedpcd", "method": "fedpcd", "fedpcd-tau": 0.02}], primary=bad)


def test_a_reducing_entry_follows_its_baselines_selection_onto_a_top_up_lr(tmp_path):
    # FedAvg's best lr (0.02) lies between its budget's values: an equal-budget top-up adds the
    # midpoint 0.0173 and FedAvg selects it; FedProx's reduction mu = 0 follows it there, and the
    # budgets end equal all the same (the follow-up counted, the others topped up once more)
    sw = make_sweep(budget=4, methods=[{"name": "fedavg", "method": "fedavg"},
                                       {"name": "fedprox", "method": "fedprox", "fedprox-mu": [0.01, 0.1],
                                        "lr": [0.01, 0.1]}],
                    **{"equal-budgets": True, "extend-edges": True, "max-extensions": 12,
                       "fedavg-both-weightings": False})
    score = lambda g: peak_at(0.02)(g) - g.get("fedprox-mu", 0)  # noqa: E731

    def run_pass():
        finish(sw, tmp_path, score)
        return []

    run_pass()
    base_lrs = {dict(g)["lr"] for g in configs(sw, "fedavg")}
    log = []
    assert tuning.extend_edges(sw, tmp_path, run_pass, log=log.append) == []
    (best, _), = [v for k, v in tuning.selected_points(sw, tmp_path).items() if k[1] == "fedavg"]
    assert dict(best)["lr"] not in base_lrs  # the selection sits on a top-up lr ...
    reductions = {dict(g)["lr"] for g in configs(sw, "fedprox") if dict(g)["fedprox-mu"] == 0.0}
    assert dict(best)["lr"] in reductions  # ... and FedProx's reduction was run there
    assert any("top-up" in line for line in log)
    counts = tuning.configuration_counts(sw)["default"]
    assert len(set(counts.values())) == 1, counts
    # without the follow-up rule the reduction would be missing there: the rule is what adds it
    assert tuning.reduction_followups(sw, list(tuning.selected_points(sw, tmp_path).items())) == []


def test_the_budgets_end_equal_when_the_extension_passes_run_out(tmp_path):
    # FedAvg's selection keeps moving onto its top-ups (peak at 0.02, between its budget's values),
    # FedProx's reduction follows it: one pass is not enough to settle, so a final top-up pass
    # runs after the cap and the budgets end equal all the same
    def make():
        return make_sweep(budget=4, methods=[{"name": "fedavg", "method": "fedavg"},
                                             {"name": "fedprox", "method": "fedprox", "fedprox-mu": [0.01, 0.1],
                                              "lr": [0.01, 0.1]}],
                          **{"equal-budgets": True, "extend-edges": True, "max-extensions": 1,
                             "fedavg-both-weightings": False})

    score = lambda g: peak_at(0.02)(g) - g.get("fedprox-mu", 0)  # noqa: E731
    sw = make()
    finish(sw, tmp_path, score)
    log = []
    assert tuning.extend_edges(sw, tmp_path, lambda: [finish(sw, tmp_path, score)] and [], log=log.append) == []
    assert len(log) == 2 and log[0].startswith("edge extension 1/1") and "top-up (final)" in log[1], log
    assert "max-extensions (1) reached" in log[1]
    counts = tuning.configuration_counts(sw)["default"]
    assert len(set(counts.values())) == 1, counts
    # without the final pass the cap would have left them unequal
    capped = make()
    capped.runs.extend(tuning.extensions(capped, tmp_path))
    unequal = tuning.configuration_counts(capped)["default"]
    assert len(set(unequal.values())) > 1, unequal


def test_a_top_up_short_of_midpoints_takes_the_midpoints_of_its_own_points(tmp_path):
    # FedAvg tried lr at both of lr's declared bounds: one midpoint, nothing beyond, yet it lacks four
    # configurations; the midpoints between the values tried and chosen fill the rest
    low, high = tuning.LR.low, tuning.LR.high
    sw = make_sweep(budget=6, methods=[{"name": "fedavg", "method": "fedavg"},
                                       {"name": "fedprox", "method": "fedprox", "fedprox-mu": [0.01, 0.1],
                                        "lr": [0.01, 0.03, 0.1]}],
                    **{"equal-budgets": True, "fedavg-both-weightings": False})
    sw.runs[:] = [r for r in sw.runs if r.method != "fedavg"] + [
        dataclasses.replace(r, grid=(("lr", lr),), overrides={**r.overrides, "lr": lr})
        for r in sw.runs if r.method == "fedavg" and dict(r.grid)["lr"] == 0.01 for lr in (low, high)]
    finish(sw, tmp_path, peak_at(0.03))
    counts = tuning.configuration_counts(sw)["default"]
    missing = max(counts.values()) - counts["fedavg"]
    assert missing >= 3, counts
    new = {dict(r.grid)["lr"] for r in tuning.top_ups(sw, tmp_path) if r.method == "fedavg"}
    assert len(new) == missing and not new & {low, high} and all(low < lr < high for lr in new)
    first = float(f"{math.sqrt(low * high):.3g}")
    assert first in new  # the one midpoint of the values tried, then the midpoints around it
