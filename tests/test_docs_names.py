"""Every name the docs give in backticks exists (issue 44: docs that cannot lie).

In README.md and docs/**/*.md, each inline code span is read for what it names:

* run-config keys (``key=value``, ``key = value``, the contents of ``--run-config "..."``) against
  the declarations (``fedcore.config.default_run_config()``: the keys pyproject.toml and
  fedcore/defaults.py are generated from), beside the other ``k=v`` vocabularies the docs use:
  Flower's federation config (its ``flwr run`` options), the node config (``fedcore.keys``,
  ``client_app.local_data``), the sweep file (``[tuning]`` and the top level, as the sweep's
  parser states them); a ``name=value`` with ``_`` is a keyword of a strategy's constructor;
* CLI flags (``--x``) against the parser of the command named before them in the span or, for
  a flag on its own, in its section (``python -m fedpcd_app.<command>``, ``benchmarks/*``,
  ``scripts/*``, ``scripts/flwr_run.sh``, ``flwr <command>``, ``flower-superlink``/``-supernode``),
  else against every parser; the parsers are read by introspection (each ``main`` is run up to
  its ``parse_args``; Flower's typer app and argparse parsers), never from a hand list;
* a default stated for a flag (```--workers` ... (default: X)``) against the default its
  ``--help`` states;
* ``strategy.<attr>`` against every strategy class's attributes and the attributes its methods
  set, ``FedPCD.<attr>`` (any class ``strategies`` exports) against that class;
* dotted paths into the project's packages (``fedcore.keys.TRAIN_ALIASES``,
  ``fedpcd_app.server_app:app``) by importing them, and repository paths (``fedpcd_app/runtime/
  grid.py``) against the files;
* every ```toml block that is a sweep file (or its ``[tuning]`` table) through the sweep's parser.

An exception is an entry of :data:`ALLOWED` with its reason. ``FEDPCD_DOCS_ROOT``: another
checkout's docs (tests/docs_blocks.py)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import re
import shlex
import sys
import tomllib
from functools import cache
from unittest import mock

import pytest

from tests import docs_blocks as db

ROOT = db.docs_root()
DOCS = db.all_docs()
PROJECT = db.PROJECT
PACKAGES = ("fedcore", "strategies", "client_app", "fedpcd_app", "benchmarks", "examples", "tests", "scripts")

# name -> why the docs may name it although no parser or declaration of this project has it
ALLOWED: dict[str, str] = {
    "requires-python": "pyproject.toml's [project] key (the client-only install), not a run-config key",
}


# Folders runs write (git-ignored): a path in them names what a command makes, not a file of the
# repository, whether or not this checkout has run that command (a sweep's outputs/ without
# outputs/default/ is a checkout like any other).
PRODUCED = {"outputs", "build", ".venv"}


# -- what exists ----------------------------------------------------------------------------------------------

class _Parsed(Exception):
    pass


def parser_of(main) -> argparse.ArgumentParser | None:
    """The parser ``main`` builds: ``main`` runs up to its ``parse_args``, which hands the
    parser back instead of parsing."""
    def grab(self, *args, **kwargs):
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab), \
            mock.patch.object(argparse.ArgumentParser, "parse_known_args", grab), \
            mock.patch.object(sys, "argv", ["prog"]):
        try:
            main([]) if inspect.signature(main).parameters else main()
        except _Parsed as got:
            return got.args[0]
        except BaseException:  # noqa: BLE001 - a main that needs more before it parses: no parser
            return None
    return None


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


@cache
def project_commands() -> dict[str, dict[str, argparse.Action]]:
    """Command (as the docs write it) -> its flags and their actions."""
    out: dict[str, dict[str, argparse.Action]] = {}
    shims = {"simulate": "fedpcd_app.runtime.simulate", "flwr_run": "fedpcd_app.runtime.flwr_run",
             "sweep": "fedpcd_app.analysis.sweep", "report": "fedpcd_app.analysis.report",
             "figures": "fedpcd_app.analysis.figures", "robustness": "fedpcd_app.analysis.robustness"}
    for name, module in shims.items():
        parser = parser_of(importlib.import_module(module).main)
        assert parser is not None, module
        out[f"fedpcd_app.{name}"] = _flags(parser)
    out["scripts/flwr_run.sh"] = out["fedpcd_app.flwr_run"]
    for folder in ("benchmarks", "scripts"):
        for path in sorted((PROJECT / folder).glob("*.py")):
            if path.stem.startswith("_"):
                continue
            try:
                module = importlib.import_module(f"{folder}.{path.stem}")
            except BaseException:  # noqa: BLE001 - a script that runs on import or needs an extra
                continue
            main = getattr(module, "main", None)
            if callable(main) and (parser := parser_of(main)) is not None:
                out[f"{folder}.{path.stem}"] = out[f"{folder}/{path.name}"] = _flags(parser)
    return out


@cache
def flower_commands() -> dict[str, set[str]]:
    """``flwr <command>`` and the flower-* programs -> their options (Flower's own parsers)."""
    import click
    import typer
    from flwr.cli.app import app

    out: dict[str, set[str]] = {}

    def walk(cmd, path):
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        out[" ".join(path)] = opts
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, path + [name])

    walk(typer.main.get_command(app), ["flwr"])
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    out["flower-superlink"] = set(_flags(_parse_args_run_superlink()))
    out["flower-supernode"] = set(_flags(_parse_args_run_supernode()))
    # the other tools the docs show: pip (the installs) and Ray's CLI (the Ray cluster section)
    from pip._internal.commands import create_command

    for name in ("install", "wheel", "download"):
        parser = create_command(name).parser
        out[f"pip {name}"] = {o for opts in [parser.option_list] + [g.option_list for g in parser.option_groups]
                              for opt in opts for o in (*opt._long_opts, *opt._short_opts)}
    with contextlib.suppress(ImportError):
        from ray.scripts import scripts as ray_cli

        for name in ("start", "stop", "status"):
            out[f"ray {name}"] = {o for p in getattr(ray_cli, name).params for o in (*p.opts, *p.secondary_opts)}
    return out


