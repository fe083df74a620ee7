"""Every usage block of README.md and docs/**/*.md is run (issue 44: docs that cannot lie).

A fenced ```bash / ```sh / ```shell (``console``) block runs with ``bash -e``, a ```python block
as a standalone script, one pytest item per block (id ``file:line`` of its opening fence), in a
copy of the checkout (its tracked and untracked-but-not-ignored files, ``.venv`` a link to this
interpreter's environment), so that nothing a snippet writes lands in the checkout:

* ``python`` is this interpreter (its ``bin/`` first on PATH), the copy's root is on PYTHONPATH
  and ``FEDPCD_VENV`` names this environment (the scripts use it as is: nothing is installed);
* outputs go to a fresh folder per block: ``FEDPCD_OUTPUT_ROOT`` (the app's rule for a run
  without ``output-dir``: ``fedpcd_app.server.results.default_output_dir``), ``FLWR_HOME`` and
  ``TMPDIR``; a relative ``output-dir`` or ``--out`` lands in the copy;
* no network: ``PIP_NO_INDEX``, ``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``.

A block that must not run here carries, directly above its opening fence,
``<!-- skip-test: CATEGORY: reason -->`` (CATEGORY: gpu, network, minutes, cluster; a reason is
required): the item is then skipped with that reason. A malformed marker, or one that is not
directly above a usage block, fails. A block that installs packages (``pip install``, ``-m venv``,
or a ``scripts/*.sh`` that does, followed transitively) needs the network on a fresh machine: it
must carry ``skip-test: network``, and a section that says "offline" must not contain it.

A block runs at most ``FEDPCD_SNIPPET_TIMEOUT`` seconds (default 300): past that it fails and
says so; a block that takes minutes carries ``skip-test: minutes``. Commands outside a usage
block (an indented code block, a fence without a language) would escape the test: they fail it.
``FEDPCD_DOCS_ROOT``: run another checkout's docs (tests/docs_blocks.py)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import docs_blocks as db

ROOT = db.docs_root()
DOCS = db.all_docs()
USAGE = [b for b in db.all_blocks() if b.kind]
PROJECT_ROOT = db.PROJECT
TIMEOUT = float(os.environ.get("FEDPCD_SNIPPET_TIMEOUT", "300"))

INSTALL = re.compile(r"\bpip3?\s+install\b|-m\s+pip\s+install\b|\buv\s+(?:pip\s+install|sync)\b|-m\s+venv\b")
SCRIPT = re.compile(r"(?:^|[\s;&|(])(?:bash\s+|sh\s+|\./)?((?:\./)?scripts/[\w./-]+\.sh)\b")
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:python3?\s+(?:-m\s+)?[\w./-]+|bash\s+\S+\.sh"
                     r"|flwr\s+(?:run|log|ls|stop|build|new|login|pull)\b|flower-(?:superlink|supernode)\b"
                     r"|pip3?\s+install|\.venv/bin/|source\s+\S*activate|(?:FEDPCD|FLWR|RAY|CUDA)_\w+=\S*\s+\S)")


def _code_lines(text: str) -> str:
    """The shell text without its comments (a ``#`` at a line's start or after a space)."""
    return "\n".join(re.split(r"(?:^|\s)#", line, maxsplit=1)[0] for line in text.splitlines())


def installs(text: str, root: Path = ROOT, seen: frozenset[str] = frozenset()) -> str | None:
    """What in ``text`` installs packages (a line, or the script that does), else None; the
    project's ``scripts/*.sh`` it calls are followed. A block that sets FEDPCD_VENV itself uses an
    existing environment."""
    code = _code_lines(text)
    if not seen and re.search(r"(?:^|\s)(?:export\s+)?FEDPCD_VENV=", code):
        return None
    if m := INSTALL.search(code):
        return code[max(0, code.rfind("\n", 0, m.start()) + 1):].splitlines()[0].strip()
    for m in SCRIPT.finditer(code):
        name = m.group(1).removeprefix("./")
        if name in seen or not (root / name).is_file():
            continue
        if installs((root / name).read_text(), root, seen | {name}):
            return f"{name} (it installs packages)"
    return None


def section_of(block: db.Block) -> str:
    doc = db.parse(block.path)
    title = ""
    for n, text in doc.prose:
        if n > block.line:
            break
        if h := db.HEADING.match(text):
            title = h.group(2)
    return title


# -- the markers and the blocks that escape ------------------------------------------------------------

def marker_problems(doc: db.Doc) -> list[str]:
    problems = []
    fences = {b.line: b for b in doc.blocks}
    for n, text in enumerate(doc.lines, 1):
        if "skip-test" not in text:
            continue
        if any(b.line < n < b.line + b.text.count("\n") + 1 for b in doc.blocks):
            continue  # inside a fenced block (an example of the marker)
        if not text.strip().startswith("<!--"):
            continue  # prose that names the marker
        where = f"{db.rel(doc.path)}:{n}"
        if problem := db.marker_problem(text):
            problems.append(f"{where}: {problem}")
        elif n + 1 not in fences:
            problems.append(f"{where}: a skip-test marker must be the line directly above a block's opening fence")
        elif not fences[n + 1].kind:
            problems.append(f"{where}: the block below is ```{fences[n + 1].lang or '(no language)'}, not a usage "
                            "block (bash, sh, shell, python): nothing to skip")
    return problems


def escaping_commands(doc: db.Doc) -> list[str]:
    """Commands the snippet test would not run: in an indented code block, or in a fenced block
    without a usage language."""
    found = []
    prev = ""
    for n, text in doc.prose:
        if text.startswith(("    ", "\t")) and not prev.strip() and COMMAND.match(text):
            found.append(f"{db.rel(doc.path)}:{n}: indented code block: {text.strip()[:80]}")
        prev = text
    for b in doc.blocks:
        if b.kind or b.lang in {"toml", "json", "yaml", "ini", "text", "python-console", "pycon"}:
            continue
        for k, line in enumerate(b.text.splitlines(), 1):
            if COMMAND.match(line):
                found.append(f"{b.id}: ```{b.lang or '(no language)'} block, line {b.line + k}: {line.strip()[:80]}")
                break
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[db.rel(d.path) for d in DOCS])
def test_skip_markers_are_well_formed_and_above_a_usage_block(doc):
    problems = marker_problems(doc)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=[db.rel(d.path) for d in DOCS])
