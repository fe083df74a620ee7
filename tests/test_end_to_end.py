"""End to end: the in-process entry point (local engine) and `flwr run .` (Flower's engine)."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from fedpcd_app.runtime.simulate import simulate
from fedpcd_app.server.results import read_rounds, read_summary

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 1,
         "dirichlet-alpha": 0.5, "seed": 7}
SUMMARY_KEYS = ["method", "seed", "rounds", "mean_acc", "std_acc", "worst10_acc", "best10_acc",
                "min_acc", "jain", "central_acc", "config"]
METRICS = ["mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain", "central_acc", "client_acc"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    return simulate({**SMALL, "output-dir": str(tmp_path_factory.mktemp("run1"))})


@pytest.mark.slow
def test_simulation_writes_the_three_result_files(first_run):
    summary = read_summary(first_run)
    for key in SUMMARY_KEYS:
        assert key in summary, key
    assert summary["method"] == "fedavg" and summary["seed"] == 7 and summary["rounds"] == 2
    for key in ("mean_acc", "worst10_acc", "best10_acc", "min_acc", "central_acc"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["config"]["num-clients"] == 6
    rounds = read_rounds(first_run)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["num_replies"] == 3 and r["num_dropped"] == 0 and "train_loss" in r
        assert len(r["eval"]["client_acc"]) == 6  # every client scored, not a sample
    with open(first_run / "clients.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["partition_id"]) for r in rows] == list(range(6))
    assert sum(int(r["times_sampled"]) for r in rows) == 2 * 3
    assert all(int(r["num_train"]) > 0 and int(r["num_test"]) > 0 for r in rows)
    assert [float(r["final_acc"]) for r in rows] == pytest.approx(summary["client_acc"])


@pytest.mark.slow
def test_same_seed_gives_identical_metrics(first_run, tmp_path):
    again = simulate({**SMALL, "output-dir": str(tmp_path)})
    a, b = read_summary(first_run), read_summary(again)
    assert {k: a[k] for k in METRICS} == {k: b[k] for k in METRICS}
    ra, rb = read_rounds(first_run), read_rounds(again)
    assert [r["sampled"] for r in ra] == [r["sampled"] for r in rb]
    assert [r["train_loss"] for r in ra] == [r["train_loss"] for r in rb]


# `flwr run .` through the scripts' local SuperLink to finished:completed, its report and figures
# included: tests/test_scripts.py::test_two_runs_at_once_from_one_checkout_both_complete.


@pytest.mark.slow
def test_simulate_cli_runs_without_a_deprecation_banner(tmp_path):
    """`python -m fedpcd_app.simulate`: writes the results, prints the folder last, exits 0,
    and nothing it prints is Flower's deprecation banner (it no longer calls run_simulation)."""
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "fedpcd_app.simulate", "--workers", "2", "--run-config",
         f"num-clients=4 num-server-rounds=2 fraction-train=0.5 output-dir='{out}'"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    assert "deprecat" not in (proc.stdout + proc.stderr).lower()
    assert read_summary(out)["rounds"] == 2


def test_simulate_cli_rejects_bad_config_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "fedpcd_app.simulate", "--run-config", "method='nope'"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: run-config key 'method'")
    assert len(proc.stderr.strip().splitlines()) == 1