@cache
def all_flags() -> set[str]:
    flags = {f for cmd in project_commands().values() for f in cmd}
    return flags | {f for opts in flower_commands().values() for f in opts}


@cache
def run_config_keys() -> set[str]:
    from fedcore.config import default_run_config

    return set(default_run_config())


def _listed_after(message: str, marker: str) -> set[str]:
    return {k.strip() for k in message.split(marker, 1)[1].split(",")} if marker in message else set()


@cache
def sweep_keys() -> set[str]:
    """The keys a sweep file may have besides run-config keys, as its parsers state them (their
    one-line error for an unknown key lists the known ones)."""
    from fedpcd_app.analysis import sweep, tuning

    keys = {"name", "method", "by-setting", "tuned-from"}  # an entry's own keys (sweep.parse_sweep pops them)
    for probe in (lambda: sweep.parse_sweep({"no-such-key": 1}), lambda: tuning.parse_tuning({"no-such-key": 1}, [])):
        try:
            probe()
        except Exception as exc:  # noqa: BLE001 - the parser's one line
            keys |= _listed_after(str(exc), " has ")
    return keys


@cache
def other_keys() -> set[str]:
    """``k=v`` keys of the other configs the docs show: Flower's federation config (its
    ``flwr run`` options' names) and the node config (fedcore.keys, client_app.local_data)."""
    from client_app import local_data
    from fedcore import keys

    names = {o.lstrip("-") for opts in flower_commands().values() for o in opts if o.startswith("--")}
    for module in (keys, local_data):
        names |= {v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)}
    return names


@cache
def strategy_classes() -> dict[str, type]:
    import strategies
    from strategies import registry

    classes = {n: c for n, c in vars(strategies).items() if inspect.isclass(c)}
    for name in registry.names():
        cls = registry.strategy_class(name)
        classes.setdefault(cls.__name__, cls)
    return classes


@cache
def assigned_attributes() -> dict[str, set[str]]:
    """Class name -> the attributes its methods set (``self.x = ...``), over strategies/."""
    out: dict[str, set[str]] = {}
    for path in (PROJECT / "strategies").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = out.setdefault(node.name, set())
                for sub in ast.walk(node):
                    targets = sub.targets if isinstance(sub, ast.Assign) else \
                        [sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) else []
                    for t in targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            names.add(t.attr)
    return out


def class_has(cls: type, attr: str) -> bool:
    if hasattr(cls, attr) or attr in inspect.signature(cls).parameters:
        return True
    return any(attr in assigned_attributes().get(c.__name__, ()) for c in cls.__mro__)


@cache
def strategy_keywords() -> set[str]:
    return {p for c in strategy_classes().values() if hasattr(c, "__init__")
            for p in inspect.signature(c).parameters}