def test_no_command_escapes_the_snippet_test(doc):
    found = escaping_commands(doc)
    assert not found, ("commands outside a usage block are never run: put them in a ```bash block (or "
                       "```text when they are output):\n" + "\n".join(found))


# -- running the blocks ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the checkout's files (tracked, and untracked but not ignored), ``.venv`` a link
    to this interpreter's environment."""
    copy = tmp_path_factory.mktemp("checkout") / ROOT.name
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / name)
    (copy / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    return copy


def block_env(copy: Path, scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    for name in ("outputs", "flwr", "tmp"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    env.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(copy),
        "FEDPCD_VENV": sys.prefix,
        "FEDPCD_OUTPUT_ROOT": str(scratch / "outputs"),
        "FLWR_HOME": str(scratch / "flwr"),
        "TMPDIR": str(scratch / "tmp"),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        "PIP_NO_INDEX": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "MPLBACKEND": "Agg",
    })
    return env


def run_block(block: db.Block, copy: Path, scratch: Path, timeout: float = TIMEOUT) -> tuple[int | None, str]:
    """(exit status or None after the timeout, the block's output)."""
    scratch.mkdir(parents=True, exist_ok=True)
    script = scratch / ("snippet.sh" if block.kind == "shell" else "snippet.py")
    script.write_text(block.text)
    argv = ["bash", "-e", str(script)] if block.kind == "shell" else [sys.executable, str(script)]
    proc = subprocess.Popen(argv, cwd=copy, env=block_env(copy, scratch), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        stop_session(proc.pid, proc)
        out, _ = proc.communicate()
        return None, out
    finally:
        stop_session(proc.pid)  # whatever the block left running in its session


def stop_session(pgid: int, proc: subprocess.Popen | None = None, grace: float = 20.0) -> None:
    """SIGTERM the block's process group, give its programs ``grace`` seconds to stop what they
    started in sessions of their own (scripts/flwr_run.sh's SuperLink, benchmarks/supernode.py's
    SuperNodes: both stop them on SIGTERM; a SIGKILL first left them running), then SIGKILL what
    remains of the group. ``proc``, the group's leader, is reaped as it exits: unreaped, it stays
    in the group as a zombie, and the whole grace was waited out."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if proc is not None:
            proc.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def install_problems(block: db.Block) -> list[str]:
    """A block that installs packages says so (a network marker) and is not called offline."""
    what = installs(block.text)
    if not what:
        return []
    problems = []
    if "offline" in section_of(block).lower():
        problems.append(f"{block.id}: the section '{section_of(block)}' says offline, but its block installs from "
                        f"the package index on a fresh machine ({what})")
    skip = db.skip_of(block)
    if skip is None:
        problems.append(f"{block.id}: {what} installs from the package index on a fresh machine: mark it "
                        "<!-- skip-test: network: <what it downloads> -->")
    elif skip[0] != "network":
        problems.append(f"{block.id}: {what} installs packages: its marker's category is 'network', not {skip[0]!r}")
    return problems


ABSOLUTE_OUTPUT = re.compile(r"(?:output-dir|resume-from|--out|-w|--temp-dir)\s*[= ]\s*['\"]?(/[^\s'\"]*)")


def outside_writes(block: db.Block) -> list[str]:
    """An output folder given as an absolute path would be written outside the block's copy of
    the checkout: the block is not run (a relative path, or a skip marker)."""
    logical = _code_lines(re.sub(r"\\\n\s*", " ", block.text)).splitlines()
    return [f"{block.id}: writes to {m.group(1)}, outside the folder the test runs it in: give a relative path "
            "(or mark the block)" for line in logical if "--dry-run" not in line  # a dry run writes nothing
            for m in ABSOLUTE_OUTPUT.finditer(line)]


@pytest.fixture
def scratch():
    """A short folder for a block's outputs, FLWR_HOME and TMPDIR (Ray's socket paths must stay
    under 107 bytes), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="fedpcd-snip-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow  # a block may run a whole simulation (the library's example apps)
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in USAGE])
def test_usage_block_runs(block, checkout, scratch):
    problems = install_problems(block)
    assert not problems, "\n".join(problems)
    if (skip := db.skip_of(block)) is not None:
        pytest.skip(f"{skip[0]}: {skip[1]}")
    problems = outside_writes(block)
    assert not problems, "\n".join(problems)
    code, out = run_block(block, checkout, scratch)
    tail = "\n".join(out.splitlines()[-40:])
    assert code is not None, (f"{block.id} ran past {TIMEOUT:.0f} s: shrink it, or mark it "
                              f"<!-- skip-test: minutes: <why> -->; its output so far:\n{tail}")
    assert code == 0, f"{block.id} exited {code}:\n{block.text}\n--- output (last 40 lines) ---\n{tail}"


