"""Run-config parsing: typed, validated, one-line errors before any training."""

import runpy
from pathlib import Path

import pytest

from fedcore.config import ConfigError, default_run_config, load_config, parse_overrides
from fedpcd_app.server.config import load_setup
from strategies import registry

ROOT = Path(__file__).resolve().parent.parent
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


def test_every_app_key_is_a_typed_field_and_method_keys_stay_in_params():
    import dataclasses

    from fedcore.config import APP_KEYS, RunConfig

    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert list(fields) == [k.attr for k in APP_KEYS] + ["params"]
    cfg = load_config({"method": "fedpcd", "fedpcd-tau": 0.5, "checkpoint-every": 3.0})
    for k in APP_KEYS:
        assert type(getattr(cfg, k.attr)) is k.kind, k.key
    assert cfg.checkpoint_every == 3 and cfg.params == {**{k: v for k, v in default_run_config().items()
                                                          if k not in {a.key for a in APP_KEYS}}, "fedpcd-tau": 0.5}
    assert cfg.as_dict() == {**default_run_config(), "method": "fedpcd", "fedpcd-tau": 0.5, "checkpoint-every": 3}


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


GENERATE = ROOT / "scripts" / "generate.py"


def test_the_generated_files_are_current():
    """pyproject.toml's [tool.flwr.app.config], fedcore/defaults.py and the docs' generated tables are
    what scripts/generate.py renders from the declarations now (CI runs it with --check too)."""
    stale = runpy.run_path(str(GENERATE), run_name="generate")["stale"]()
    assert not stale, f"{', '.join(stale)} stale: run .venv/bin/python scripts/generate.py"


def test_generate_check_exits_1_naming_a_stale_file(tmp_path):
    import shutil
    import subprocess
    import sys

    pages = [str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "methods").glob("*.md")]
    for name in ("pyproject.toml", "docs/running.md", *pages):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "fedcore").mkdir()
    (tmp_path / "fedcore" / "defaults.py").write_text("DEFAULTS = {}\n")
    gen = runpy.run_path(str(GENERATE), run_name="generate")
    assert gen["stale"](tmp_path) == ["fedcore/defaults.py"]
    done = subprocess.run([sys.executable, str(GENERATE), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_strategies_construct_with_keywords_like_flowers_fedavg():
    from strategies import FedPCD

    s = FedPCD(fraction_train=0.1, tau=0.05, history=3, seed=4)
    assert (s.params.tau, s.params.history, s.fraction_train, s.seed) == (0.05, 3, 0.1, 4)
    with pytest.raises(ConfigError, match="'fedpcd-tau'"):
        FedPCD(tau=-1.0)
    with pytest.raises(TypeError, match="hyperparameters are"):
        FedPCD(taus=0.1)


@pytest.mark.parametrize("build, message", [
    # a bad value names the Python keyword, and the run-config key it is
    (lambda s: s.FedPCD(tau=float("nan")), "FedPCD() keyword 'tau' (run-config key 'fedpcd-tau') = nan is not a "
                                           "finite number: give a number >= 0"),
    (lambda s: s.QFFL(q=-1.0), "QFFL() keyword 'q' (run-config key 'qffl-q') = -1.0 must be >= 0"),
    (lambda s: s.FedPCD(normalize="l1"), "FedPCD() keyword 'normalize' (run-config key 'fedpcd-normalize') = 'l1' "
                                         "is not one of l2, none, ema"),
    # a misspelt keyword: the closest hyperparameter or common argument
    (lambda s: s.FedPCD(taus=0.1), "FedPCD() got unknown argument(s) ['taus'] (did you mean 'tau'?)"),
    (lambda s: s.FedAvg(fraction_trian=0.5), "(did you mean 'fraction_train'?)"),
])
def test_python_construction_names_the_keyword(build, message):
    import strategies

    with pytest.raises((ConfigError, TypeError)) as exc:
        build(strategies)
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("override, message", [
    ({"participation": "skewd"}, "run-config key 'participation' = 'skewd' is not one of uniform, skewed, bernoulli, "
                                 "size-proportional (did you mean 'skewed'?)"),
    ({"model": "resnet19"}, "(did you mean 'resnet18' or"),
    ({"dataset": "mnsit"}, "is not one of digits, mnist, "),
    ({"method": "fedpcd", "fedpcd-cache-dtype": "bfloat"}, "is not one of float32, bfloat16, float16 (did you mean "
                                                          "'bfloat16'"),
])
def test_a_bad_choice_lists_the_choices_and_the_closest(override, message):
    with pytest.raises(ConfigError) as exc:
        load_setup(override)
    assert message in str(exc.value)


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

    with open(ROOT / "pyproject.toml", "rb") as fh:
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
                       "run .venv/bin/python scripts/generate.py")
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
            f"{table[key]!r}, ...) to fedcore.config.APP_KEYS (or a field to its method's Params), "
            "then run scripts/generate.py")
    for key in declared:
        assert key in table, (f"run-config key '{key}' is declared but not in pyproject.toml's "
                              "[tool.flwr.app.config]: run scripts/generate.py")
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