def resolves(dotted: str) -> bool:
    """``a.b.c`` (or ``a.b:c``) importable, its tail attributes found."""
    path = dotted.replace(":", ".").removesuffix("()").split(".")
    for cut in range(len(path), 0, -1):
        try:
            obj = importlib.import_module(".".join(path[:cut]))
        except ImportError:
            continue
        try:
            for name in path[cut:]:
                obj = getattr(obj, name) if not inspect.isclass(obj) or hasattr(obj, name) else \
                    (name if class_has(obj, name) else getattr(obj, name))
            return True
        except AttributeError:
            return False
    return False


# -- reading the spans ----------------------------------------------------------------------------------------

CMD = re.compile(r"python3?\s+-m\s+((?:fedpcd_app|benchmarks|scripts)\.\w+)|python3?\s+((?:benchmarks|scripts)/\w+\.py)"
                 r"|bash\s+(scripts/flwr_run\.sh)|\b(flwr\s+[a-z]+)\b|\b(flower-super(?:link|node))\b"
                 r"|\b(pip\s+(?:install|wheel|download)|ray\s+(?:start|stop|status))\b")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
PAIR = re.compile(r"(?<![\w.$-])([A-Za-z_][\w.-]*)\s*=\s*(?!=)(\"[^\"]*\"|'[^']*'|[^\s,;)]+)")
DEFAULT = re.compile(r"^[^.]{0,160}?\(default:?\s+([^;,)]+)")
HELP_DEFAULT = re.compile(r"default:?\s+'?([^':;,)]+)'?")


def command_key(m: re.Match) -> str:
    name = next(g for g in m.groups() if g)
    return " ".join(name.split())


def flags_of(command: str) -> set[str] | None:
    if command in project_commands():
        return set(project_commands()[command])
    return flower_commands().get(command)


CONFIG_SPAN = re.compile(r"[\"']?(?:[a-z][a-z0-9-]*\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"']+)\s*)+[\"']?")
CALL = re.compile(r"([A-Z]\w*)\((.*)\)")


def check_pairs(text: str, where: str, problems: list[str]) -> None:
    """``k=v ...``: each key a run-config key (or a sweep, federation or node-config key)."""
    for key, value in PAIR.findall(text):
        if key.isupper() or "." in key or value.lower() == "value" or value.startswith("<"):
            continue  # a placeholder (KEY=VALUE, key=value, k=<...>), an environment variable, a Python attribute
        if key not in run_config_keys() | sweep_keys() | other_keys() and key not in ALLOWED:
            problems.append(f"{where}: `{key}` is no run-config key (nor a sweep, federation or node-config key)")


def check_call(cls_name: str, args: str, where: str, problems: list[str]) -> None:
    """``FedPCD(tau=0.05, ...)``: each keyword one the class takes (its own or Flower's name)."""
    cls = strategy_classes()[cls_name]
    accepted = set(inspect.signature(cls).parameters) | set(getattr(cls, "flower_names", {}) or {})
    for key in re.findall(r"(?:^|[(,]\s*)([a-z_]\w*)\s*=(?!=)", args):
        if key not in accepted:
            problems.append(f"{where}: {cls_name} takes no keyword {key!r}")


def check_command_span(span: str, where: str, problems: list[str]) -> None:
    """A span that holds a command: its flags against that command's parser, its --run-config
    contents against the keys."""
    matches = list(CMD.finditer(span))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(span)
        command, tail = command_key(m), span[m.end():end]
        known = flags_of(command)
        try:
            words = shlex.split(tail)
        except ValueError:
            words = tail.split()
        for k, word in enumerate(words):
            if not word.startswith("--"):
                continue
            flag = word.split("=", 1)[0]
            if known is not None and flag not in known and flag not in ALLOWED:
                problems.append(f"{where}: `{command}` has no flag {flag}")
            if flag in ("--run-config", "--set") and k + 1 < len(words) and "=" in words[k + 1]:
                check_pairs(words[k + 1], where, problems)


