"""Run-config parsing: typed, validated, one-line errors before any training."""

import pytest

from fedcore.config import ConfigError, default_run_config, load_config, parse_overrides
from fedpcd_app.server.config import load_setup
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


# -- app-level keys: declared once (fedcore.config.APP_KEYS), shipped with the package -------------
def _pyproject_table() -> dict:
    import tomllib
    from pathlib import Path

    with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


def test_the_shipped_defaults_are_pyprojects_table():
    """An installed wheel reads fedcore.defaults, not pyproject.toml: the two hold the same keys,
    in the same order, with the same values and types."""
    from fedcore.defaults import DEFAULTS

    table = _pyproject_table()
    stale = [k for k in table.keys() | DEFAULTS.keys()
             if k not in table or k not in DEFAULTS or type(table[k]) is not type(DEFAULTS[k])
             or table[k] != DEFAULTS[k]]
    assert not stale, (f"fedcore/defaults.py disagrees with pyproject.toml on {sorted(stale)}: "
                       "run .venv/bin/python scripts/sync_defaults.py")
    assert list(table) == list(DEFAULTS)
    assert default_run_config() == DEFAULTS


def declarations() -> dict:
    """Every declared key → its default: the app keys, every method's Params, central DP, attacks."""
    from client_app import attacks
    from fedcore.config import APP_KEYS
    from strategies import privacy

    out = {k.key: k.default for k in APP_KEYS}
    for source in (registry.method_keys(), privacy.Params.run_config_keys(), attacks.Params.run_config_keys()):
        both = out.keys() & source.keys()
        assert not both, f"keys declared twice: {sorted(both)}"
        out.update(source)
    return out


def test_pyproject_keys_are_exactly_the_declared_ones():
    """[tool.flwr.app.config] = APP_KEYS + every method's Params + privacy.Params + attacks.Params."""
    table, declared = _pyproject_table(), declarations()
    for key in table:
        assert key in declared, (
            f"run-config key '{key}' is in pyproject.toml but declared nowhere: add AppKey({key!r}, "
            f"{table[key]!r}, ...) to fedcore.config.APP_KEYS (or a field to its method's Params)")
    for key in declared:
        assert key in table, f"run-config key '{key}' is declared but not in pyproject.toml's [tool.flwr.app.config]"
    for key, default in declared.items():
        assert table[key] == default and type(table[key]) is type(default), (
            f"run-config key '{key}': pyproject.toml says {table[key]!r}, the declaration {default!r}")


def test_a_key_missing_from_the_declarations_is_named_in_one_line(monkeypatch):
    """The message a new pyproject key gets until it is declared (what the lead reads after a merge)."""
    import fedcore.config as fc

    monkeypatch.setattr(fc, "APP_KEYS", tuple(k for k in fc.APP_KEYS if k.key != "checkpoint-every"))
    with pytest.raises(AssertionError) as exc:
        test_pyproject_keys_are_exactly_the_declared_ones()
    line = str(exc.value).splitlines()[0]
    assert "'checkpoint-every'" in line and "APP_KEYS" in line


def _literal_defaults():
    """(file:line, key, default) of every cfg.get_*('key', default) / .params.get('key', default) call
    with literal arguments in the packages."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for pkg in ("fedcore", "strategies", "client_app", "fedpcd_app"):
        for path in (root / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                name, args = node.func.attr, node.args
                at = 2 if name == "get_choice" else 1
                receiver = node.func.value
                on_params = (isinstance(receiver, ast.Attribute) and receiver.attr == "params") or (
                    isinstance(receiver, ast.Name) and receiver.id == "params")
                if (name not in ("get_int", "get_float", "get_bool", "get_choice") and not (name == "get" and on_params)
                        or len(args) <= at):
                    continue
                if isinstance(args[0], ast.Constant) and isinstance(args[at], ast.Constant):
                    yield f"{path.relative_to(root)}:{node.lineno}", args[0].value, args[at].value


def test_every_default_in_the_code_is_the_declared_one():
    """cfg.get_int('checkpoint-every', 0) against a declared 10 was a silent second default."""
    from fedcore.config import APP

    wrong = [f"{where}: '{key}' defaults to {value!r}, declared {APP[key].default!r}"
             for where, key, value in _literal_defaults()
             if key in APP and not (value == APP[key].default and type(value) is type(APP[key].default))]
    assert not wrong, "\n".join(wrong)


def test_declared_choices_match_the_apps_own_lists():
    from client_app.local_data import CLIENT_DATA_MODES
    from fedcore.config import APP
    from fedpcd_app.server.config import ON_AGGREGATION_ERROR
    from fedpcd_app.server.sampler import PARTICIPATION, RARE_CHOICES

    assert APP["participation"].choices == PARTICIPATION
    assert APP["availability-rare-choice"].choices == RARE_CHOICES
    assert APP["client-data"].choices == CLIENT_DATA_MODES
    assert APP["on-aggregation-error"].choices == ON_AGGREGATION_ERROR


@pytest.mark.parametrize("override, message", [
    ({"checkpoint-every": -1}, "run-config key 'checkpoint-every' = -1 must be >= 0"),
    ({"secagg-num-shares": 0.0}, "run-config key 'secagg-num-shares' = 0.0 must be > 0"),
    ({"fraction-train": 1.5}, "run-config key 'fraction-train' = 1.5 must be in (0, 1]"),
    ({"eval-every": -2}, "run-config key 'eval-every' = -2 must be >= 0 (0 = only the last round)"),
    ({"on-aggregation-error": "ignore"}, "run-config key 'on-aggregation-error' = 'ignore' is not one of stop, keep"),
    ({"tensorboard": 1}, "run-config key 'tensorboard' must be true or false, got 1"),
])
def test_app_keys_are_checked_from_their_declaration(override, message):
    with pytest.raises(ConfigError) as exc:
        load_config(override)
    assert str(exc.value) == message


def test_declared_defaults_serve_get_without_a_default():
    cfg = load_config({"checkpoint-every": 3})
    assert cfg.get_int("checkpoint-every") == 3
    assert cfg.replace(params={}).get_int("checkpoint-every") == 10  # the declaration's
    assert cfg.get_float("update-clip", 0.0) == 0.0  # explicit defaults still work
