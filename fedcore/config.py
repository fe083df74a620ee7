"""The run config, parsed and validated once into a typed object.

Flower hands the ServerApp a flat ``dict`` of scalars (``[tool.flwr.app.config]`` fused
with ``--run-config`` overrides). :func:`parse_run_config` turns it into a
:class:`RunConfig`; every later stage reads that object, never ``context.run_config``.
Method-specific keys (``fedpcd-tau``, ``qffl-q``, ...) stay in :attr:`RunConfig.params`
and are read, typed and range-checked by the method's ``Params``
(:mod:`fedcore.params`); app-level keys (sampler, checkpoints, secure aggregation) by
:meth:`RunConfig.get_float` and friends. ``fedpcd_app.config.validate`` does all of it once,
before any node starts.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "femnist",
            # Synthetic(alpha, beta) of the FedProx/q-FFL authors, generated offline (client_app/synthetic.py)
            "synthetic")
MODELS = ("mlp", "cnn", "resnet18", "resnet20", "resnet56", "resnet110",
          # the CRAFT authors' models (their fed/nets.py): see client_app/models.py
          "craft-mlp", "craft-cnn", "craft-resnet20", "craft-resnet56", "craft-resnet110",
          # multinomial logistic regression (the q-FFL/FedProx authors' "mclr")
          "logreg")
PARTITIONERS = ("dirichlet", "pathological", "iid", "dirichlet-balanced", "writer",
                # one client per user/writer id, no size cap, the users' own train/test split if any
                "natural")
# datasets whose examples carry a user id (partitioner='natural'); or any dataset-path with one
NATURAL_DATASETS = ("synthetic", "femnist")
# Which examples are partitioned: "split" = the training pool (the dataset's test split or a
# held-out share is the central test set); "merged" = training and test pools together, the
# central test set being the union of the clients' local test splits (the CRAFT authors').
DATA_POOLS = ("split", "merged")
AUGMENTATIONS = ("none", "crop-flip")
EVAL_MODES = ("server", "federated")
# When clients compute loss-before F_i(θ_t) (a forward pass over the local train split):
# "auto" = only for methods that use it (q-FFL, AFL, FedFV, FedLF), "always" = every reply.
LOSS_BEFORE_MODES = ("auto", "always")
# Where the server's aggregation maths runs (FedPCD's cache and Gram, CRAFT's groups):
# "auto" = the first CUDA device when torch sees one, else the CPU.
SERVER_DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A run-config value is invalid; the message names the key and the fix."""


Scalar = bool | int | float | str


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Typed run config. Field names mirror the run-config keys (``-`` → ``_``)."""

    method: str
    model: str
    dataset: str
    dataset_path: str
    partitioner: str
    dirichlet_alpha: float
    classes_per_client: int
    num_clients: int
    fraction_train: float
    num_server_rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    seed: int
    eval_every: int
    output_dir: str
    local_test_fraction: float
    central_test_fraction: float
    min_partition_size: int
    momentum: float
    weight_decay: float
    lr_decay: float
    server_lr: float
    eval_mode: str
    eval_batch_size: int
    client_loss_before: str
    round_timeout: float
    log_every: int
    server_device: str
    local_steps: int
    val_fraction: float
    data_pool: str
    augment: str
    params: Mapping[str, Scalar] = dataclasses.field(default_factory=dict)

    # -- raw access ---------------------------------------------------------------
    def as_dict(self) -> dict[str, Scalar]:
        """The full flat config (run-config key names), as sent to clients."""
        out: dict[str, Scalar] = {}
        for f in dataclasses.fields(self):
            if f.name != "params":
                out[f.name.replace("_", "-")] = getattr(self, f.name)
        out.update(self.params)
        return out

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (field names, not keys)."""
        return dataclasses.replace(self, **changes)

    @property
    def clients_per_round(self) -> int:
        return max(1, int(round(self.fraction_train * self.num_clients)))

    def lr_at(self, server_round: int) -> float:
        """Client learning rate of a round: ``lr · lr-decay^(round-1)``."""
        return self.lr * self.lr_decay ** (server_round - 1)

    # -- typed access to method-specific keys ----------------------------------------
    def _get(self, key: str, default: Scalar | None) -> Scalar:
        if key in self.params:
            return self.params[key]
        if default is None:
            raise ConfigError(
                f"run-config key '{key}' is missing: add it to [tool.flwr.app.config] "
                "in pyproject.toml or pass it with --run-config"
            )
        return default

    def get_float(
        self,
        key: str,
        default: float | None = None,
        *,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
    ) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"run-config key '{key}' must be a number, got {value!r}")
        value = float(value)
        _check_range(key, value, low, high, low_open)
        return value

    def get_int(
        self, key: str, default: int | None = None, *, low: int | None = None, high: int | None = None
    ) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ConfigError(f"run-config key '{key}' must be an integer, got {value!r}")
        _check_range(key, value, low, high, False)
        return int(value)

    def get_bool(self, key: str, default: bool | None = None) -> bool:
        value = self._get(key, default)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"run-config key '{key}' must be true or false, got {value!r}")
        return value

    def get_choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value = self._get(key, default)
        if value not in choices:
            raise ConfigError(
                f"run-config key '{key}' = {value!r} is not one of {', '.join(choices)}"
            )
        return str(value)


