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

from fedcore.config import ConfigError, RunConfig, Scalar, check_known, parse_run_config, resolve
from strategies import registry
from strategies.base import resolve_device
from strategies.flower import FairStrategy


@dataclasses.dataclass
class Setup:
    """A validated run: its typed config, its strategy and its initial model."""

    raw: dict[str, Scalar]  # the full flat run config (output-dir resolved)
    cfg: RunConfig
    strategy: FairStrategy
    model: torch.nn.Module  # the initial global model (seeded)


def check(raw: Mapping[str, Scalar]) -> RunConfig:
    """Every key of a full flat run config checked (one-line :class:`ConfigError`), nothing built.

    Each app key's type, range and choices were checked once, by :func:`parse_run_config`;
    here come the method's keys (its ``Params``) and the checks that need more than one key
    or something beyond the config (the method, a folder, an installed package)."""
    from fedpcd_app.server import tracking
    from fedpcd_app.server.results import check_output_dir_free, check_output_dir_reusable
    from fedpcd_app.server.sampler import rare_clients

    check_known(raw)  # a misspelt key: the closest declared ones
    cfg = parse_run_config(raw)
    _check_num_clients(cfg)  # before anything is sized by num-clients
    cls = _check_method_keys(cfg)
    resolve_device(cfg.server_device)  # 'cuda' on a machine without one fails here
    _check_weighting(cfg)
    rare_clients(cfg)  # the default adapts to federations of fewer than 4 clients
    tracking.check(cfg)  # tracking = tensorboard | wandb | none (wandb installed?)
    _check_resume(cfg)
    _check_defences(cfg, cls)
    check_output_dir_free(cfg.output_dir)  # a live run writing there: one line, before anything starts
    check_output_dir_reusable(cfg)  # another run's results there: resume-from, a new folder or overwrite
    _check_node_data(cfg)
    return cfg


def _check_method_keys(cfg: RunConfig) -> type[FairStrategy]:
    """The method's ``Params`` from its keys; another method's key set away from its default is
    refused unless ``allow-unused-keys``. Returns the method's class."""
    cls = registry.strategy_class(cfg.method)
    cls.Params.from_run_config(cfg.params).check_run(cfg.num_server_rounds, cfg.clients_per_round)
    if not cfg.allow_unused_keys:
        own = cls.Params.run_config_keys()
        for key, default in registry.method_keys().items():
            if key not in own and key in cfg.params and cfg.params[key] != default:
                raise ConfigError(
                    f"run-config key '{key}' = {cfg.params[key]!r} is not used by method '{cfg.method}': "
                    "remove it, choose the method it belongs to, or set allow-unused-keys=true"
                )
    return cls


def _check_resume(cfg: RunConfig) -> None:
    """``resume-allow-changes`` names changeable keys; ``resume-from`` is a folder with a checkpoint."""
    from fedpcd_app.server import checkpoint

    allow = checkpoint.allowed_changes(cfg.resume_allow_changes)
    unknown = sorted(k for k in allow if k not in cfg.as_dict() or k in checkpoint.FIXED)
    if unknown:
        raise ConfigError(f"run-config key 'resume-allow-changes' lists {', '.join(map(repr, unknown))}: "
                          f"give run-config "
                          f"keys other than {', '.join(checkpoint.FIXED)} (which a checkpoint cannot change), "
                          "comma-separated, e.g. 'lr,local-epochs'")
    if not cfg.resume_from:
        return
    if not Path(cfg.resume_from).is_dir():
        raise ConfigError(f"run-config key 'resume-from' = '{cfg.resume_from}' is not a folder: "
                          "give the output-dir of an earlier run with checkpoint-every > 0")
    found = checkpoint.rounds_in(cfg.resume_from)
    if not found:
        raise ConfigError(f"run-config key 'resume-from' = '{cfg.resume_from}': no checkpoint in "
                          f"{checkpoint.checkpoint_dir(cfg.resume_from)}; give the output-dir of a run "
                          "with checkpoint-every > 0")
    if found[-1] >= cfg.num_server_rounds:  # a finished run: refused here, before a SuperLink or Ray starts
        # the round resumed from is the newest checkpoint that loads (a damaged newest one falls back)
        checkpoint.check_rounds_left(cfg.resume_from, checkpoint.latest(cfg.resume_from).round,
                                     cfg.num_server_rounds)


