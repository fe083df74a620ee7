"""Install the CPU-only build of the pinned torch into this Python's environment, or say in one
line, within seconds, why not and what to do instead.

    .venv/bin/python scripts/install_cpu_torch.py [--index-url URL] [--timeout S] [--check]

PyTorch's CPU wheels live on their own index (https://download.pytorch.org/whl/cpu), not on PyPI.
A plain ``pip install torch==X --index-url <that index>`` that cannot reach it retries for
minutes (measured here: 85 s) and then either fails with "No matching distribution", or, where
pip's configuration adds another index or a find-links folder, takes PyPI's CUDA build from there
and fails on one of its CUDA dependencies (here: ``No matching distribution found for
cuda-bindings<14,>=13.0.3``): either way not the install asked for. So this script first asks the
index for torch's page (one request, ``--timeout`` seconds, default 10) and checks that it lists
the pinned version (pyproject.toml's ``torch==``) for this CPython; only then does it run pip,
with ``--retries 1`` and that timeout. Unreachable index, no such wheel, or pip failing: one line
on stderr naming the problem and the ways on, exit 2 (pip's failure: 1). ``--check``: the index
check alone. Standard library only: it runs in a virtualenv that holds nothing yet.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEX = "https://download.pytorch.org/whl/cpu"
INSTEAD = ("install PyPI's torch instead (the CUDA build, 5.3 GiB installed, runs on the CPU too: "
           "`pip install -e .` takes it), give a mirror of the CPU index (--index-url URL), or download the CPU "
           "wheel on a machine that reaches it and `pip install` the file here")


def pinned_torch() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        if m := re.fullmatch(r"torch==([\w.+]+)", dep.split(";")[0].strip()):
            return m.group(1)
    raise SystemExit("error: pyproject.toml pins no torch==<version> in [project] dependencies")


def check_index(index: str, version: str, timeout: float) -> str | None:
    """None if ``index`` lists a torch ``version`` wheel for this CPython, else the problem in a few words."""
    url = index.rstrip("/") + "/torch/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - an https/http index URL
            page = resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return f"{url} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:  # DNS, refused, TLS, timeout
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return f"no answer from {url} within {timeout:g} s"
        return f"{url} cannot be reached ({reason})"
    cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    files = re.findall(r"torch-([^-/\"#]+)-(cp\d+)-[^\"#/]*?\.whl", page)
    if not any(v.split("+")[0] == version and tag == cp for v, tag in files):
        return f"{url} lists no torch {version} wheel for CPython {sys.version_info.major}.{sys.version_info.minor}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index-url", default=INDEX, help=f"the index that holds the CPU wheels (default {INDEX})")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds for the index to answer (default 10)")
    ap.add_argument("--check", action="store_true", help="check the index only; install nothing")
    args = ap.parse_args(argv)
    version = pinned_torch()
    problem = check_index(args.index_url, version, args.timeout)
    if problem:
        print(f"error: the CPU build of torch {version} cannot be installed from {args.index_url}: {problem}; "
              f"{INSTEAD}", file=sys.stderr)
        return 2
    if args.check:
        print(f"ok: {args.index_url} has torch {version} for this CPython")
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "--retries", "1", "--timeout", f"{args.timeout:g}",
           f"torch=={version}", "--index-url", args.index_url]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        print(f"error: pip could not install torch {version} from {args.index_url} (exit {done.returncode}; its "
              f"output is above); {INSTEAD}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
