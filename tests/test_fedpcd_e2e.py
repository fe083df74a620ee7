"""FedPCD end to end: presets parse, the aggregation benchmark harness, one tiny simulation."""

import json
import tomllib
from pathlib import Path

import pytest

from fedcore.config import load_config
from strategies import fedpcd, registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "run_configs").glob("*fedpcd*.toml")))
def test_presets_build_fedpcd(preset):
    raw = tomllib.loads((ROOT / "run_configs" / preset).read_text())
    strat = registry.build(load_config(raw))
    assert isinstance(strat, fedpcd.FedPCD)


def test_digits_preset_is_the_shared_setting_plus_method():
    shared = tomllib.loads((ROOT / "run_configs" / "digits.toml").read_text())
    ours = tomllib.loads((ROOT / "run_configs" / "digits_fedpcd.toml").read_text())
    assert ours == {**shared, "method": "fedpcd"}


def test_aggregation_benchmark_json_lines(capsys):
    from benchmarks import aggregation

    aggregation.main(["--methods", "fedpcd,fedavg", "--sizes", "mlp", "--replies", "4", "--clients", "12",
                      "--rounds", "5", "--timed", "2", "--json", "--set", "fedpcd-history=2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["strategy"] for r in rows] == ["fedpcd", "fedavg"]
    for r in rows:
        assert {"strategy", "params", "replies", "cache", "seconds", "fedavg_seconds", "ratio"} <= set(r)
        assert r["replies"] == 4 and r["seconds"] > 0 and r["fedavg_seconds"] > 0
    assert 4 < rows[0]["cache"] <= 12 and rows[1]["cache"] == 0  # window of 3 rounds × 4 replies


@pytest.mark.slow
def test_fedpcd_simulation_reports_diagnostics(tmp_path):
    from fedpcd_app.runtime.simulate import simulate
    from fedpcd_app.server.results import read_rounds, read_summary

    out = simulate({"method": "fedpcd", "num-server-rounds": 2, "num-clients": 6, "fraction-train": 0.5,
                    "fedpcd-tau": 0.3, "eval-every": 2, "output-dir": str(tmp_path)})
    rounds = read_rounds(out)
    assert len(rounds) == 2
    second = rounds[1]["strategy"]
    seen = set(rounds[0]["sampled"]) | set(rounds[1]["sampled"])
    assert second[fedpcd.M_CONSTRAINTS] == len(seen)  # current + cached, no double counting
    assert second[fedpcd.M_SOLVER_OK] == 1
    assert second[fedpcd.M_CORRECTED] == int(second[fedpcd.M_ACTIVE] > 0)
    for key in (fedpcd.M_ACTIVE, fedpcd.M_COSINE, fedpcd.M_SOLVER_STATUS, fedpcd.M_SOLVE_SECONDS,
                fedpcd.M_FALLBACKS):
        assert key in second
    assert 0.0 < read_summary(out)["mean_acc"] <= 1.0


@pytest.mark.slow
def test_corrections_happen_where_clients_conflict(tmp_path):
    """A setting where the FedAvg direction must violate some constraint (clients holding one
    class each, τ = 0.5): some round has an active constraint, and there the applied direction
    really differs from ḡ (cosine < 1) — not only the corrected flag that follows from it."""
    from tests.golden.harness import run_in_process

    _, rounds, _ = run_in_process({
        "method": "fedpcd", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 3,
        "partitioner": "pathological", "classes-per-client": 1, "fedpcd-tau": 0.5, "eval-every": 0,
        "checkpoint-every": 0, "output-dir": str(tmp_path)})
    diags = [r["strategy"] for r in rounds]
    assert any(d[fedpcd.M_ACTIVE] > 0 for d in diags), diags
    for d in diags:
        assert d[fedpcd.M_SOLVER_OK] == 1
        if d[fedpcd.M_ACTIVE] > 0:
            assert d[fedpcd.M_COSINE] < 1.0 - 1e-4 and d[fedpcd.M_CORRECTED] == 1