def span_problems(doc: db.Doc) -> list[str]:
    problems: list[str] = []
    for line, span in db.inline_code(doc):
        where = f"{db.rel(doc.path)}:{line}: `{span}`"
        if CMD.search(span):
            check_command_span(span, where, problems)
            continue
        if span.startswith("--"):
            flag = FLAG.match(span).group(1) if FLAG.match(span) else span
            if flag not in all_flags() and flag not in ALLOWED:
                problems.append(f"{where}: no parser has the flag {flag}")
            if flag in ("--run-config", "--set", "--federation-config", "--node-config") and " " in span:
                check_pairs(span.split(" ", 1)[1], where, problems)
        elif CONFIG_SPAN.fullmatch(span) and any("-" in k or k in run_config_keys() for k, _ in PAIR.findall(span)):
            check_pairs(span, where, problems)  # k=v pairs of a config (a Python `name = value` is left alone)
        elif (m := CALL.fullmatch(span)) and m.group(1) in strategy_classes():
            check_call(m.group(1), m.group(2), where, problems)
        elif m := re.fullmatch(r"(strategy|[A-Z]\w*)\.([a-z_]\w*)(?:\(\))?", span):
            owner, attr = m.groups()
            if owner == "strategy":
                if not any(class_has(c, attr) for c in strategy_classes().values()):
                    problems.append(f"{where}: no strategy has the attribute {attr!r}")
            elif owner in strategy_classes() and not class_has(strategy_classes()[owner], attr):
                problems.append(f"{where}: {owner} has no attribute {attr!r}")
        elif re.fullmatch(rf"(?:{'|'.join(PACKAGES)})(?:\.\w+)+(?::\w+)?(?:\(\))?", span) and not resolves(span):
            problems.append(f"{where}: {span} does not import")
        elif re.fullmatch(r"\w[\w.-]*(?:/[\w.*-]+)+/?", span) and (ROOT / span.split("/")[0]).is_dir() \
                and span.split("/")[0] not in PRODUCED and "*" not in span and not (ROOT / span).exists():
            problems.append(f"{where}: {span} is not in the repository")
    return problems


def default_problems(doc: db.Doc) -> list[str]:
    """A default the docs state for a flag (```--x` ... (default: X)``) agrees with the one its
    --help states: the parser of the command named last before it in its section, else any
    parser that has the flag."""
    problems: list[str] = []
    section_command = None
    for start, text in db.paragraphs(doc):
        if db.HEADING.match(text.split("\n")[0]):
            section_command = None
        plain = " ".join(text.split())
        last = 0
        for m in re.finditer(r"`(--[a-z][a-z0-9-]*)`", plain):
            for c in CMD.finditer(plain, last, m.start()):
                section_command = command_key(c)
            last = m.end()
            after = re.split(r"`--|\|", plain[m.end():], maxsplit=1)[0]  # up to the next flag or table cell
            said = DEFAULT.match(after)
            if not said:
                continue
            commands = [section_command] if section_command in project_commands() else list(project_commands())
            helps = []
            for command in commands:
                action = project_commands().get(command, {}).get(m.group(1))
                if action is None:
                    continue
                h = HELP_DEFAULT.search(" ".join((action.help or "").split()))
                helps.append((h.group(1) if h else str(action.default)).strip().strip("`'\" ").lower())
            stated = said.group(1).strip().strip("`'\" ").lower()
            if helps and not any(stated in h or h in stated for h in helps):
                problems.append(f"{db.rel(doc.path)}:{start}: `{m.group(1)}` (default: {stated}) but its --help "
                                f"says default {' / '.join(repr(h) for h in helps)}")
        for c in CMD.finditer(plain, last):
            section_command = command_key(c)
    return problems


def shell_block_problems(doc: db.Doc) -> list[str]:
    """The commands of every shell block, run or skipped: their flags and run-config keys
    (a block the snippet test skips for a GPU or a cluster is still checked here)."""
    problems: list[str] = []
    for b in doc.blocks:
        if b.kind != "shell":
            continue
        logical = re.sub(r"\\\n\s*", " ", b.text)
        for k, line in enumerate(logical.splitlines()):
            code = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
            if CMD.search(code):
                check_command_span(code, f"{b.id} (block line {k + 1})", problems)
    return problems


def sweep_block_problems(doc: db.Doc) -> list[str]:
    from fedpcd_app.analysis import sweep

    problems = []
    for b in doc.blocks:
        if b.lang != "toml":
            continue
        try:
            table = tomllib.loads(b.text)
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"{b.id}: not TOML: {exc}")
            continue
        if not ({"methods", "tuning", "seeds"} & set(table)):
            continue  # not a sweep file (a run-config preset, Flower's config.toml)
        full = {"name": "docs", **table}
        full.setdefault("methods", [{"name": n, "method": n} for n in
                                    (table.get("tuning", {}).get("grids") or {"fedavg": {}})])
        try:
            sweep.parse_sweep(full)
        except Exception as exc:  # noqa: BLE001 - the sweep's one-line error
            problems.append(f"{b.id}: the sweep's parser refuses this file: {exc}")
        for key in table.get("base", {}):
            if key not in run_config_keys():
                problems.append(f"{b.id}: [base] key {key!r} is no run-config key")
    return problems