def _package_calls():
    """(file:line, ast.Call) of every call in the packages."""
    import ast

    for pkg in ("fedcore", "strategies", "client_app", "fedpcd_app"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    yield f"{path.relative_to(ROOT)}:{node.lineno}", node


def test_no_read_site_restates_an_app_key():
    """An app key is read as its typed RunConfig field (cfg.checkpoint_every) or, from a flat
    mapping, with APP[key].read(raw): never with a literal default or range restated at the read
    site, and never from cfg.params, which holds only the methods' keys."""
    import ast

    from fedcore.config import APP

    def literal(node) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    wrong = []
    for where, call in _package_calls():
        func = call.func
        if not isinstance(func, ast.Attribute):
            continue
        key = literal(call.args[0]) if call.args else None
        on_params = isinstance(func.value, ast.Attribute) and func.value.attr == "params"
        if func.attr in ("get_int", "get_float", "get_bool", "get_choice"):
            wrong.append(f"{where}: {func.attr}({key!r}, ...): read the RunConfig field")
        restated = (len(call.args) > 1 and isinstance(call.args[1], ast.Constant) and key in APP
                    and call.args[1].value == APP[key].default)
        if func.attr == "get" and key in APP and (restated or on_params):
            wrong.append(f"{where}: .get({key!r}, ...): read cfg.{APP[key].attr} (or APP[{key!r}].read(raw))")
    assert not wrong, "\n".join(wrong)


def test_no_app_choice_list_is_copied():
    """An app key's choices are written once, in its AppKey: code that needs them reads
    APP[key].choices (a copy in a module drifts: figures had three)."""
    import ast

    from fedcore.config import APP_KEYS

    lists = {tuple(k.choices): k.key for k in APP_KEYS if k.choices}
    copies = []
    for pkg in ("fedcore", "strategies", "client_app", "fedpcd_app"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path == ROOT / "fedcore" / "config.py":
                continue
            tree = ast.parse(path.read_text())
            declaring = {k.value.id for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "choices"
                         and isinstance(k.value, ast.Name)}  # another key's own choices (craft-rho's)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List))
                        and not {t.id for t in node.targets if isinstance(t, ast.Name)} & declaring):
                    values = tuple(e.value for e in node.value.elts if isinstance(e, ast.Constant))
                    if values in lists:
                        copies.append(f"{path.relative_to(ROOT)}:{node.lineno} copies the choices of "
                                      f"'{lists[values]}': read APP[{lists[values]!r}].choices")
    assert not copies, "\n".join(copies)


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


def test_an_absent_app_key_takes_its_declared_default():
    assert load_config({"checkpoint-every": 3}).checkpoint_every == 3
    assert load_config({}).checkpoint_every == 10  # the declaration's
    from fedcore.config import parse_run_config

    assert parse_run_config({"method": "fedavg"}).checkpoint_every == 10  # an absent key: its declared default
