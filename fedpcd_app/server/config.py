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

from fedcore.config import ConfigError, RunConfig, Scalar, check_retired, parse_run_config, resolve
from strategies import registry
from strategies.base import FairStrategy, resolve_device

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
    from fedpcd_app.server import checkpoint, secagg, tracking
    from fedpcd_app.server.sampler import PARTICIPATION, RARE_CHOICES, rare_clients
    from strategies import privacy
    from strategies.wrappers import check_update_clip

    check_retired(raw)
    cfg = parse_run_config(raw)
    _check_bounds(cfg)  # before anything is sized by num-clients
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
    resolve_device(cfg.server_device)  # 'cuda' on a machine without one fails here
    cfg.get_bool("eval-averaged-iterate", False)
    _check_weighting(cfg)
    cfg.get_choice("participation", PARTICIPATION, "uniform")
    rare_clients(cfg)  # the default adapts to federations of fewer than 4 clients
    cfg.get_float("availability-rare-prob", 0.01, low=0.0, high=1.0, low_open=True)
    cfg.get_choice("availability-rare-choice", RARE_CHOICES, "rarest-classes")
    cfg.get_int("checkpoint-every", 10, low=0)
    cfg.get_int("checkpoint-keep", 2, low=1)
    cfg.get_bool("tensorboard", False)
    tracking.check(cfg)  # tracking = tensorboard | wandb | none (wandb installed?)
    cfg.get_choice("figures", ("auto", "none"), "auto")  # report.md and figures when a run ends (run_report.py)
    resume_from = str(cfg.params.get("resume-from", ""))
    allow = checkpoint.allowed_changes(cfg.params.get("resume-allow-changes", ""))
    unknown = sorted(k for k in allow if k not in cfg.as_dict() or k in checkpoint.FIXED)
    if unknown:
        raise ConfigError(f"run-config key 'resume-allow-changes' lists {', '.join(map(repr, unknown))}: "
                          f"give run-config "
                          f"keys other than {', '.join(checkpoint.FIXED)} (which a checkpoint cannot change), "
                          "comma-separated, e.g. 'lr,local-epochs'")
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
    from fedcore.replies import DEFAULT_MAX_NUM_EXAMPLES, DEFAULT_MAX_UPDATE_RATIO

    cfg.get_int("max-num-examples", DEFAULT_MAX_NUM_EXAMPLES, low=1)
    if not (ratio := cfg.get_float("max-update-ratio", DEFAULT_MAX_UPDATE_RATIO, low=0.0)) == 0.0 and ratio < 2.0:
        raise ConfigError(f"run-config key 'max-update-ratio' = {ratio} would drop honest updates near the round's "
                          "median norm: use 0 (off) or a factor >= 2 (default 100)")
    privacy.check(privacy.Params.from_run_config(cfg.params), cfg.method, cls.needs_individual_updates,
                  cfg.clients_per_round, secagg.enabled(cfg))
    cfg.get_choice("on-aggregation-error", ON_AGGREGATION_ERROR, "stop")
    cfg.get_int("diverge-patience", 5, low=0)
    from fedpcd_app.server.results import check_output_dir_free, check_output_dir_reusable

    check_output_dir_free(cfg.output_dir)  # a live run writing there: one line, before anything starts
    check_output_dir_reusable(cfg)  # another run's results there: resume-from, a new folder or overwrite
    from client_app.vectorised import EXECUTION, EXECUTION_KEY

    cfg.get_choice(EXECUTION_KEY, EXECUTION, "auto")
    _check_node_data(cfg)
    return cfg


# At most this many clients: every per-client table (sampler, membership, counts) is sized by
# num-clients before any data is read, so a typo like num-clients=1000000000 would allocate
# gigabytes; a million clients is far beyond any partition of the built-in datasets.
MAX_CLIENTS = 1_000_000
# Examples of the built-in datasets (all splits): num-clients cannot exceed them, since every
# client needs a training example (the data loader then checks each gets a train and a test one).
KNOWN_EXAMPLES = {"digits": 1797, "mnist": 70_000, "fashion-mnist": 70_000, "cifar10": 60_000, "cifar100": 60_000}


def _check_bounds(cfg: RunConfig) -> None:
    """lr finite and > 0; num-clients bounded (see :data:`MAX_CLIENTS`, :data:`KNOWN_EXAMPLES`)."""
    import math

    for key, value in (("lr", cfg.lr), ("server-lr", cfg.server_lr)):
        if not math.isfinite(value):
            raise ConfigError(f"run-config key '{key}' = {value} is not a finite number: give a finite step size "
                              f"(e.g. {key}=0.1)")
    if cfg.num_clients > MAX_CLIENTS:
        raise ConfigError(f"run-config key 'num-clients' = {cfg.num_clients} is above {MAX_CLIENTS:,}: every client "
                          "has a row in the server's tables, allocated before the run; use fewer clients")
    from client_app import local_data

    own_data = cfg.dataset_path or local_data.is_node_mode(cfg.as_dict())  # sizes known once read
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
    from fedpcd_app.server.sampler import FEDAVG_FAMILY, PARTICIPATION, size_proportional_refusal
    from strategies.fedavg import WEIGHTINGS

    weighting = cfg.get_choice("fedavg-weighting", WEIGHTINGS, "data-size")
    if weighting != "data-size" and cfg.method not in FEDAVG_FAMILY:
        own = UNIFORM_KEYS.get(cfg.method)
        raise ConfigError(f"run-config key 'fedavg-weighting' = {weighting!r} applies to the FedAvg family "
                          f"({', '.join(FEDAVG_FAMILY)}); method '{cfg.method}' weights by its own rule: "
                          + (f"its uniform variant is {own}, " if own else "")
                          + "leave fedavg-weighting='data-size'")
    if cfg.get_choice("participation", PARTICIPATION, "uniform") == "size-proportional":
        why = size_proportional_refusal(cfg.method, cfg.params)
        if why is not None:
            raise ConfigError(f"run-config key 'participation' = 'size-proportional' draws clients with probability "
                              f"∝ their data size, but method '{cfg.method}': {why}; use participation='uniform'")


def fedavg_weighting(cfg: RunConfig) -> str:
    """The FedAvg family's weighting for this run: ``uniform`` with size-proportional draws."""
    if cfg.params.get("participation") == "size-proportional":
        return "uniform"
    return str(cfg.params.get("fedavg-weighting", "data-size"))


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
    if cfg.params.get("participation") == "size-proportional":
        raise ConfigError("run-config key 'participation' = 'size-proportional' needs every client's training size on "
                          "the server, which client-data='node' does not give: use participation='uniform'")
    if (cfg.params.get("participation") == "skewed"
            and cfg.params.get("availability-rare-choice") == "rarest-classes"):
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
    return Setup(raw, cfg, strategy, model, cfg.get_int("checkpoint-every", 10), cfg.get_int("checkpoint-keep", 2),
                 str(cfg.params.get("resume-from", "")))


def load_setup(overrides: Mapping[str, Any] | str | None = None) -> Setup:
    """Defaults + overrides (a dict or flwr's ``"k=v ..."`` text) → a validated :class:`Setup`."""
    from fedcore.config import parse_overrides

    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return validate(overrides or {}, resolve_defaults=True)
