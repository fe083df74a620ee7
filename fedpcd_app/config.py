"""One pass over the run config, before any node starts: everything a run needs, checked.

:func:`validate` parses the experiment keys (:func:`fedcore.config.parse_run_config`), the
method's ``Params`` (every one of its keys, typed and range-checked), the sampler, the
checkpoint and ``resume-from`` keys and secure aggregation, builds the strategy (once) and
the initial model, and returns them as a :class:`Setup`. A bad value stops the run with
one line naming the key and the fix, before Ray, the SuperLink or any node is involved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedcore.config import ConfigError, RunConfig, Scalar, parse_run_config, resolve
from strategies import registry
from strategies.base import FairStrategy


@dataclasses.dataclass
class Setup:
    """A validated run: its typed config, its strategy and its initial model."""

    raw: dict[str, Scalar]  # the full flat run config (output-dir resolved)
    cfg: RunConfig
    strategy: FairStrategy
    model: torch.nn.Module  # the initial global model (seeded)
    checkpoint_every: int
    checkpoint_keep: int
    resume_from: str


def validate(raw: Mapping[str, Scalar], *, resolve_defaults: bool = False) -> Setup:
    """Check every key of a run config and build the run's strategy and initial model."""
    from client_app.models import initial_model
    from fedpcd_app import checkpoint, secagg
    from fedpcd_app.results import default_output_dir
    from fedpcd_app.sampler import PARTICIPATION, RARE_CHOICES

    raw = resolve(raw) if resolve_defaults else dict(raw)
    cfg = parse_run_config(raw)
    registry.strategy_class(cfg.method)  # the method exists
    cfg.get_choice("participation", PARTICIPATION, "uniform")
    cfg.get_int("availability-rare-clients", 3, low=0, high=cfg.num_clients)
    cfg.get_float("availability-rare-prob", 0.01, low=0.0, high=1.0, low_open=True)
    cfg.get_choice("availability-rare-choice", RARE_CHOICES, "rarest-classes")
    every = cfg.get_int("checkpoint-every", 0, low=0)
    keep = cfg.get_int("checkpoint-keep", 2, low=1)
    cfg.get_bool("tensorboard", False)
    resume_from = str(cfg.params.get("resume-from", ""))
    if resume_from:
        if not Path(resume_from).is_dir():
            raise ConfigError(f"run-config key 'resume-from' = '{resume_from}' is not a folder: "
                              "give the output-dir of an earlier run with checkpoint-every > 0")
        if not checkpoint.rounds_in(resume_from):
            raise ConfigError(f"run-config key 'resume-from' = '{resume_from}': no checkpoint in "
                              f"{checkpoint.checkpoint_dir(resume_from)}; give the output-dir of a run "
                              "with checkpoint-every > 0")
    model = initial_model(cfg)
    strategy = registry.build(cfg, model=model)
    if secagg.enabled(cfg):
        secagg.check_strategy(cfg, strategy)
    if not cfg.output_dir:
        raw["output-dir"] = str(default_output_dir(cfg))
        cfg = cfg.replace(output_dir=raw["output-dir"])
    return Setup(raw, cfg, strategy, model, every, keep, resume_from)


def load_setup(overrides: Mapping[str, Any] | str | None = None) -> Setup:
    """Defaults + overrides (a dict or flwr's ``"k=v ..."`` text) → a validated :class:`Setup`."""
    from fedcore.config import parse_overrides

    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return validate(overrides or {}, resolve_defaults=True)