def _check_defences(cfg: RunConfig, cls: type[FairStrategy]) -> None:
    """Secure aggregation, the attack keys, the update clip, the size bound and central DP, with
    the method and with each other."""
    from client_app import attacks
    from fedpcd_app.server import secagg
    from strategies import privacy
    from strategies.defences import check_update_clip

    if cfg.secure_aggregation:
        secagg.check_strategy(cfg, cls.method_class)
    attacks.attacked_partitions(cfg.as_dict())  # the attack keys, partition ids in range
    if check_update_clip(cfg.update_clip) and cfg.secure_aggregation:
        raise ConfigError(f"run-config key 'update-clip' = {cfg.update_clip} needs each update, which "
                          "secure aggregation hides: set secure-aggregation=false or update-clip=0")
    if cfg.max_update_ratio != 0.0 and cfg.max_update_ratio < 2.0:
        raise ConfigError(f"run-config key 'max-update-ratio' = {cfg.max_update_ratio} would drop honest updates "
                          "near the round's median norm: use 0 (off) or a factor >= 2 (default 100)")
    privacy.check(privacy.Params.from_run_config(cfg.params), cfg.method, cls.method_class.needs_individual_updates,
                  cfg.clients_per_round, cfg.secure_aggregation)


# Examples of the built-in datasets (all splits): num-clients cannot exceed them, since every
# client needs a training example (the data loader then checks each gets a train and a test one).
KNOWN_EXAMPLES = {"digits": 1797, "mnist": 70_000, "fashion-mnist": 70_000, "cifar10": 60_000, "cifar100": 60_000}


def _check_num_clients(cfg: RunConfig) -> None:
    """num-clients within a built-in dataset's examples (see :data:`KNOWN_EXAMPLES`)."""
    from client_app import local_data

    own_data = cfg.dataset_path or local_data.is_node_mode(cfg)  # sizes known once read
    total = None if own_data else KNOWN_EXAMPLES.get(cfg.dataset)
    if total is not None and cfg.num_clients > total:
        raise ConfigError(f"run-config key 'num-clients' = {cfg.num_clients} is above the {total} examples of dataset "
                          f"'{cfg.dataset}': every client needs a training example; use at most {total} clients")


# Methods outside the FedAvg family whose own key makes their weighting uniform
# (strategies.registry.weighting_of): named when fedavg-weighting is set for them.
UNIFORM_KEYS = {"fedpcd": "fedpcd-primary='fedavg-uniform'", "craft": "craft-rho='uniform'",
                "fedmgda": "fedmgda-centre='uniform'"}


def _check_weighting(cfg: RunConfig) -> None:
    """``fedavg-weighting`` (the FedAvg family only) and ``participation = "size-proportional"``
    (methods whose server rule stays unbiased under size-proportional draws; README)."""
    from fedpcd_app.server.sampler import FEDAVG_FAMILY, size_proportional_refusal

    if cfg.fedavg_weighting != "data-size" and cfg.method not in FEDAVG_FAMILY:
        own = UNIFORM_KEYS.get(cfg.method)
        raise ConfigError(f"run-config key 'fedavg-weighting' = {cfg.fedavg_weighting!r} applies to the FedAvg family "
                          f"({', '.join(FEDAVG_FAMILY)}); method '{cfg.method}' weights by its own rule: "
                          + (f"its uniform variant is {own}, " if own else "")
                          + "leave fedavg-weighting='data-size'")
    if cfg.participation == "size-proportional":
        why = size_proportional_refusal(cfg.method, cfg.params)
        if why is not None:
            raise ConfigError(f"run-config key 'participation' = 'size-proportional' draws clients with probability "
                              f"∝ their data size, but method '{cfg.method}': {why}; use participation='uniform'")


def fedavg_weighting(cfg: RunConfig) -> str:
    """The FedAvg family's weighting for this run: ``uniform`` with size-proportional draws."""
    return "uniform" if cfg.participation == "size-proportional" else cfg.fedavg_weighting


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
    if cfg.participation == "size-proportional":
        raise ConfigError("run-config key 'participation' = 'size-proportional' needs every client's training size on "
                          "the server, which client-data='node' does not give: use participation='uniform'")
    if cfg.participation == "skewed" and cfg.availability_rare_choice == "rarest-classes":
        raise ConfigError("run-config key 'availability-rare-choice' = 'rarest-classes' needs every client's labels "
                          "on the server, which client-data='node' does not give: use availability-rare-choice='last'")


def validate(raw: Mapping[str, Scalar], *, resolve_defaults: bool = False) -> Setup:
    """:func:`check` every key, then build the run's strategy (once) and initial model."""
    from client_app.models import initial_model
    from fedpcd_app.server.results import default_output_dir

    raw = resolve(raw) if resolve_defaults else dict(raw)
    cfg = check(raw)
    model = initial_model(cfg)
    strategy = registry.build(cfg, model=model, fedavg_weighting=fedavg_weighting(cfg))
    if not cfg.output_dir:
        raw["output-dir"] = str(default_output_dir(cfg))
        cfg = cfg.replace(output_dir=raw["output-dir"])
    return Setup(raw, cfg, strategy, model)


def load_setup(overrides: Mapping[str, Any] | str | None = None) -> Setup:
    """Defaults + overrides (a dict or flwr's ``"k=v ..."`` text) → a validated :class:`Setup`."""
    from fedcore.config import parse_overrides

    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return validate(overrides or {}, resolve_defaults=True)
