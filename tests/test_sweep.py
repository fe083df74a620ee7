"""Sweep files: expansion into runs, validation before launch, presets, restart after interruption."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedpcd_app.analysis import sweep
from fedpcd_app.server.results import read_rounds, read_summary

ROOT = Path(__file__).resolve().parent.parent


def _sweep(**extra):
    source = {
        "name": "t",
        "seeds": [0, 1],
        "base": {"num-clients": 6, "lr": 0.1},
        "settings": [{"name": "a0.1", "dirichlet-alpha": 0.1}, {"name": "a1", "dirichlet-alpha": 1.0}],
        "methods": [{"name": "fedavg", "method": "fedavg"},
                    {"name": "grid", "method": "fedavg", "lr": [0.05, 0.2], "local-epochs": [1, 2]}],
    }
    source.update(extra)
    return sweep.parse_sweep(source)


def test_expansion_counts_labels_and_precedence():
    s = _sweep()
    # 2 settings × (1 + 2·2 grid points) × 2 seeds
    assert len(s.runs) == 2 * 5 * 2
    grid = [r for r in s.runs if r.method == "grid" and r.setting == "a1" and r.seed == 1]
    assert [r.variant for r in grid] == ["lr=0.05,local-epochs=1", "lr=0.05,local-epochs=2",
                                         "lr=0.2,local-epochs=1", "lr=0.2,local-epochs=2"]
    r = grid[1]
    # method grid beats base (lr), setting key present, seed from the seeds list
    assert r.overrides == {"num-clients": 6, "lr": 0.05, "dirichlet-alpha": 1.0, "method": "fedavg",
                           "local-epochs": 2, "seed": 1}
    assert r.folder(Path("/o")) == Path("/o/a1/grid/lr=0.05,local-epochs=2/seed1")
    plain = next(x for x in s.runs if x.method == "fedavg")
    assert plain.variant == "base" and plain.overrides["lr"] == 0.1


def test_paired_seeds_share_everything_but_the_method_keys():
    s = _sweep()
    for seed in (0, 1):
        runs = [r for r in s.runs if r.seed == seed and r.setting == "a0.1"]
        common = {k: v for k, v in runs[0].overrides.items() if k not in ("lr", "local-epochs")}
        for r in runs:
            assert {k: v for k, v in r.overrides.items() if k not in ("lr", "local-epochs")} == common


@pytest.mark.parametrize("change, message", [
    ({"methods": [{"name": "x", "method": "no-such-method"}]}, "method 'no-such-method' is not registered"),
    ({"methods": [{"name": "x", "method": "fedavg", "fedavg-foo": 1}]}, "unknown run-config key 'fedavg-foo'"),
    ({"methods": [{"name": "x", "method": "fedavg", "lr": [0.1, -1.0]}]}, "'lr' = -1.0 must be > 0"),
])
def test_validate_fails_at_once_with_one_line(change, message):
    s = _sweep(**change)
    with pytest.raises(sweep.SweepError, match=message) as info:
        sweep.validate(s)
    assert "\n" not in str(info.value) and "method entry 'x'" in str(info.value)


@pytest.mark.parametrize("change, message", [
    ({"base": {"lr": [0.1, 0.2]}}, "grids go in \\[\\[methods\\]\\] entries only"),
    ({"base": {"seed": 3}}, "use 'seeds'"),
    ({"methods": [{"method": "fedavg"}]}, "has no 'name'"),
    ({"methods": [{"name": "a"}, {"name": "a"}]}, "used twice"),
    ({"seeds": []}, "non-empty list"),
    ({"metods": []}, "unknown top-level key"),
    ({"methods": [{"name": "a", "lr": []}]}, "empty list"),
])
def test_malformed_sweep_files(change, message):
    with pytest.raises(sweep.SweepError, match=message):
        _sweep(**change)


def test_cli_unknown_method_fails_before_any_run(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name = "s"\nseeds = [0]\n[[methods]]\nname = "a"\nmethod = "fedavg"\n'
                 '[[methods]]\nname = "b"\nmethod = "nosuch"\n')
    proc = subprocess.run([sys.executable, "-m", "fedpcd_app.sweep", str(f), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "method 'nosuch' is not registered" in proc.stderr
    assert not (tmp_path / "o").exists()


PRESETS = sorted((ROOT / "run_configs" / "sweeps").glob("*.toml"))


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_presets_parse(path):
    s = sweep.load_sweep(path)
    assert s.runs and len({r.folder(Path("/o")) for r in s.runs}) == len(s.runs)
    if all(r.overrides.get("method", "fedavg") == "fedavg" for r in s.runs):
        sweep.validate(s)


@pytest.mark.slow
def test_interrupted_sweep_restarts_and_finishes_the_rest(tmp_path):
    # Prepare: a real 2-run fedavg sweep (2 rounds each), TensorBoard on to cover the hook
    f = tmp_path / "tiny.toml"
    f.write_text('name = "tiny"\nseeds = [0, 1]\n[base]\nnum-clients = 4\nnum-server-rounds = 2\n'
                 'eval-every = 1\ntensorboard = true\n[[methods]]\nname = "fedavg"\nmethod = "fedavg"\n')
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fedpcd_app.sweep", str(f), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first, second = (out / "default" / "fedavg" / "base" / f"seed{k}" for k in (0, 1))
    # Execute: interrupt the sweep once the first run has finished
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (first / "summary.json").is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the local engine may finish both runs before the poll sees the first
        pass
    proc.wait()
    if (second / "summary.json").is_file():  # then the kill came too late: undo the second run
        shutil.rmtree(second)
    assert (first / "summary.json").is_file()
    assert not (second / "summary.json").is_file()
    stamp = (first / "summary.json").stat().st_mtime_ns
    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    # Assert: the finished run is kept as it was, the other one is done now
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "2 runs (1 already done)" in rerun.stdout
    assert (first / "summary.json").stat().st_mtime_ns == stamp
    s0, s1 = read_summary(first), read_summary(second)
    assert (s0["seed"], s1["seed"]) == (0, 1) and s1["rounds"] == 2
    assert json.loads((second / "run.json").read_text())["seed"] == 1
    # TensorBoard scalars equal the rounds.jsonl records
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(second / "tensorboard"))
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("eval/mean_acc")]
    expected = [(r["round"], r["eval"]["mean_acc"]) for r in read_rounds(second)]
    assert [s for s, _ in logged] == [1, 2]
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_by_setting_keys_override_the_method_entry_for_that_setting_only():
    s = _sweep(methods=[{"name": "m", "method": "fedavg", "lr": 0.1,
                         "by-setting": {"a1": {"lr": [0.3, 0.4]}}}])
    assert [r.overrides["lr"] for r in s.runs if r.setting == "a0.1"] == [0.1, 0.1]
    assert [(r.variant, r.seed) for r in s.runs if r.setting == "a1"] == [
        ("lr=0.3", 0), ("lr=0.3", 1), ("lr=0.4", 0), ("lr=0.4", 1)]
    with pytest.raises(sweep.SweepError, match="keyed by setting names"):
        _sweep(methods=[{"name": "m", "by-setting": {"nosuch": {"lr": 0.2}}}])


def test_finished_run_with_other_overrides_is_not_reused(tmp_path):
    s = _sweep()
    run = s.runs[0]
    folder = run.folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    (folder / "run.json").write_text(json.dumps({**run.labels(), "overrides": {**run.overrides, "lr": 0.3}}))
    with pytest.raises(sweep.SweepError, match="finished run made with other settings"):
        sweep.check_finished(s, tmp_path)
    (folder / "run.json").write_text(json.dumps(run.labels()))
    sweep.check_finished(s, tmp_path)  # same overrides: reused


def _source():
    return {"name": "t", "seeds": [0, 1, 2], "base": {"num-clients": 6, "lr": 0.1},
            "settings": [{"name": "a0.1", "dirichlet-alpha": 0.1}, {"name": "a1", "dirichlet-alpha": 1.0}],
            "methods": [{"name": "fedavg", "method": "fedavg"},
                        {"name": "prox", "method": "fedprox", "lr": [0.05, 0.2],
                         "by-setting": {"a1": {"lr": 0.3}}},
                        {"name": "pcd", "method": "fedpcd", "fedpcd-tau": [0.01, 0.02]}]}


def test_set_holds_for_every_run_over_base_and_entries():
    cut = sweep.cut_down(_source(), sets=["lr=0.5", "num-server-rounds=3", "dataset=digits", "tensorboard=true"])
    s = sweep.parse_sweep(cut)
    assert {r.overrides["lr"] for r in s.runs} == {0.5}  # over [base], the grid and the by-setting table
    assert {r.overrides["num-server-rounds"] for r in s.runs} == {3}
    assert {r.overrides["dataset"] for r in s.runs} == {"digits"} and all(r.overrides["tensorboard"] is True
                                                                           for r in s.runs)
    assert _source()["methods"][1]["lr"] == [0.05, 0.2]  # the file's content is not changed
    for bad, message in [("seed=3", "use --seeds"), ("output-dir=x", "use --out"), ("lr", "give key=value"),
                         ("lr=[0.1, 0.2]", "one scalar")]:
        with pytest.raises(sweep.SweepError, match=message):
            sweep.cut_down(_source(), sets=[bad])


def test_seeds_and_only_cut_the_runs_down():
    s = sweep.parse_sweep(sweep.cut_down(_source(), seeds="1"))
    assert {r.seed for r in s.runs} == {1} and len(s.runs) == (1 + 2 + 2) + (1 + 1 + 2)  # a1: prox lr=0.3 alone
    s = sweep.parse_sweep(sweep.cut_down(_source(), only=["method=fedavg"]))
    assert {r.method for r in s.runs} == {"fedavg"} and len(s.runs) == 2 * 3
    s = sweep.parse_sweep(sweep.cut_down(_source(), only=["pcd", "prox"], seeds="0,2"))
    assert {r.method for r in s.runs} == {"pcd", "prox"} and {r.seed for r in s.runs} == {0, 2}
    s = sweep.parse_sweep(sweep.cut_down(_source(), only=["setting=a1", "method=fedprox"]))
    assert {(r.setting, r.method, r.overrides["lr"]) for r in s.runs} == {("a1", "prox", 0.3)}
    s = sweep.parse_sweep(sweep.cut_down(_source(), only=["setting=a0.1"]))  # by-setting of a1 dropped with it
    assert {r.setting for r in s.runs} == {"a0.1"} and {r.variant for r in s.runs if r.method == "prox"} == {
        "lr=0.05", "lr=0.2"}
    s = sweep.parse_sweep(sweep.cut_down(_source(), only=["lr=0.1"]))  # the base's value counts
    assert {r.method for r in s.runs} == {"fedavg", "pcd"}
    for only, message in [(["nosuch"], "no \\[\\[methods\\]\\] entry matches \\(entries: fedavg, prox, pcd\\)"),
                          (["setting=nosuch"], "no such \\[\\[settings\\]\\] entry")]:
        with pytest.raises(sweep.SweepError, match=message):
            sweep.cut_down(_source(), only=only)
    for seeds in ("0,x", "1,1", "-1"):
        with pytest.raises(sweep.SweepError, match="--seeds"):
            sweep.cut_down(_source(), seeds=seeds)


def test_dry_run_prints_one_line_per_run_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    preset = ROOT / "run_configs" / "sweeps" / "fedpcd_ablation_digits.toml"
    code = sweep.main([str(preset), "--out", str(out), "--dry-run", "--seeds", "0,1", "--only", "fedavg-data-size",
                       "--set", "num-server-rounds=3"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and not out.exists()
    runs = [line.split(None, 2) for line in lines[1:]]
    assert lines[0].startswith("fedpcd-ablation-digits: 6 runs (0 already done)") and len(runs) == 6  # 3 lr x 2 seeds
    assert [folder for _, folder, _ in runs] == [f"default/fedavg-data-size/lr={lr}/seed{s}"
                                                 for lr in ("0.03", "0.1", "0.3") for s in (0, 1)]
    overrides = [json.loads(o) for _, _, o in runs]
    assert [o["seed"] for o in overrides] == [0, 1] * 3
    assert all(o["method"] == "fedavg" and o["num-server-rounds"] == 3 for o in overrides)
    assert sweep.main([str(preset), "--dry-run", "--only", "nosuch"]) == 2
    assert "no [[methods]] entry matches" in capsys.readouterr().err


def test_an_entry_run_at_defaults_beside_selected_ones_is_marked_untuned(tmp_path):
    """issue 42: a quick sweep ran CRAFT at its default step beside FedPCD and FedAvg at selected
    values, and its budget line read the same for every entry."""
    from fedpcd_app.analysis import report
    from tests.helpers import make_run

    sw = sweep.load_sweep(Path("run_configs/sweeps/all_methods_digits.toml"), only=["fedavg", "fedpcd", "craft"],
                          seeds="0")
    notes = {r.method: r.labels().get("tuned_from", "") for r in sw.runs}
    assert notes["fedavg"].startswith("docs/results/fedpcd_ablation_digits") and notes["craft"] == ""
    assert all("tuned-from" not in r.overrides for r in sw.runs)  # not a run-config key
    for run in sw.runs:  # finished runs with the sweep's labels
        folder = make_run(tmp_path, run.setting, run.method, 0, [0.8] * 4, registered=run.overrides["method"])
        (folder / "run.json").write_text(json.dumps(run.labels()))
    md, csv_path = report.report(tmp_path, mixed_weightings=True)
    rows = {r["method"]: r["untuned"] for r in csv.DictReader(open(csv_path))}
    assert rows == {"fedavg": "0", "fedpcd": "0", "craft": "1"}
    text = md.read_text()
    assert "| craft |" in text and "untuned: its defaults" in text and "**Untuned**" in text
    assert "Values selected elsewhere: fedavg (docs/results/fedpcd_ablation_digits" in text
    with pytest.raises(sweep.SweepError, match="'tuned-from' must be a string"):
        sweep.parse_sweep({"name": "t", "methods": [{"name": "a", "method": "fedavg", "tuned-from": 3}]})
