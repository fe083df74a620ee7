"""Presets (run_configs/): each is a valid run config, and the offline baseline presets are
the shared digits setting plus their method's own keys."""

import tomllib
from pathlib import Path

import pytest

from fedcore.config import load_config
from fedpcd_app.server.config import check

RUN_CONFIGS = Path(__file__).parent.parent / "run_configs"
PRESETS = sorted(RUN_CONFIGS.glob("*.toml")) + sorted((RUN_CONFIGS / "baselines").glob("*.toml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_passes_the_full_validation(preset):
    cfg = load_config(str(preset))
    check(cfg.as_dict())


@pytest.mark.parametrize("preset", sorted((RUN_CONFIGS / "baselines").glob("*.toml")), ids=lambda p: p.name)
def test_baseline_presets_are_the_digits_setting_plus_method_keys(preset):
    raw = tomllib.loads(preset.read_text())
    digits = tomllib.loads((RUN_CONFIGS / "digits.toml").read_text())
    cfg = load_config(str(preset))
    assert cfg.method == preset.name.split("_")[0]
    assert {k: v for k, v in raw.items() if k in digits and k != "method"} == {k: v for k, v in digits.items()
                                                                               if k != "method"}
    assert all(k in digits or k.startswith(cfg.method + "-") for k in raw)


# Paper presets and the sweeps that reproduce the same paper's tables run the same rounds.
FAMILIES = [
    ("fedpcd_*.toml", ["fedpcd_table1.toml", "fedpcd_ablation.toml", "fedpcd_history.toml"]),
    ("craft_*.toml", ["craft_table1.toml"]),
    ("federage_*.toml", ["federage_table1.toml"]),
    ("digits_fedpcd.toml", ["fedpcd_table1_digits.toml", "fedpcd_ablation_digits.toml", "fedpcd_history_digits.toml"]),
    ("digits_craft.toml", ["craft_table1_digits.toml"]),
    ("digits_federage.toml", ["federage_table1_digits.toml"]),
]


def _sweep_rounds(path):
    sweep = tomllib.loads(path.read_text())
    rounds = {sweep["base"].get("num-server-rounds")}
    for entry in sweep.get("settings", []) + sweep.get("methods", []):
        rounds.add(entry.get("num-server-rounds", sweep["base"].get("num-server-rounds")))
    return rounds


@pytest.mark.parametrize("pattern, sweeps", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_presets_and_sweeps_of_one_paper_run_the_same_rounds(pattern, sweeps):
    presets = sorted(RUN_CONFIGS.glob(pattern))
    assert presets
    preset_rounds = {load_config(str(p)).num_server_rounds for p in presets}
    sweep_rounds = set().union(*(_sweep_rounds(RUN_CONFIGS / "sweeps" / s) for s in sweeps))
    assert preset_rounds == sweep_rounds, (pattern, preset_rounds, sweeps, sweep_rounds)


@pytest.mark.parametrize("sweep", ["federage_table1.toml", "federage_table1_digits.toml"])
def test_federage_table1_sweeps_follow_algorithm_2_over_five_seeds(sweep):
    spec = tomllib.loads((RUN_CONFIGS / "sweeps" / sweep).read_text())
    assert spec["seeds"] == [0, 1, 2, 3, 4]  # Table I: five seeds
    assert spec["base"]["local-steps"] > 0 and spec["base"]["val-fraction"] > 0
    assert spec["base"]["eval-averaged-iterate"] is True  # every method on the same (averaged) iterate
    assert not any("eval-averaged-iterate" in m for m in spec["methods"])
    for preset in sorted(RUN_CONFIGS.glob("federage_*.toml")) + [RUN_CONFIGS / "digits_federage.toml"]:
        cfg = load_config(str(preset))
        assert cfg.local_steps > 0 and cfg.val_fraction > 0 and cfg.eval_averaged_iterate is True