def _check_range(key: str, value: float, low, high, low_open: bool) -> None:
    if low is not None and (value < low or (low_open and value == low)):
        op = ">" if low_open else ">="
        raise ConfigError(f"run-config key '{key}' = {value} must be {op} {low}")
    if high is not None and value > high:
        raise ConfigError(f"run-config key '{key}' = {value} must be <= {high}")


def default_run_config() -> dict[str, Scalar]:
    """The defaults of ``[tool.flwr.app.config]`` in this project's pyproject.toml."""
    with open(PROJECT_DIR / "pyproject.toml", "rb") as fh:
        return dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def parse_overrides(text: str) -> dict[str, Scalar]:
    """Parse ``"key=value key2='text'"`` (flwr's ``--run-config`` syntax) or a TOML file path.

    Read by :mod:`fedcore.overrides`, as the scripts read them: a bare word (``method=fedpcd``),
    ``yes``/``no``, spaces around ``=`` or an unbalanced quote is one :class:`ConfigError` line
    naming the key and the fix (flwr's own parser would raise a traceback or drop the pair).
    """
    from fedcore import overrides

    try:
        parsed = overrides.values(overrides.parse(text))
    except overrides.OverrideError as exc:
        raise ConfigError(str(exc)) from None
    if text.strip() and not parsed:
        raise ConfigError(f"no key=value pair could be read from the run-config overrides {text!r}")
    return parsed


# Keys that were removed, with what replaces them (one line each).
RETIRED_KEYS = {
    "federage-averaged-iterate": "set eval-averaged-iterate = true instead (every method is then scored on the "
                                 "running average of its global iterates)",
}


def check_retired(keys) -> None:
    """A retired key is refused with one line naming its replacement."""
    for key in keys:
        if key in RETIRED_KEYS:
            raise ConfigError(f"run-config key '{key}' is retired: {RETIRED_KEYS[key]}")


def resolve(overrides: Mapping[str, Scalar] | None = None) -> dict[str, Scalar]:
    """Defaults fused with overrides; an unknown key is rejected as ``flwr run`` does."""
    full = default_run_config()
    check_retired(overrides or {})
    for key, value in (overrides or {}).items():
        if key not in full:
            raise ConfigError(
                f"unknown run-config key '{key}': see [tool.flwr.app.config] in pyproject.toml"
            )
        full[key] = value
    return full


def parse_run_config(raw: Mapping[str, Scalar]) -> RunConfig:
    """Validate the experiment keys of a full flat run config and return the typed object.

    Raises :class:`ConfigError` (one line, naming the key and the fix) on any problem.
    Method keys stay in :attr:`RunConfig.params`: the app checks them against the method's
    ``Params`` (``fedpcd_app.config.validate``); clients need not know the strategies.
    """
    raw = dict(raw)
    kwargs: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(RunConfig) if f.name != "params"}
    tmp = RunConfig(**{n: None for n in fields}, params=raw)  # typed getters over raw
    for name, f in fields.items():
        key = name.replace("_", "-")
        if key not in raw:
            raise ConfigError(f"run-config key '{key}' is missing from the run config")
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        if kind == "int":
            kwargs[name] = tmp.get_int(key)
        elif kind == "float":
            kwargs[name] = tmp.get_float(key)
        else:
            value = raw[key]
            if not isinstance(value, str):
                raise ConfigError(f"run-config key '{key}' must be a string, got {value!r}")
            kwargs[name] = value
        del raw[key]
    cfg = RunConfig(**kwargs, params=raw)
    _validate(cfg)
    return cfg


