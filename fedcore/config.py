"""The run config, parsed and validated once into a typed object.

Flower hands the ServerApp a flat ``dict`` of scalars (``[tool.flwr.app.config]`` fused
with ``--run-config`` overrides). :func:`parse_run_config` turns it into a
:class:`RunConfig`; every later stage reads that object, never ``context.run_config``.
Method-specific keys (``fedpcd-tau``, ``qffl-q``, ...) stay in :attr:`RunConfig.params`
and are read, typed and range-checked by the method's ``Params``
(:mod:`fedcore.params`); app-level keys (sampler, checkpoints, secure aggregation) are declared
once in :data:`APP_KEYS` (type, range or choices, default), checked when the config is parsed,
and read by :meth:`RunConfig.get_float` and friends (the declared default when none is given).
``fedpcd_app.server.config.validate`` does all of it once, before any node starts.

The defaults of every key ship with the package (:mod:`fedcore.defaults`, generated from
pyproject.toml's ``[tool.flwr.app.config]``): nothing reads a pyproject.toml at run time.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "femnist",
            # Synthetic(alpha, beta) of the FedProx/q-FFL authors, generated offline (client_app/data/synthetic.py)
            "synthetic")
MODELS = ("mlp", "cnn", "resnet18", "resnet20", "resnet56", "resnet110",
          # the CRAFT authors' models (their fed/nets.py): see client_app/models.py
          "craft-mlp", "craft-cnn", "craft-resnet20", "craft-resnet56", "craft-resnet110",
          # multinomial logistic regression (the q-FFL/FedProx authors' "mclr")
          "logreg")
PARTITIONERS = ("dirichlet", "pathological", "iid", "dirichlet-balanced", "writer",
                # the CRAFT authors' default (balance: 0): Dirichlet, small clients filled up to min-partition-size
                "dirichlet-unbalanced",
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
class AppKey:
    """One app-level run-config key, declared once: its default (whose type is the key's type)
    and the values it allows. Method keys are declared by the method's ``Params`` instead
    (:mod:`fedcore.params`); ``tests/test_config.py`` checks that pyproject.toml's
    ``[tool.flwr.app.config]`` holds exactly these keys and those, with these defaults."""

    key: str
    default: Scalar
    doc: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    hint: str = ""  # appended to a range error, e.g. "(0 = only the last round)"

    @property
    def kind(self) -> type:
        return type(self.default)

    def read(self, raw: Mapping[str, Scalar]) -> Scalar:
        """The key's value in ``raw`` (its default when absent), typed and checked: a bad one
        is a one-line :class:`ConfigError` naming the key and what is allowed (:func:`check_value`)."""
        return check_value(self.key, raw.get(self.key, self.default), self.kind, low=self.low, high=self.high,
                           low_open=self.low_open, high_open=self.high_open, choices=self.choices, hint=self.hint)

    def allowed(self) -> str:
        """The range in words: ``> 0``, ``>= 1``, ``in (0, 1]``."""
        return allowed_range(self.low, self.high, self.low_open, self.high_open)


def check_value(key: str, value: Any, kind: type, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, choices: tuple[str, ...] | None = None,
                hint: str = "") -> Scalar:
    """One run-config value coerced to ``kind`` (bool, int, float or str) and checked against its
    choices and range: the one check of every key, app keys (:meth:`AppKey.read`), method keys
    (:class:`fedcore.params.MethodParams`) and the :class:`RunConfig` ``get_*`` helpers alike.

    A float must be finite: NaN fails every ``<``/``>`` comparison, so a range check alone
    would let it through (a NaN τ or size bound silently switches a method or a defence off),
    and no key of this app gives ±inf a meaning (0 is "off" where there is an off). A bad value
    is a one-line :class:`ConfigError` naming the key and what is allowed.
    """
    if kind is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"run-config key '{key}' must be true or false, got {value!r}")
    elif kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"run-config key '{key}' must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"run-config key '{key}' must be a number, got {value!r}")
        try:
            value = float(value)
        except OverflowError:  # an int beyond any float (10**400)
            value = math.inf if value > 0 else -math.inf
        if not math.isfinite(value):
            raise ConfigError(f"run-config key '{key}' = {value!r} is not a finite number: give a number"
                              + (f" {allowed_range(low, high, low_open, high_open)}" if low is not None
                                 or high is not None else "") + (f" {hint}" if hint else ""))
    elif kind is str and not isinstance(value, str):
        raise ConfigError(f"run-config key '{key}' must be a string, got {value!r}")
    if choices is not None and value not in choices:
        raise ConfigError(f"run-config key '{key}' = {value!r} is not one of {', '.join(map(str, choices))}")
    low_bad = low is not None and (value < low or (low_open and value == low))
    high_bad = high is not None and (value > high or (high_open and value == high))
    if low_bad or high_bad:
        raise ConfigError(f"run-config key '{key}' = {value!r} must be {allowed_range(low, high, low_open, high_open)}"
                          + (f" {hint}" if hint else ""))
    return value


def allowed_range(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """A range in words: ``> 0``, ``>= 1``, ``in (0, 1]`` ('' without bounds)."""
    lo, hi = _num(low), _num(high)
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {lo}"
    if high is not None:
        return f"{'<' if high_open else '<='} {hi}"
    return ""


def _num(x: float | None) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


# Every app-level key (the experiment, data, client training, server, defences, reliability
# and tracking sections of pyproject.toml's [tool.flwr.app.config]), in that order. A key
# read with cfg.get_*() or cfg.params.get() is declared here; the range checks that involve
# two keys (val-fraction, dataset or dataset-path, ...) are in _validate and fedpcd_app.server.config.
APP_KEYS: tuple[AppKey, ...] = (
    # -- experiment (contract: scripts and sweeps read these names) --
    AppKey("method", "fedavg", "the aggregation method (strategies.registry)"),
    AppKey("model", "mlp", "the model (client_app/models.py)", choices=MODELS),
    AppKey("dataset", "digits", "a dataset name or, with dataset-path, a label for a local copy"),
    AppKey("dataset-path", "", "a folder with train.parquet and test.parquet ('' = download the dataset)"),
    AppKey("partitioner", "dirichlet", "how the training pool is split over the clients", choices=PARTITIONERS),
    AppKey("dirichlet-alpha", 0.3, "α of the Dirichlet partitioner", low=0.0, low_open=True),
    AppKey("classes-per-client", 2, "classes of each client (pathological partitioner)", low=1),
    AppKey("num-clients", 20, "N, the federation's size", low=1),
    AppKey("fraction-train", 0.25, "fraction of the clients sampled each round", low=0.0, high=1.0, low_open=True),
    AppKey("num-server-rounds", 60, "rounds", low=1),
    AppKey("local-epochs", 1, "local passes over the data", low=1),
    AppKey("batch-size", 16, "local batch size", low=0, hint="(0 = full batch)"),
    AppKey("lr", 0.1, "the clients' learning rate η_l", low=0.0, low_open=True),
    AppKey("seed", 0, "seeds data, sampling, models and methods", low=0),
    AppKey("eval-every", 10, "evaluate every k rounds", low=0, hint="(0 = only the last round)"),
    AppKey("output-dir", "", "where results go ('' = runs/<method>-<dataset>-seed<seed>-<time>)"),
    # -- data --
    AppKey("local-test-fraction", 0.2, "each client's local test share", low=0.0, high=1.0, low_open=True,
           high_open=True),
    AppKey("central-test-fraction", 0.2, "the central test set's share of the training pool", low=0.0, high=1.0,
           low_open=True, high_open=True),
    AppKey("min-partition-size", 10, "redraw the partition until every client has this many examples", low=2),
    AppKey("val-fraction", 0.0, "each client's validation share (0 = none)", low=0.0),
    AppKey("data-pool", "split", "split = partition the training pool; merged = train and test pools together",
           choices=DATA_POOLS),
    AppKey("client-data", "partition", "partition = cut from the dataset; node = each node's own folder",
           choices=("partition", "node")),
    AppKey("central-test-path", "", "client-data='node': the server's central test set (folder or .parquet)"),
    AppKey("num-classes", 0, "client-data='node': 0 = learn it from the nodes", low=0),
    AppKey("input-shape", "", "client-data='node': 'CxHxW', '' = learn it from the nodes"),
    AppKey("data-mean", "", "client-data='node': per-channel 'm1,m2,..', '' = pooled over the nodes"),
    AppKey("data-std", "", "client-data='node': per-channel, with data-mean"),
    AppKey("synthetic-alpha", 1.0, "Synthetic(α, β): α, the spread of the users' models", low=0.0),
    AppKey("synthetic-beta", 1.0, "Synthetic(α, β): β, the spread of the users' feature means", low=0.0),
    AppKey("synthetic-iid", False, "Synthetic: the authors' iid variant (one shared model)"),
    AppKey("max-file-bytes", 4 * 2**30, "the largest dataset file read (bytes; only regular files are read)",
           low=1),
    AppKey("max-classes", 100_000, "labels must be below it (checked before any allocation)", low=2),
    AppKey("synthetic-seed", -1, "Synthetic's data seed (-1 = derived from seed)", low=-1, high=2**32 - 1),
    AppKey("user-resplit", False, "partitioner='natural': pool each user's examples and re-split them "
           "80/10/10 train/validation/test, seeded by (seed, user)"),
    # -- client training --
    AppKey("momentum", 0.0, "local SGD momentum", low=0.0, high=1.0, high_open=True),
    AppKey("weight-decay", 0.0, "local SGD weight decay", low=0.0),
    AppKey("lr-decay", 1.0, "η_l of round t is lr · lr-decay^(t-1)", low=0.0, high=1.0, low_open=True),
    AppKey("local-steps", 0, "local SGD steps", low=0, hint="(0 = local-epochs passes over the data)"),
    AppKey("augment", "none", "data augmentation on the clients", choices=AUGMENTATIONS),
    AppKey("client-execution", "auto", "loop | vectorised | auto: a process's clients of a round trained at once",
           choices=("auto", "loop", "vectorised")),
    # -- server --
    AppKey("server-lr", 0.0, "η_g", low=0.0, hint="(0 = the method's default)"),
    AppKey("eval-mode", "server", "who scores the clients' test splits", choices=EVAL_MODES),
    AppKey("eval-batch-size", 128, "evaluation batch size", low=1),
    AppKey("client-loss-before", "auto", "when clients send loss-before", choices=LOSS_BEFORE_MODES),
    AppKey("round-timeout", 0.0, "seconds per exchange", low=0.0,
           hint="seconds (0 = auto: none in simulation, 600 s in deployment)"),
    AppKey("log-every", 1, "log every k rounds", low=1),
    AppKey("allow-unused-keys", False, "let keys of another method than the selected one through"),
    AppKey("eval-averaged-iterate", False, "score the running mean of the global models (every method)"),
    AppKey("fedavg-weighting", "data-size", "the FedAvg family's weights: n_i/Σn or 1/m",
           choices=("data-size", "uniform")),
    AppKey("server-device", "auto", "where the server's aggregation maths runs", choices=SERVER_DEVICES),
    AppKey("participation", "uniform", "the client sampler (fedpcd_app/server/sampler.py)",
           choices=("uniform", "skewed", "bernoulli", "size-proportional")),
    AppKey("availability-rare-clients", 3, "skewed participation: how many rare clients", low=0),
    AppKey("availability-rare-prob", 0.01, "skewed participation: a rare client's probability", low=0.0, high=1.0,
           low_open=True),
    AppKey("availability-rare-choice", "rarest-classes", "skewed participation: which clients are rare",
           choices=("rarest-classes", "last")),
    # -- defences --
    AppKey("update-clip", 0.0, "scale each update to at most c x the median norm (0 = off, else >= 1)", low=0.0),
    AppKey("max-num-examples", 1_000_000, "the largest num-examples a client may report where the server does not "
           "know its size", low=1),
    AppKey("max-update-ratio", 100.0, "drop a reply whose update is longer than this x the round's median norm "
           "(0 = off)", low=0.0),
    AppKey("on-aggregation-error", "stop", "an exception in the aggregation: stop the run or keep the model",
           choices=("stop", "keep")),
    AppKey("diverge-patience", 5, "rounds of all-dropped replies or a loss at chance before a run is stopped as "
           "diverged (0 = only the first)", low=0),
    # -- reliability --
    AppKey("checkpoint-every", 10, "checkpoint every k rounds (0 = never)", low=0),
    AppKey("checkpoint-keep", 2, "checkpoints kept", low=1),
    AppKey("resume-from", "", "the output-dir of an earlier run to resume"),
    AppKey("overwrite", False, "a new run into an output-dir holding another run's results: delete them first "
           "(false = refuse)"),
    AppKey("resume-allow-changes", "", "resume: comma-separated training/data keys that may differ from the "
           "checkpoint's"),
    AppKey("secure-aggregation", False, "SecAgg+ (sum-only methods)"),
    AppKey("secagg-num-shares", 1.0, "SecAgg+ shares (<= 1: a fraction, else a count)", low=0.0, low_open=True),
    AppKey("secagg-reconstruction-threshold", 0.7, "SecAgg+ threshold (<= 1: a fraction, else a count)", low=0.0,
           low_open=True),
    AppKey("secagg-clipping-range", 8.0, "SecAgg+ clipping range", low=0.0, low_open=True),
    AppKey("secagg-quantization-range", 4194304, "SecAgg+ quantization range", low=2),
    AppKey("secagg-max-weight", 1000.0, "the largest weight SecAgg+ takes unclipped", low=1.0),
    # -- tracking --
    AppKey("tensorboard", False, "write TensorBoard event files"),
    AppKey("tracking", "tensorboard", "experiment tracking: tensorboard (with tensorboard = true), wandb or none",
           choices=("tensorboard", "wandb", "none")),
    AppKey("figures", "auto", "auto: report.md and the run's figures in output-dir when a run ends; none: nothing",
           choices=("auto", "none")),
)
APP = {k.key: k for k in APP_KEYS}


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
        if default is None and key in APP:  # a declared key: its declared default
            return APP[key].default
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
        return check_value(key, self._get(key, default), float, low=low, high=high, low_open=low_open)

    def get_int(
        self, key: str, default: int | None = None, *, low: int | None = None, high: int | None = None
    ) -> int:
        return check_value(key, self._get(key, default), int, low=low, high=high)

    def get_bool(self, key: str, default: bool | None = None) -> bool:
        return check_value(key, self._get(key, default), bool)

    def get_choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        return str(check_value(key, self._get(key, default), object, choices=choices))


def default_run_config() -> dict[str, Scalar]:
    """Every run-config key with its default: pyproject.toml's ``[tool.flwr.app.config]`` as
    shipped in the package (:mod:`fedcore.defaults`, generated by ``scripts/sync_defaults.py``;
    an installed wheel has no pyproject.toml to read)."""
    from fedcore.defaults import DEFAULTS

    return dict(DEFAULTS)


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


def did_you_mean(key: str, known) -> str:
    """``" (did you mean 'fedpcd-tau'?)"`` for the closest known keys, '' when none is close."""
    close = difflib.get_close_matches(key, list(known), n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


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
            raise ConfigError(f"unknown run-config key '{key}'{did_you_mean(key, full)}: see "
                              "[tool.flwr.app.config] in pyproject.toml")
        full[key] = value
    return full


def parse_run_config(raw: Mapping[str, Scalar]) -> RunConfig:
    """Validate the experiment keys of a full flat run config and return the typed object.

    Raises :class:`ConfigError` (one line, naming the key and the fix) on any problem.
    Method keys stay in :attr:`RunConfig.params`: the app checks them against the method's
    ``Params`` (``fedpcd_app.server.config.validate``); clients need not know the strategies.
    """
    raw = dict(raw)
    kwargs: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(RunConfig) if f.name != "params"}
    for name in fields:
        key = name.replace("_", "-")
        if key not in raw:
            raise ConfigError(f"run-config key '{key}' is missing from the run config")
        kwargs[name] = APP[key].read(raw)  # typed, choices and range from the declaration
        del raw[key]
    for key in raw.keys() & APP.keys():  # the other declared app keys, when present
        raw[key] = APP[key].read(raw)
    cfg = RunConfig(**kwargs, params=raw)
    _validate(cfg)
    return cfg


def _validate(cfg: RunConfig) -> None:
    """The checks that involve more than one key (one key's type, choices and range are its
    :class:`AppKey` declaration's, checked by :meth:`AppKey.read`)."""
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
    if not cfg.val_fraction < 1.0 - cfg.local_test_fraction:
        raise ConfigError(f"run-config key 'val-fraction' = {cfg.val_fraction!r} must be in [0, 1 - "
                          "local-test-fraction) (0 = no validation split)")
    _validate_data(cfg)


def _validate_resplit(cfg: RunConfig) -> None:
    """``user-resplit`` makes its own validation split and needs the users (one line each)."""
    if not cfg.get_bool("user-resplit"):
        return
    if cfg.partitioner != "natural":
        raise ConfigError(f"run-config key 'user-resplit' = true re-splits each user's own examples: it needs "
                          f"partitioner='natural' (partitioner is {cfg.partitioner!r}); set it or user-resplit=false")
    if cfg.val_fraction > 0.0:
        raise ConfigError(f"run-config keys 'user-resplit' = true and 'val-fraction' = {cfg.val_fraction!r}: the "
                          "re-split makes its own 10 % validation split; set val-fraction=0")


def _validate_data(cfg: RunConfig) -> None:
    """The keys of natural partitions and of dataset='synthetic' (one line each)."""
    cfg.get_int("max-classes", 100_000, low=2)
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
    _validate_resplit(cfg)


def load_config(overrides: Mapping[str, Scalar] | str | None = None) -> RunConfig:
    """Defaults + overrides (a dict or flwr's ``"k=v ..."`` text) → validated RunConfig."""
    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return parse_run_config(resolve(overrides))
