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


# An exception inside a strategy's aggregation: stop the run (after the round's record, a
# checkpoint and a summary with complete = false), or log it and keep the model.
ON_AGGREGATION_ERROR = ("stop", "keep")


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


def check(raw: Mapping[str, Scalar]) -> RunConfig:
    """Every key of a full flat run config checked (one-line :class:`ConfigError`), nothing built."""
    from client_app import attacks
    from fedpcd_app import checkpoint, secagg
    from fedpcd_app.sampler import PARTICIPATION, RARE_CHOICES
    from strategies import privacy
    from strategies.wrappers import check_update_clip

    cfg = parse_run_config(raw)
    cls = registry.strategy_class(cfg.method)
    cls.Params.from_run_config(cfg.params)
    if not cfg.get_bool("allow-unused-keys", False):
        own = cls.Params.run_config_keys()
        for key, default in registry.method_keys().items():
            if key not in own and key in cfg.params and cfg.params[key] != default:
                raise ConfigError(
                    f"run-config key '{key}' = {cfg.params[key]!r} is not used by method '{cfg.method}': "
                    "remove it, choose the method it belongs to, or set allow-unused-keys=true"
                )
    cls.resolve_device(cfg.server_device)  # 'cuda' on a machine without one fails here
    cfg.get_choice("participation", PARTICIPATION, "uniform")
    cfg.get_int("availability-rare-clients", 3, low=0, high=cfg.num_clients)
    cfg.get_float("availability-rare-prob", 0.01, low=0.0, high=1.0, low_open=True)
    cfg.get_choice("availability-rare-choice", RARE_CHOICES, "rarest-classes")
    cfg.get_int("checkpoint-every", 10, low=0)
    cfg.get_int("checkpoint-keep", 2, low=1)
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
    if secagg.enabled(cfg):
        secagg.check_strategy(cfg, cls)
        secagg.workflow_settings(cfg)
    attacks.attacked_partitions(cfg.as_dict())  # the attack keys, partition ids in range
    if check_update_clip(cfg.get_float("update-clip", 0.0)) and secagg.enabled(cfg):
        raise ConfigError(f"run-config key 'update-clip' = {cfg.params['update-clip']} needs each update, which "
                          "secure aggregation hides: set secure-aggregation=false or update-clip=0")
    privacy.check(privacy.Params.from_run_config(cfg.params), cfg.method, cls.needs_individual_updates,
                  cfg.clients_per_round, secagg.enabled(cfg))
    cfg.get_choice("on-aggregation-error", ON_AGGREGATION_ERROR, "stop")
    _check_node_data(cfg)
    return cfg


def _check_node_data(cfg: RunConfig) -> None:
    """``client-data`` and its keys; with nodes that bring their own data, what needs a
    dataset on the server is refused in one line."""
    from client_app import local_data

    if not local_data.settings(cfg).node:
        return
    if cfg.eval_mode == "server":
        raise ConfigError(
            "run-config key 'eval-mode' = 'server' scores every client's test split on the server, which holds no "
            "client data with client-data='node': use eval-mode='federated' (each node scores its own "
            "test.parquet); central-test-path='<folder or .parquet>' adds a central test set"
        )
    if cfg.dataset_path:
        raise ConfigError(f"run-config key 'dataset-path' = '{cfg.dataset_path}' is not read with client-data='node' "
                          "(each node reads its own data-path): set dataset-path=\"\" (a central test set is "
                          "central-test-path)")
    if (cfg.params.get("participation") == "skewed"
            and cfg.params.get("availability-rare-choice") == "rarest-classes"):
        raise ConfigError("run-config key 'availability-rare-choice' = 'rarest-classes' needs every client's labels "
                          "on the server, which client-data='node' does not give: use availability-rare-choice='last'")


def validate(raw: Mapping[str, Scalar], *, resolve_defaults: bool = False) -> Setup:
    """:func:`check` every key, then build the run's strategy (once) and initial model."""
    from client_app.models import initial_model
    from fedpcd_app.results import default_output_dir

    raw = resolve(raw) if resolve_defaults else dict(raw)
    cfg = check(raw)
    model = initial_model(cfg)
    strategy = registry.build(cfg, model=model)
    if not cfg.output_dir:
        raw["output-dir"] = str(default_output_dir(cfg))
        cfg = cfg.replace(output_dir=raw["output-dir"])
    return Setup(raw, cfg, strategy, model, cfg.get_int("checkpoint-every", 10), cfg.get_int("checkpoint-keep", 2),
                 str(cfg.params.get("resume-from", "")))


def load_setup(overrides: Mapping[str, Any] | str | None = None) -> Setup:
    """Defaults + overrides (a dict or flwr's ``"k=v ..."`` text) → a validated :class:`Setup`."""
    from fedcore.config import parse_overrides

    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return validate(overrides or {}, resolve_defaults=True)