# -- the checker itself ------------------------------------------------------------------------------------

def _planted(tmp_path: Path, text: str) -> db.Doc:
    page = tmp_path / "README.md"
    page.write_text(text)
    db.parse.cache_clear()
    return db.parse(page)


def test_markers_are_checked(tmp_path):
    doc = _planted(tmp_path, "\n".join([
        "<!-- skip-test: gpu: needs CUDA -->", "```bash", "python -m x", "```", "",
        "<!-- skip-test: slow: takes long -->", "```bash", "ls", "```", "",
        "<!-- skip-test: network: -->", "```python", "print(1)", "```", "",
        "<!-- skip-test: minutes: one hour -->", "```toml", "a = 1", "```", "",
        "<!-- skip-test: cluster: two machines -->", "", "```bash", "ls", "```", ""]))
    problems = marker_problems(doc)
    assert [p.split(":")[1] for p in problems] == ["6", "11", "16", "21"], problems
    assert "'slow' is not one of" in problems[0] and "no reason" in problems[1]
    assert "not a usage block" in problems[2] and "directly above" in problems[3]
    assert db.skip_of(doc.blocks[0]) == ("gpu", "needs CUDA") and db.skip_of(doc.blocks[1]) is None


def test_escaping_commands_are_found(tmp_path):
    doc = _planted(tmp_path, "Run it:\n\n    python -m fedpcd_app.simulate --workers 0\n\n"
                             "* a list item\n    continued here\n\n```\nbash scripts/test.sh\n```\n\n"
                             "```text\nround 1/3: 5 replies\n```\n")
    found = escaping_commands(doc)
    assert len(found) == 2 and ":3: indented" in found[0] and "(no language) block, line 9" in found[1]