# -- the tests ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS, ids=[db.rel(d.path) for d in DOCS])
def test_every_named_key_flag_and_attribute_exists(doc):
    problems = span_problems(doc) + default_problems(doc) + shell_block_problems(doc) + sweep_block_problems(doc)
    assert not problems, "names in the docs that do not exist:\n" + "\n".join(problems)


def test_the_parsers_are_found_by_introspection():
    commands = project_commands()
    assert "--workers" in commands["fedpcd_app.simulate"] and "--dry-run" in commands["fedpcd_app.sweep"]
    assert "--federation-config" in commands["scripts/flwr_run.sh"]
    assert "--stream" in flower_commands()["flwr run"] and "--insecure" in flower_commands()["flower-superlink"]
    assert {"budget", "extend-edges", "seeds", "methods"} <= sweep_keys()


def _planted(tmp_path, text: str) -> db.Doc:
    page = tmp_path / "README.md"
    page.write_text(text)
    return db.parse(page)


def test_a_planted_last_dropped_fails(tmp_path):
    # The sentence README carried until issue 44: no strategy has that attribute
    doc = _planted(tmp_path, "Malformed replies are dropped with a logged reason, not fatal "
                             "(`strategy.last_dropped`).\n")
    problems = span_problems(doc)
    assert len(problems) == 1 and "no strategy has the attribute 'last_dropped'" in problems[0]


def test_planted_wrong_names_fail_and_right_ones_pass(tmp_path):
    doc = _planted(tmp_path, "\n".join([
        "Run `python -m fedpcd_app.simulate --workers 0 --run-config \"method='fedpcd' fedpcd-tau=0.05\"`.",
        "Not `python -m fedpcd_app.simulate --worker 0`, nor `num-clientz=3`, nor `FedPCD(tau=1, fraction_trian=0.5)`.",
        "Flower: `flwr run . --stream`, `flwr log --follow`; `--federation-config \"num-supernodes=2\"`.",
        "`strategy.dropped` no, `FedPCD.train_outcome` yes, `FedPCD.nothing` no, `fedcore.keys.TRAIN_ALIASES` yes,",
        "`fedcore.keys.NOPE` no, `fedpcd_app/runtime/grid.py` yes, `fedpcd_app/runtime/nope.py` no, `--bogus-flag` no.",
    ]) + "\n")
    problems = "\n".join(span_problems(doc))
    for wrong in ("has no flag --worker", "`num-clientz`", "'fraction_trian'", "`flwr log` has no flag --follow",
                  "'dropped'", "'nothing'", "fedcore.keys.NOPE", "runtime/nope.py", "--bogus-flag"):
        assert wrong in problems, wrong
    assert problems.count("\n") == 8, problems


def test_a_planted_default_that_help_does_not_state_fails(tmp_path):
    doc = _planted(tmp_path, "**Two engines for `python -m fedpcd_app.simulate`**: the ClientApps run in `--workers`\n"
                             "worker processes (default: the usable cores; `0` = in process).\n\n"
                             "`python -m fedpcd_app.simulate`: `--workers` (default: auto) is right.\n")
    problems = default_problems(doc)
    assert len(problems) == 1 and "README.md:1" in problems[0] and "'auto'" in problems[0]


def test_a_planted_sweep_file_with_an_unknown_tuning_key_fails(tmp_path):
    doc = _planted(tmp_path, "```toml\n[tuning]\nbudget = 8\nbudgett = 3\n```\n\n"
                             "```toml\nname = \"x\"\n[base]\nnum-clients = 4\n[[methods]]\nname = \"a\"\n"
                             "method = \"fedavg\"\n```\n")
    problems = sweep_block_problems(doc)
    assert len(problems) == 1 and "budgett" in problems[0]



def test_a_skipped_shell_block_is_still_checked_for_names(tmp_path):
    doc = _planted(tmp_path, "<!-- skip-test: cluster: needs a SuperLink -->\n```bash\n"
                             "flower-supernode --superlink host:9092 \\\n"
                             "    --node-confg \"partition-id=0\"  # one node\n"
                             "python -m fedpcd_app.simulate --engine ray \\\n"
                             "    --run-config \"num-clients=4 num-clientz=2\"\n```\n")
    problems = shell_block_problems(doc)
    assert len(problems) == 2, problems
    assert "`flower-supernode` has no flag --node-confg" in problems[0] and "`num-clientz`" in problems[1]