def _validate(cfg: RunConfig) -> None:
    def choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
        if value not in allowed:
            raise ConfigError(
                f"run-config key '{key}' = {value!r} is not one of {', '.join(allowed)}"
            )

    choice("model", cfg.model, MODELS)
    choice("partitioner", cfg.partitioner, PARTITIONERS)
    choice("eval-mode", cfg.eval_mode, EVAL_MODES)
    choice("client-loss-before", cfg.client_loss_before, LOSS_BEFORE_MODES)
    choice("server-device", cfg.server_device, SERVER_DEVICES)
    choice("data-pool", cfg.data_pool, DATA_POOLS)
    choice("augment", cfg.augment, AUGMENTATIONS)
    if cfg.dataset not in DATASETS and not cfg.dataset_path:
        raise ConfigError(
            f"run-config key 'dataset' = {cfg.dataset!r} is not one of {', '.join(DATASETS)} "
            "(or give a local copy with dataset-path=<folder with train.parquet, test.parquet>)"
        )
    if cfg.partitioner == "writer" and cfg.dataset != "femnist" and not cfg.dataset_path:
        raise ConfigError(
            f"run-config key 'partitioner' = 'writer' needs writer ids: use dataset='femnist' or a "
            f"dataset-path whose parquet files have a 'writer_id' column (dataset is {cfg.dataset!r})"
        )
    _validate_data(cfg)
    checks = [
        ("num-clients", cfg.num_clients >= 1, "must be >= 1"),
        ("fraction-train", 0.0 < cfg.fraction_train <= 1.0, "must be in (0, 1]"),
        ("num-server-rounds", cfg.num_server_rounds >= 1, "must be >= 1"),
        ("local-epochs", cfg.local_epochs >= 1, "must be >= 1"),
        ("local-steps", cfg.local_steps >= 0, "must be >= 0 (0 = local-epochs passes over the data)"),
        ("batch-size", cfg.batch_size >= 0, "must be >= 0 (0 = full batch)"),
        ("lr", cfg.lr > 0.0, "must be > 0"),
        ("eval-every", cfg.eval_every >= 0, "must be >= 0 (0 = only the last round)"),
        ("dirichlet-alpha", cfg.dirichlet_alpha > 0.0, "must be > 0"),
        ("classes-per-client", cfg.classes_per_client >= 1, "must be >= 1"),
        ("local-test-fraction", 0.0 < cfg.local_test_fraction < 1.0, "must be in (0, 1)"),
        ("val-fraction", 0.0 <= cfg.val_fraction < 1.0 - cfg.local_test_fraction,
         "must be in [0, 1 - local-test-fraction) (0 = no validation split)"),
        ("central-test-fraction", 0.0 < cfg.central_test_fraction < 1.0, "must be in (0, 1)"),
        ("min-partition-size", cfg.min_partition_size >= 2, "must be >= 2"),
        ("momentum", 0.0 <= cfg.momentum < 1.0, "must be in [0, 1)"),
        ("weight-decay", cfg.weight_decay >= 0.0, "must be >= 0"),
        ("lr-decay", 0.0 < cfg.lr_decay <= 1.0, "must be in (0, 1]"),
        ("server-lr", cfg.server_lr >= 0.0, "must be >= 0 (0 = the method's default)"),
        ("eval-batch-size", cfg.eval_batch_size >= 1, "must be >= 1"),
        ("round-timeout", cfg.round_timeout >= 0.0, "must be >= 0 seconds (0 = auto: none in simulation, 600 s in deployment)"),
        ("log-every", cfg.log_every >= 1, "must be >= 1"),
        ("seed", cfg.seed >= 0, "must be >= 0"),
    ]
    for key, ok, what in checks:
        if not ok:
            raise ConfigError(f"run-config key '{key}' = {cfg.as_dict()[key]!r} {what}")


def _validate_data(cfg: RunConfig) -> None:
    """The keys of natural partitions and of dataset='synthetic' (one line each)."""
    if cfg.partitioner == "natural" and cfg.dataset not in NATURAL_DATASETS and not cfg.dataset_path:
        raise ConfigError(
            f"run-config key 'partitioner' = 'natural' needs user ids: use dataset='synthetic', dataset='femnist' or "
            f"a dataset-path (LEAF json folder, or parquet files with a 'writer_id' column); dataset is {cfg.dataset!r}"
        )
    if cfg.dataset == "synthetic" and not cfg.dataset_path:
        if cfg.partitioner != "natural":
            raise ConfigError(
                f"run-config key 'partitioner' = {cfg.partitioner!r}: dataset='synthetic' is split by its users "
                "(one client per user, their own 90/10 train/test split): set partitioner='natural'"
            )
        cfg.get_float("synthetic-alpha", 1.0, low=0.0)
        cfg.get_float("synthetic-beta", 1.0, low=0.0)
        cfg.get_bool("synthetic-iid", False)
        cfg.get_int("synthetic-seed", -1, low=-1, high=2**32 - 1)


def load_config(overrides: Mapping[str, Scalar] | str | None = None) -> RunConfig:
    """Defaults + overrides (a dict or flwr's ``"k=v ..."`` text) → validated RunConfig."""
    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return parse_run_config(resolve(overrides))
