"""Presets (run_configs/): each is a valid run config, and the offline baseline presets are
the shared digits setting plus their method's own keys."""

import tomllib
from pathlib import Path

import pytest

from fedcore.config import load_config
from fedpcd_app.config import check

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
