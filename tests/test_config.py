"""Run-config parsing: typed, validated, one-line errors before any training."""

import pytest

from fedcore.config import ConfigError, default_run_config, load_config, parse_overrides
from fedpcd_app.config import load_setup
from strategies import registry

CONTRACT_KEYS = [
    "method", "model", "dataset", "dataset-path", "partitioner", "dirichlet-alpha",
    "classes-per-client", "num-clients", "fraction-train", "num-server-rounds", "local-epochs",
    "batch-size", "lr", "seed", "eval-every", "output-dir",
]


def test_contract_keys_present():
    defaults = default_run_config()
    for key in CONTRACT_KEYS:
        assert key in defaults, key


def test_flwr_override_syntax():
    cfg = load_config("method='fedavg' num-server-rounds=7 lr=0.5 dataset='digits'")
    assert cfg.num_server_rounds == 7 and cfg.lr == 0.5 and cfg.method == "fedavg"
    assert parse_overrides("") == {}


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"method": "nope"}, "'method'"),
        ({"model": "vgg"}, "'model'"),
        ({"dataset": "imagenet"}, "dataset-path"),
        ({"partitioner": "shards"}, "'partitioner'"),
        ({"fraction-train": 1.5}, "'fraction-train'"),
        ({"num-clients": 0}, "'num-clients'"),
        ({"lr": -1.0}, "'lr'"),
        ({"num-server-rounds": "ten"}, "'num-server-rounds'"),
        ({"no-such-key": 1}, "unknown run-config key 'no-such-key'"),
        # the method's Params, the sampler, checkpoints and resume: all before any node starts
        ({"method": "fedpcd", "fedpcd-tau": -1.0}, "'fedpcd-tau'"),
        ({"method": "fedpcd", "fedpcd-normalize": "l1"}, "'fedpcd-normalize'"),
        ({"method": "fedpcd", "fedpcd-primary": "none", "fedpcd-tau": 0.0}, "'fedpcd-tau' > 0"),
        ({"method": "fedpcd", "fedpcd-history": 2.5}, "'fedpcd-history'"),
        ({"participation": "foo"}, "'participation'"),
        ({"checkpoint-every": -1}, "'checkpoint-every'"),
        ({"resume-from": "/no/such/folder"}, "'resume-from'"),
        ({"tensorboard": "yes"}, "'tensorboard'"),
        # a key of another method than the selected one is a mistake (not silently ignored)
        ({"method": "fedavg", "fedpcd-tau": 0.5}, "not used by method 'fedavg'"),
        ({"method": "craft", "qffl-q": 2.0}, "allow-unused-keys=true"),
        # server-lr has one meaning; methods with a step rule of their own refuse it
        ({"method": "craft", "server-lr": 0.5}, "craft-step"),
        ({"method": "qffl", "server-lr": 0.5}, "'server-lr'"),
        ({"method": "fedmgda", "server-lr": 0.5}, "fedmgda-lr"),
        ({"method": "fedfv", "server-lr": 0.5}, "'server-lr'"),
        # the paper-faithful settings' keys
        ({"local-steps": -1}, "'local-steps'"),
        ({"val-fraction": 0.9}, "'val-fraction'"),
        ({"data-pool": "all"}, "'data-pool'"),
        ({"augment": "flip"}, "'augment'"),
        ({"partitioner": "writer"}, "writer_id"),
        ({"model": "craft-vgg"}, "'model'"),
        ({"eval-averaged-iterate": "yes"}, "'eval-averaged-iterate'"),
        # retired: one line naming the key that replaces it
        ({"method": "federage", "federage-averaged-iterate": True}, "eval-averaged-iterate = true"),
    ],
)
def test_bad_values_fail_with_one_line(override, fragment):
    with pytest.raises(ConfigError) as exc:
        load_setup(override)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_typed_getters_check_ranges():
    cfg = load_config({})
    assert cfg.get_float("absent", 0.5, low=0.0) == 0.5
    with pytest.raises(ConfigError, match="'absent'"):
        cfg.get_float("absent", -1.0, low=0.0)
    with pytest.raises(ConfigError, match="one of"):
        cfg.get_choice("absent", ("a", "b"), "c")


def test_clients_per_round_and_lr_schedule():
    cfg = load_config({"num-clients": 20, "fraction-train": 0.25, "lr": 0.1, "lr-decay": 0.5})
    assert cfg.clients_per_round == 5
    assert cfg.lr_at(1) == 0.1 and cfg.lr_at(3) == pytest.approx(0.025)
    assert cfg.as_dict()["num-clients"] == 20


@pytest.mark.parametrize("text", ["method = 'afl' seed = 3", "method 'afl'", "=3"])
def test_malformed_overrides_are_refused_not_silently_dropped(text):
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(text)


def test_toml_file_overrides(tmp_path):
    f = tmp_path / "preset.toml"
    f.write_text('method = "fedavg"\nseed = 4\n')
    assert load_config(str(f)).seed == 4


def test_pyproject_method_keys_are_the_params_declarations():
    """Every method's hyperparameters are declared once (its Params): pyproject.toml's
    [tool.flwr.app.config] holds exactly those keys with exactly those defaults."""
    defaults = default_run_config()
    declared = registry.method_keys()
    prefixes = {registry.strategy_class(m).Params.prefix for m in registry.names()} - {""}
    in_pyproject = {k for k in defaults if k.split("-")[0] in prefixes or k.rsplit("-", 1)[0] in prefixes}
    assert set(declared) <= set(defaults), f"declared but not in pyproject: {sorted(set(declared) - set(defaults))}"
    assert in_pyproject <= set(declared), f"in pyproject but no Params field: {sorted(in_pyproject - set(declared))}"
    for key, default in declared.items():
        assert defaults[key] == default and type(defaults[key]) is type(default), (key, defaults[key], default)


def test_strategies_construct_with_keywords_like_flowers_fedavg():
    from strategies import FedPCD

    s = FedPCD(fraction_train=0.1, tau=0.05, history=3, seed=4)
    assert (s.params.tau, s.params.history, s.fraction_train, s.seed) == (0.05, 3, 0.1, 4)
    with pytest.raises(ConfigError, match="'fedpcd-tau'"):
        FedPCD(tau=-1.0)
    with pytest.raises(TypeError, match="hyperparameters are"):
        FedPCD(taus=0.1)


def test_allow_unused_keys_lets_a_foreign_key_through():
    assert load_setup({"method": "fedavg", "fedpcd-tau": 0.5, "allow-unused-keys": True}).cfg.method == "fedavg"


@pytest.mark.parametrize("text, fragment", [
    ("method=fedpcd", "strings need quotes"),
    ("lr=abc", "strings need quotes"),
    ("tensorboard=yes", "not a boolean"),
    ("lr = 0.1", "without spaces around '='"),
    ("method='fedpcd", "unbalanced quote"),
])
def test_malformed_overrides_are_one_line_errors_not_tracebacks(text, fragment):
    """The in-process entry point reads --run-config as the scripts do (fedcore.overrides)."""
    with pytest.raises(ConfigError, match=fragment) as exc:
        parse_overrides(text)
    assert "\n" not in str(exc.value)