def test_an_installing_block_is_recognised_through_the_scripts_it_calls():
    assert installs('pip install -e ".[all]"') == 'pip install -e ".[all]"'
    assert installs("bash scripts/run_default.sh", PROJECT_ROOT) == "scripts/run_default.sh (it installs packages)"
    assert installs("FEDPCD_VENV=/opt/venv bash scripts/test.sh", PROJECT_ROOT) is None
    assert installs("python -m fedpcd_app.simulate --workers 0", PROJECT_ROOT) is None
    assert installs("export X=1   # no `uv sync` at run time", PROJECT_ROOT) is None


def test_a_failing_block_fails_with_its_output(tmp_path):
    doc = _planted(tmp_path, "```bash\necho before\nfalse\necho after\n```\n")
    code, out = run_block(doc.blocks[0], tmp_path, tmp_path / "scratch", timeout=60)
    assert code == 1 and "before" in out and "after" not in out



def test_an_offline_section_whose_block_installs_fails(tmp_path):
    # The README's section until issue 44: its first command installs from the package index
    doc = _planted(tmp_path, "## The two commands (fresh machine, offline)\n\n```bash\nbash scripts/run_default.sh\n"
                             "```\n\n## Installed\n\n<!-- skip-test: network: the first install downloads torch -->\n"
                             "```bash\nbash scripts/test.sh\n```\n")
    offline, marked = (install_problems(b) for b in doc.blocks)
    assert len(offline) == 2 and "says offline" in offline[0] and "mark it" in offline[1]
    assert marked == []


def test_a_block_writing_to_an_absolute_folder_is_not_run(tmp_path):
    doc = _planted(tmp_path, "```bash\npython -m fedpcd_app.simulate --run-config \"output-dir='/runs/a'\"\n"
                             "python -m fedpcd_app.sweep x.toml --out outputs/x  # relative: fine\n"
                             "python -m fedpcd_app.sweep x.toml \\\n    --out /tmp/x --dry-run\n```\n")
    problems = outside_writes(doc.blocks[0])
    assert len(problems) == 1 and "/runs/a" in problems[0]


def test_a_timed_out_block_lets_its_programs_stop_what_they_started(tmp_path):
    """A block's program that started a server in a session of its own (as scripts/flwr_run.sh and
    benchmarks/supernode.py do) and stops it on SIGTERM gets to: a SIGKILL of the block's group
    alone left such servers running after the test."""
    pidfile = tmp_path / "server.pid"
    program = (
        "import signal, subprocess, sys, time\n"
        "server = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(server.pid))\n"
        "def stop(*_):\n"
        "    server.kill(); server.wait(); sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(600)\n")
    doc = _planted(tmp_path, f"```python\n{program}```\n")
    code, _ = run_block(doc.blocks[0], tmp_path, tmp_path / "scratch", timeout=5)
    assert code is None  # timed out
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
