"""The run config, parsed and validated once into a typed object.

Flower hands the ServerApp a flat ``dict`` of scalars (``[tool.flwr.app.config]`` fused
with ``--run-config`` overrides). :func:`parse_run_config` turns it into a
:class:`RunConfig`; every later stage reads that object, never ``context.run_config``.

Every key is declared once: an app-level key (sampler, checkpoints, secure aggregation, ...)
as an :class:`AppKey` in :data:`APP_SECTIONS` (type, default, doc, range or choices, search
space), which makes it a typed :class:`RunConfig` field checked when the config is parsed;
a method key as a field of its method's ``Params`` (:mod:`fedcore.params`), which reads it
from :attr:`RunConfig.params`. Both are checked by :func:`check_value` (NaN refused).
pyproject.toml's ``[tool.flwr.app.config]`` and :mod:`fedcore.defaults` (the defaults the
package ships: nothing reads a pyproject.toml at run time) are generated from the
declarations by ``scripts/generate.py``.
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
class Grid:
    """A numeric key's search space for tuning (:mod:`fedpcd_app.analysis.tuning`): the grid a
    sweep starts from (the papers' grids) and the bounds an edge extension stays within
    (inclusive; they may be tighter than the key's allowed range)."""

    values: tuple[float, ...]
    low: float
    high: float

    @property
    def integer(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in self.values)


@dataclasses.dataclass(frozen=True)
class AppKey:
    """One app-level run-config key, declared once: its default (whose type is the key's type),
    what it means and the values it allows. :class:`RunConfig` has one typed field per key,
    pyproject.toml's ``[tool.flwr.app.config]`` and :mod:`fedcore.defaults` are generated from
    the declarations (``scripts/generate.py``). Method keys are declared by the method's
    ``Params`` instead (:mod:`fedcore.params`)."""

    key: str
    default: Scalar
    doc: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    hint: str = ""  # appended to a range error, e.g. "(0 = only the last round)"
    grid: Grid | None = None  # the search space of a tuned key (lr)

    @property
    def kind(self) -> type:
        return type(self.default)

    @property
    def attr(self) -> str:
        """The :class:`RunConfig` field: the key with ``-`` → ``_``."""
        return self.key.replace("-", "_")

    def check(self, value: Any) -> Scalar:
        """``value`` typed and checked against the declaration (:func:`check_value`)."""
        return check_value(self.key, value, self.kind, low=self.low, high=self.high, low_open=self.low_open,
                           high_open=self.high_open, choices=self.choices, hint=self.hint)

    def read(self, raw: Mapping[str, Scalar]) -> Scalar:
        """The key's value in a flat run config ``raw`` (its default when absent), typed and checked."""
        return self.check(raw.get(self.key, self.default))

    def allowed(self) -> str:
        """What values the key takes, in words (docs and pyproject's comments)."""
        return allowed_words(self.kind, self.low, self.high, self.low_open, self.high_open, self.choices)


def check_value(key: str, value: Any, kind: type, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, choices: tuple[str, ...] | None = None,
                hint: str = "", subject: str | None = None) -> Scalar:
    """One run-config value coerced to ``kind`` (bool, int, float or str) and checked against its
    choices and range: the one check of every key, app keys (:class:`AppKey`) and method keys
    (:class:`fedcore.params.MethodParams`) alike.

    A float must be finite: NaN fails every ``<``/``>`` comparison, so a range check alone
    would let it through (a NaN τ or size bound silently switches a method or a defence off),
    and no key of this app gives ±inf a meaning (0 is "off" where there is an off). A bad value
    is a one-line :class:`ConfigError` naming the key (``subject``, when given: e.g. the Python
    keyword a strategy was built with) and what is allowed; a bad choice lists the choices and
    the closest one.
    """
    who = subject or f"run-config key '{key}'"
    if kind is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{who} must be true or false, got {value!r}")
    elif kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{who} must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{who} must be a number, got {value!r}")
        try:
            value = float(value)
        except OverflowError:  # an int beyond any float (10**400)
            value = math.inf if value > 0 else -math.inf
        if not math.isfinite(value):
            raise ConfigError(f"{who} = {value!r} is not a finite number: give a number"
                              + (f" {allowed_range(low, high, low_open, high_open)}" if low is not None
                                 or high is not None else "") + (f" {hint}" if hint else ""))
    elif kind is str and not isinstance(value, str):
        raise ConfigError(f"{who} must be a string, got {value!r}")
    if choices is not None and value not in choices:
        close = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ConfigError(f"{who} = {value!r} is not one of {', '.join(map(str, choices))}{close}")
    low_bad = low is not None and (value < low or (low_open and value == low))
    high_bad = high is not None and (value > high or (high_open and value == high))
    if low_bad or high_bad:
        raise ConfigError(f"{who} = {value!r} must be {allowed_range(low, high, low_open, high_open)}"
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


def allowed_words(kind: type, low: float | None = None, high: float | None = None, low_open: bool = False,
                  high_open: bool = False, choices: tuple[str, ...] | None = None) -> str:
    """What a key of type ``kind`` allows, in words: ``finite, in (0, 1]``, ``one of l2, none, ema``."""
    words = ["finite"] if kind is float else []
    if choices:
        words.append("one of " + ", ".join(map(str, choices)))
    if low is not None or high is not None:
        words.append(allowed_range(low, high, low_open, high_open))
    return ", ".join(words)


def _num(x: float | None) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


# Every app-level key, by section (pyproject.toml's [tool.flwr.app.config] is generated from
# these and the methods' Params, in this order: scripts/generate.py). A key's checks that
# involve other keys (val-fraction, dataset or dataset-path, ...) are in _validate and
# fedpcd_app.server.config.
APP_SECTIONS: dict[str, tuple[AppKey, ...]] = {
    "experiment (contract: scripts and sweeps read these names)": (
        AppKey("method", "fedavg", "the aggregation method (strategies.registry; docs/methods/index.md)"),
        AppKey("model", "mlp", "the model (client_app/models.py)", choices=MODELS),
        AppKey("dataset", "digits", "a dataset name or, with dataset-path, a label for a local copy"),
        AppKey("dataset-path", "", "a folder with train.parquet and test.parquet, or LEAF json ('' = the dataset's "
               "own source)"),
        AppKey("partitioner", "dirichlet", "how the training pool is split over the clients", choices=PARTITIONERS),
        AppKey("dirichlet-alpha", 0.3, "α of the Dirichlet partitioners", low=0.0, low_open=True),
        AppKey("classes-per-client", 2, "classes of each client (pathological partitioner)", low=1),
        # every client has a row in the server's tables, sized before any data is read: a typo like
        # 1000000000 would allocate gigabytes; a million is far beyond any built-in dataset's partition
        AppKey("num-clients", 20, "N, the federation's size (simulated SuperNodes)", low=1, high=1_000_000,
               hint="(every client has a row in the server's tables, allocated before the run: use fewer clients)"),
        AppKey("fraction-train", 0.25, "fraction of the clients sampled each round (seeded, without replacement)",
               low=0.0, high=1.0, low_open=True),
        AppKey("num-server-rounds", 60, "rounds", low=1),
        AppKey("local-epochs", 1, "local passes over the data", low=1),
        AppKey("batch-size", 16, "local batch size", low=0, hint="(0 = full batch)"),
        AppKey("lr", 0.1, "the clients' learning rate η_l (always tuned by a sweep's [tuning])", low=0.0,
               low_open=True, grid=Grid((0.003, 0.01, 0.03, 0.1), 1e-4, 1.0)),
        AppKey("seed", 0, "seeds data, sampling, models and methods", low=0),
        AppKey("eval-every", 10, "evaluate every k rounds and at the last round", low=0,
               hint="(0 = only the last round)"),
        AppKey("output-dir", "", "where results go ('' = $FEDPCD_OUTPUT_ROOT or ./outputs/<method>/seed-<time>)"),
    ),
    "data": (
        AppKey("local-test-fraction", 0.2, "each client's local test share", low=0.0, high=1.0, low_open=True,
               high_open=True),
        AppKey("central-test-fraction", 0.2, "the central test set's share of the training pool", low=0.0, high=1.0,
               low_open=True, high_open=True),
        AppKey("min-partition-size", 10, "redraw the partition until every client has this many examples", low=2),
        AppKey("val-fraction", 0.0, "each client's validation share (0 = none)", low=0.0),
        AppKey("data-pool", "split", "split = partition the training pool; merged = train and test pools together",
               choices=DATA_POOLS),
        AppKey("synthetic-alpha", 1.0, "dataset='synthetic' (partitioner='natural'): the FedProx/q-FFL authors' "
               "Synthetic(α, β), num-clients users (docs/datasets.md); α, the std of the users' model means", low=0.0),
        AppKey("synthetic-beta", 1.0, "Synthetic(α, β): β, the std of the users' feature means", low=0.0),
        AppKey("synthetic-iid", False, "Synthetic: the authors' iid variant (one shared model, feature means B_k·1)"),
        AppKey("max-file-bytes", 4 * 2**30, "the largest dataset file read (bytes); FIFOs, devices and other "
               "non-regular files are refused", low=1),
        AppKey("max-classes", 100_000, "labels must be below it (checked when the data is read, before any "
               "allocation)", low=2),
        AppKey("synthetic-seed", -1, "Synthetic's data seed: -1 = derived from seed (5 seeds = 5 partitions); "
               ">= 0 = fixed data", low=-1, high=2**32 - 1),
        AppKey("user-resplit", False, "partitioner='natural': pool each user's train and test examples and re-split "
               "them 80/10/10 train/validation/test by a permutation drawn from (seed, user), as the q-FFL authors' "
               "client does; false = the source's own split"),
    ),
    "SuperNodes with their own data (client_app/local_data.py; docs/deployment.md)": (
        AppKey("client-data", "partition", "partition = every node cuts its share out of the dataset above; node = "
               "every node trains and is scored on its own folder (--node-config \"partition-id=<i> "
               "data-path='/abs/dir'\")", choices=("partition", "node")),
        AppKey("central-test-path", "", "client-data='node': the server's optional central test set (folder or "
               ".parquet)"),
        AppKey("num-classes", 0, "client-data='node': 0 = learn it from the nodes' first QUERY", low=0),
        AppKey("input-shape", "", "client-data='node': 'CxHxW', '' = learn it from the nodes"),
        AppKey("data-mean", "", "client-data='node': per-channel 'm1,m2,..', '' = pooled over the nodes' train data"),
        AppKey("data-std", "", "client-data='node': per-channel, with data-mean"),
    ),
    "client training": (
        AppKey("momentum", 0.0, "local SGD momentum", low=0.0, high=1.0, high_open=True),
        AppKey("weight-decay", 0.0, "local SGD weight decay", low=0.0),
        AppKey("lr-decay", 1.0, "η_l of round t is lr · lr-decay^(t-1)", low=0.0, high=1.0, low_open=True),
        AppKey("local-steps", 0, "local SGD steps", low=0, hint="(0 = local-epochs passes over the data)"),
        AppKey("augment", "none", "data augmentation on the clients", choices=AUGMENTATIONS),
        AppKey("client-execution", "auto", "a process's clients of a round trained one by one (loop) or at once "
               "(vectorised; client_app/vectorised.py); auto = vectorised where it is faster",
               choices=("auto", "loop", "vectorised")),
    ),
    "server": (
        AppKey("server-lr", 0.0, "η_g, the server step: θ_t − (η_g/η_l)·aggregate update", low=0.0,
               hint="(0 = the method's default)"),
        AppKey("eval-mode", "server", "who scores the clients' test splits", choices=EVAL_MODES),
        AppKey("eval-batch-size", 128, "evaluation batch size", low=1),
        AppKey("eval-averaged-iterate", False, "score the running mean of the global models θ_1..θ_t (every "
               "method; AFL always scores its own averaged iterate)"),
        AppKey("client-loss-before", "auto", "when clients send loss-before", choices=LOSS_BEFORE_MODES),
        AppKey("round-timeout", 0.0, "seconds per exchange", low=0.0,
               hint="seconds (0 = auto: none in simulation, 600 s in deployment)"),
        AppKey("log-every", 1, "log every k rounds", low=1),
        AppKey("allow-unused-keys", False, "let keys of another method than the selected one through"),
        AppKey("server-device", "auto", "where the server's aggregation maths runs", choices=SERVER_DEVICES),
        AppKey("fedavg-weighting", "data-size", "the FedAvg family's weights: data-size n_i/Σn or uniform 1/m "
               "(always uniform with participation='size-proportional')", choices=("data-size", "uniform")),
    ),
    "participation (fedpcd_app/server/sampler.py)": (
        AppKey("participation", "uniform", "the client sampler; size-proportional = drawn ∝ training size "
               "(docs/methods/index.md, 'Participation')",
               choices=("uniform", "skewed", "bernoulli", "size-proportional")),
        AppKey("availability-rare-clients", 3, "skewed participation: how many rare clients (3 = at most "
               "num-clients - 1)", low=0),
        AppKey("availability-rare-prob", 0.01, "skewed participation: a rare client's probability", low=0.0,
               high=1.0, low_open=True),
        AppKey("availability-rare-choice", "rarest-classes", "skewed participation: which clients are rare",
               choices=("rarest-classes", "last")),
    ),
    "defences (every method; fedcore/replies.py)": (
        AppKey("update-clip", 0.0, "scale each update to at most c x the round's median norm (0 = off, else >= 1)",
               low=0.0),
        AppKey("max-num-examples", 1_000_000, "the largest num-examples a client may report where the server does "
               "not know its size", low=1),
        AppKey("max-update-ratio", 100.0, "drop a reply whose update is longer than this x the round's median norm "
               "(0 = off, else >= 2; >= 3 replies)", low=0.0),
        AppKey("on-aggregation-error", "stop", "an exception in the aggregation: stop the run or keep the model",
               choices=("stop", "keep")),
        AppKey("diverge-patience", 5, "a run stops as diverged at a non-finite model, or after this many rounds of "
               "all-dropped replies or a median train loss non-finite or at chance (0 = only the first)", low=0),
    ),
    "reliability (checkpoints, resume, secure aggregation)": (
        AppKey("checkpoint-every", 10, "checkpoint every k rounds (0 = never)", low=0),
        AppKey("checkpoint-keep", 2, "checkpoints kept", low=1),
        AppKey("resume-from", "", "the output-dir of an earlier run to resume"),
        AppKey("overwrite", False, "a new run into an output-dir holding another run's results: delete them first "
               "(false = refuse in one line)"),
        AppKey("resume-allow-changes", "", "resume: training/data keys that may differ from the checkpoint's "
               "(comma-separated, e.g. 'lr,local-epochs')"),
        AppKey("secure-aggregation", False, "SecAgg+ (sum-only methods)"),
        AppKey("secagg-num-shares", 1.0, "SecAgg+ shares (<= 1: a fraction, else a count)", low=0.0, low_open=True),
        AppKey("secagg-reconstruction-threshold", 0.7, "SecAgg+ threshold (<= 1: a fraction, else a count)", low=0.0,
               low_open=True),
        AppKey("secagg-clipping-range", 8.0, "SecAgg+ clipping range", low=0.0, low_open=True),
        AppKey("secagg-quantization-range", 4194304, "SecAgg+ quantization range", low=2),
        AppKey("secagg-max-weight", 1000.0, "the largest weight SecAgg+ takes unclipped", low=1.0),
    ),
    "tracking": (
        AppKey("tensorboard", False, "write TensorBoard event files"),
        AppKey("tracking", "tensorboard", "tensorboard (event files when tensorboard = true), wandb (pip install "
               "-e \".[wandb]\"; also TensorBoard when tensorboard = true) or none",
               choices=("tensorboard", "wandb", "none")),
        AppKey("figures", "auto", "auto: report.md and figures/ in output-dir when a run ends; none: nothing (a "
               "sweep's runs: the sweep draws its own)", choices=("auto", "none")),
    ),
}
APP_KEYS: tuple[AppKey, ...] = tuple(k for keys in APP_SECTIONS.values() for k in keys)
APP = {k.key: k for k in APP_KEYS}


def _app_fields(cls: type) -> type:
    """``cls`` as a frozen dataclass with one typed field per :data:`APP_KEYS` entry (its
    :attr:`AppKey.attr`, the declared default), before the fields of its own body."""
    clash = sorted({k.attr for k in APP_KEYS} & set(vars(cls)))
    if clash:
        raise TypeError(f"app keys {clash} would shadow RunConfig's own attributes: rename them")
    cls.__annotations__ = {**{k.attr: k.kind for k in APP_KEYS}, **cls.__dict__.get("__annotations__", {})}
    for k in APP_KEYS:
        setattr(cls, k.attr, k.default)
    return dataclasses.dataclass(frozen=True)(cls)


@_app_fields
class RunConfig:
    """Typed run config: one field per app key (:data:`APP_KEYS`; ``-`` → ``_``, e.g.
    ``cfg.num_clients``), typed and checked by :func:`parse_run_config`, so a reader reads the
    attribute (no default or range restated); ``params`` holds the other keys (every method's,
    central DP's, the attack keys), which their ``Params`` read and check."""

    params: Mapping[str, Scalar] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Scalar]:
        """The full flat config (run-config key names), as sent to clients."""
        return {**{k.key: getattr(self, k.attr) for k in APP_KEYS}, **self.params}

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (field names, not keys)."""
        return dataclasses.replace(self, **changes)

    @property
    def clients_per_round(self) -> int:
        return max(1, int(round(self.fraction_train * self.num_clients)))

    def lr_at(self, server_round: int) -> float:
        """Client learning rate of a round: ``lr · lr-decay^(round-1)``."""
        return self.lr * self.lr_decay ** (server_round - 1)


def default_run_config() -> dict[str, Scalar]:
    """Every run-config key with its default, as shipped in the package (:mod:`fedcore.defaults`,
    generated from the declarations by ``scripts/generate.py``; an installed wheel has no
    pyproject.toml to read)."""
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


def check_known(keys) -> None:
    """A retired key names its replacement, an unknown one the closest declared keys (one line)."""
    known = default_run_config()
    for key in keys:
        if key in RETIRED_KEYS:
            raise ConfigError(f"run-config key '{key}' is retired: {RETIRED_KEYS[key]}")
        if key not in known:
            raise ConfigError(f"unknown run-config key '{key}'{did_you_mean(key, known)}: see "
                              "[tool.flwr.app.config] in pyproject.toml")


def resolve(overrides: Mapping[str, Scalar] | None = None) -> dict[str, Scalar]:
    """Defaults fused with overrides; an unknown key is rejected as ``flwr run`` does."""
    check_known(overrides or {})
    return {**default_run_config(), **(overrides or {})}


def parse_run_config(raw: Mapping[str, Scalar]) -> RunConfig:
    """Validate the app keys of a flat run config and return the typed object: every
    :class:`AppKey` read once (its declared default when absent), then the checks that involve
    several keys.

    Raises :class:`ConfigError` (one line, naming the key and the fix) on any problem.
    Method keys stay in :attr:`RunConfig.params`: the app checks them against the method's
    ``Params`` (``fedpcd_app.server.config.validate``); clients need not know the strategies.
    """
    cfg = RunConfig(**{k.attr: k.read(raw) for k in APP_KEYS}, params={k: v for k, v in raw.items() if k not in APP})
    _validate(cfg)
    return cfg


def _validate(cfg: RunConfig) -> None:
    """The checks that involve more than one key (one key's type, choices and range are its
    :class:`AppKey` declaration's)."""
    if cfg.dataset not in DATASETS and not cfg.dataset_path:
        raise ConfigError(
            f"run-config key 'dataset' = {cfg.dataset!r} is not one of {', '.join(DATASETS)}"
            f"{did_you_mean(cfg.dataset, DATASETS)} "
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
    if not cfg.user_resplit:
        return
    if cfg.partitioner != "natural":
        raise ConfigError(f"run-config key 'user-resplit' = true re-splits each user's own examples: it needs "
                          f"partitioner='natural' (partitioner is {cfg.partitioner!r}); set it or user-resplit=false")
    if cfg.val_fraction > 0.0:
        raise ConfigError(f"run-config keys 'user-resplit' = true and 'val-fraction' = {cfg.val_fraction!r}: the "
                          "re-split makes its own 10 % validation split; set val-fraction=0")


def _validate_data(cfg: RunConfig) -> None:
    """The keys of natural partitions and of dataset='synthetic' (one line each)."""
    if cfg.partitioner == "natural" and cfg.dataset not in NATURAL_DATASETS and not cfg.dataset_path:
        raise ConfigError(
            f"run-config key 'partitioner' = 'natural' needs user ids: use dataset='synthetic', dataset='femnist' or "
            f"a dataset-path (LEAF json folder, or parquet files with a 'writer_id' column); dataset is {cfg.dataset!r}"
        )
    if cfg.dataset == "synthetic" and not cfg.dataset_path and cfg.partitioner != "natural":
        raise ConfigError(
            f"run-config key 'partitioner' = {cfg.partitioner!r}: dataset='synthetic' is split by its users "
            "(one client per user, their own 90/10 train/test split): set partitioner='natural'"
        )
    _validate_resplit(cfg)


def load_config(overrides: Mapping[str, Scalar] | str | None = None) -> RunConfig:
    """Defaults + overrides (a dict or flwr's ``"k=v ..."`` text) → validated RunConfig."""
    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return parse_run_config(resolve(overrides))
