"""scripts/install_cpu_torch.py: the CPU-only torch path says in one line, within its timeout, when
the index cannot be reached or lacks the pinned wheel, and what to do instead (issue 53). Offline:
a local HTTP server plays the index; the script runs in a virtualenv that holds nothing, as it
would before anything is installed."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install_cpu_torch.py"
CP = f"cp{sys.version_info.major}{sys.version_info.minor}"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A virtualenv without pip or anything else (the script needs the standard library only)."""
    dest = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(dest)
    return dest / "bin" / "python"


def _index(page: str):
    """An index on 127.0.0.1 whose /torch/ page is ``page``; (server, its URL)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = page.encode() if self.path.rstrip("/").endswith("/torch") else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"


def _page(*versions: str) -> str:
    links = "".join(f'<a href="/whl/torch-{v}-{CP}-{CP}-manylinux_2_28_x86_64.whl#sha256=00">x</a>\n' for v in versions)
    return f"<html><body>\n{links}</body></html>\n"


def _run(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_an_index_with_the_pinned_wheel_passes_the_check(bare_python):
    server, url = _index(_page("2.13.0+cpu", "2.14.1+cpu"))
    done = _run(bare_python, "--index-url", url, "--check")
    server.shutdown()
    assert done.returncode == 0 and done.stdout.startswith(f"ok: {url} has torch 2.14.1"), done.stderr


def test_an_index_without_the_pinned_wheel_is_one_line(bare_python):
    server, url = _index(_page("2.13.0+cpu"))
    done = _run(bare_python, "--index-url", url, "--check")
    server.shutdown()
    line = _one_line(done)
    assert done.returncode == 2 and f"lists no torch 2.14.1 wheel for CPython {sys.version_info.major}." in line
    assert line.startswith("error: the CPU build of torch 2.14.1 cannot be installed") and "--index-url URL" in line


def test_an_unreachable_index_is_one_line_naming_the_ways_on(bare_python):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _run(bare_python, "--index-url", f"http://127.0.0.1:{port}/whl/cpu")
    line = _one_line(done)
    assert done.returncode == 2 and "cannot be reached" in line
    assert "PyPI's torch instead" in line and "mirror" in line and "download the CPU wheel" in line


def test_an_index_that_never_answers_gives_up_after_the_timeout(bare_python):
    """A server that accepts the connection and says nothing: the script stops at its --timeout
    (1 s here) with one line, instead of pip's minutes of retries."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    done = _run(bare_python, "--index-url", f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu", "--timeout", "1")
    silent.close()
    line = _one_line(done)
    assert done.returncode == 2 and "no answer from" in line and "within 1 s" in line


def test_pip_failing_after_the_check_is_one_line_too(bare_python, tmp_path):
    """The index checks out, then pip fails: exit 1 and one line of the script's own after pip's
    output. The pip that runs is a stand-in that exits 3, first on a PYTHONPATH of its own in an
    environment stripped of the caller's PYTHON* settings: a pip the caller's environment leaks in
    (CI's held the project's .venv, whose torch made a real pip say 'already satisfied') is never
    reached."""
    (tmp_path / "pip").mkdir()
    (tmp_path / "pip" / "__init__.py").write_text("")
    (tmp_path / "pip" / "__main__.py").write_text("import sys\nprint('stand-in pip failing')\nsys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(tmp_path), PYTHONNOUSERSITE="1")
    server, url = _index(_page("2.14.1+cpu"))
    done = subprocess.run([str(bare_python), str(SCRIPT), "--index-url", url], capture_output=True, text=True,
                          timeout=120, env=env)
    server.shutdown()
    assert "stand-in pip failing" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: pip could not install torch 2.14.1 from {url} (exit 3") and "mirror" in last


def test_the_readme_installs_the_cpu_build_through_the_script():
    install = (ROOT / "README.md").read_text().split("## Install")[1].split("\n## ")[0]
    assert ".venv/bin/python scripts/install_cpu_torch.py" in install
