"""The client-only install, built offline from an environment that holds every extra.

A SuperNode installs the base set of pyproject.toml (``pip install "fedpcd-app[client]"``): flwr,
torch, numpy, pyarrow, pillow and what they require. This module

* resolves that set from the installed distributions' metadata (:func:`closure`: the
  requirements of the base set, their requirements, ..., each with the extras asked for and the
  markers of this platform), not from a hand-written list;
* builds a virtualenv that holds that set alone (:func:`make_client_venv`: every distribution of
  the set linked into its site-packages, then ``pip install --no-index "fedpcd-app[client] @
  <wheel>"``, whose resolver finds every requirement already there or fails), so that a
  server-side import fails there as it would on the device;
* sizes it (:func:`install_size`: the bytes of the files each distribution's RECORD lists).

``tests/test_client_install.py`` runs the ClientApp in that virtualenv; ``benchmarks/supernode.py``
starts SuperNodes from it. Run it alone for the sizes::

    python -m benchmarks.client_install [--resolver]

(``--resolver`` also asks pip's resolver, against the package index, what ``fedpcd-app[client]``
pulls; ``--platforms`` whether the index has binary wheels of that set for Linux x86_64 and
aarch64, macOS arm64 and Windows on CPython 3.11 and 3.12: both need the network.)
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# the packages a SuperNode must not have: the server's, the simulation's, the analysis', the hub's
SERVER_SIDE = ("ray", "cvxpy", "clarabel", "scipy", "scikit-learn", "matplotlib", "tensorboard", "datasets",
               "flwr-datasets", "huggingface-hub", "tqdm", "threadpoolctl", "torchvision")


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def client_requirements() -> list[Requirement]:
    """The base set and the ``client`` extra of pyproject.toml (the checkout's, not the installed
    metadata's: an editable install made from another checkout may be older)."""
    proj = project()
    return [Requirement(r) for r in [*proj["dependencies"], *proj["optional-dependencies"].get("client", [])]]


def extra_requirements(extra: str) -> list[Requirement]:
    """An extra's requirements, its ``fedpcd-app[...]`` references to other extras expanded."""
    proj = project()
    out = []
    for r in map(Requirement, proj["optional-dependencies"][extra]):
        if canonicalize_name(r.name) == canonicalize_name(proj["name"]):
            out.extend(x for e in sorted(r.extras) for x in extra_requirements(e))
        else:
            out.append(r)
    return out


def _applies(req: Requirement, extras: frozenset[str], target: dict | None = None) -> bool:
    if req.marker is None:
        return True
    env = {**default_environment(), **(target or {})}
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def closure(requirements: list[Requirement], skip: frozenset[str] = frozenset(), *, target: dict | None = None,
            absent: set[str] | None = None) -> dict[str, md.Distribution]:
    """Every installed distribution that ``requirements`` pull (name -> distribution), walking the
    installed metadata (``Requires-Dist`` with the extras asked for, this platform's markers, or
    ``target``'s: e.g. ``{"sys_platform": "darwin", ...}``). A required distribution that is not
    installed is an error (the environment is incomplete), or, given ``absent``, its name is
    added there (another platform's requirement, e.g. colorama on Windows)."""
    found: dict[str, md.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(r, frozenset()) for r in requirements]
    while todo:
        req, parent_extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in skip or not _applies(req, parent_extras, target):
            continue
        extras = frozenset(canonicalize_name(e) for e in req.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = found.get(name) or md.distribution(name)
        except md.PackageNotFoundError:
            if absent is None:
                raise RuntimeError(f"{req} is required but not installed in {sys.prefix}") from None
            absent.add(name)
            continue
        found[name] = dist
        todo.extend((Requirement(r), extras) for r in (dist.requires or []))
    return found


def client_closure() -> dict[str, md.Distribution]:
    return closure(client_requirements())


def _top_level_entries(dist: md.Distribution, site: Path) -> set[str]:
    """The first path component, inside ``site``, of every file the distribution's RECORD lists
    (scripts installed to ../../bin are left out)."""
    out = set()
    for f in dist.files or []:
        parts = Path(f).parts
        if parts and parts[0] != ".." and (site / parts[0]).exists():
            out.add(parts[0])
    return out


def _owners(site: Path) -> dict[str, set[str]]:
    """Every top-level entry of ``site`` -> the distributions that own a file under it."""
    owners: dict[str, set[str]] = {}
    for dist in md.distributions(path=[str(site)]):
        for entry in _top_level_entries(dist, site):
            owners.setdefault(entry, set()).add(canonicalize_name(dist.metadata["Name"]))
    return owners


def link_distributions(dists: dict[str, md.Distribution], site: Path, dest: Path) -> None:
    """Symlink into ``dest`` the top-level entries of ``site`` that the distributions own. An entry
    shared with a distribution outside the set (a namespace folder) becomes a real folder whose
    children are linked the same way, one level down."""
    owners = _owners(site)
    wanted = set(dists)
    entries = {e for d in dists.values() for e in _top_level_entries(d, site)}
    for entry in sorted(entries):
        if owners.get(entry, set()) <= wanted:
            (dest / entry).symlink_to(site / entry)
            continue
        # a namespace folder shared with others: link only the files the set's distributions list
        for dist in dists.values():
            for f in dist.files or []:
                parts = Path(f).parts
                if parts and parts[0] == entry:
                    target = dest / Path(*parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if not target.exists():
                        target.symlink_to(site / Path(*parts))


def _console_scripts(dists: dict[str, md.Distribution], bindir: Path, python: Path) -> None:
    """The console scripts of the set (flower-supernode, flwr-clientapp, ...), for ``python``."""
    for dist in dists.values():
        for ep in dist.entry_points:
            if ep.group != "console_scripts":
                continue
            module, _, attr = ep.value.partition(":")
            script = bindir / ep.name
            script.write_text(f"#!{python}\nimport sys\nfrom {module} import {attr.split('.')[0]}\n"
                              f"sys.exit({attr}())\n")
            script.chmod(0o755)


def make_client_venv(dest: Path, wheel: Path) -> Path:
    """A virtualenv at ``dest`` holding the client set of this environment (linked) and ``wheel``
    installed with its client extra by ``pip --no-index`` (the resolver sees the linked set);
    returns its python. Its sys.path holds nothing
    else: no system site-packages, no .pth of this environment."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(dest)
    python = dest / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    dists = client_closure()
    site = Path(sysconfig.get_paths()["purelib"])
    link_distributions(dists, site, purelib)
    _console_scripts(dists, dest / "bin", python)
    # pip's resolver checks the client extra's requirements against what is linked (no index, no
    # download: a requirement the set lacks, or a version that does not match, fails here)
    # (without the caller's PYTHONPATH: a path into this environment would show its set to the
    # virtualenv's interpreter, and a requirement the linked set lacks would pass)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                           "--no-compile", "-q", f"fedpcd-app[client] @ {wheel.as_uri()}"],
                          capture_output=True, text=True, env={**env, "PYTHONNOUSERSITE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"pip install of {wheel.name} into {dest} failed:\n{done.stdout}\n{done.stderr}")
    return python


def build_wheel(dest: Path) -> Path:
    """The app's wheel, built offline from the checkout (``pip wheel --no-build-isolation``: the
    test extra's hatchling)."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(dest), str(ROOT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (wheel,) = dest.glob("fedpcd_app-*.whl")
    return wheel


def install_size(dists: dict[str, md.Distribution]) -> int:
    """Bytes on disk of the files the distributions' RECORDs list (scripts in bin/ included)."""
    total = 0
    for dist in dists.values():
        for f in dist.files or []:
            try:
                total += dist.locate_file(f).stat().st_size
            except OSError:
                pass
    return total


def sizes() -> dict[str, int]:
    """Bytes: the client set; torch's share of it (what only torch pulls); the whole environment's
    site-packages (every extra)."""
    client = client_closure()
    without_torch = closure([r for r in client_requirements() if canonicalize_name(r.name) != "torch"])
    torch_share = {k: v for k, v in client.items() if k not in without_torch}
    site = Path(sysconfig.get_paths()["purelib"])
    full = sum(p.stat().st_size for p in site.rglob("*") if p.is_file() and not p.is_symlink())
    return {"client": install_size(client), "torch_share": install_size(torch_share),
            "client_without_torch": install_size(without_torch), "full_site_packages": full,
            "client_distributions": len(client), "torch_share_distributions": len(torch_share)}


def resolver_report(wheel: Path) -> list[str]:
    """What pip's resolver installs for ``<wheel>[client]`` in an empty environment (the package
    index's metadata: needs the network). Returns the distribution names."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                           "--report", "-", f"fedpcd-app[client] @ {wheel.as_uri()}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip's resolver failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return sorted(canonicalize_name(i["metadata"]["name"]) for i in report["install"])


# the targets whose binary wheels --platforms checks, as pip's platform tags: a given --platform is
# taken literally (no older manylinux or macOS tag implied), so each target lists what its
# installer would accept (glibc 2.17-2.28: e.g. Debian 11+, Ubuntu 20.04+; macOS 11-14)
PLATFORMS = {
    f"Linux {arch}": [f"manylinux_2_{v}_{arch}" for v in range(28, 16, -1)] + [f"manylinux2014_{arch}"]
    for arch in ("x86_64", "aarch64")
}
PLATFORMS["macOS arm64"] = [f"macosx_{v}_0_{a}" for v in range(14, 10, -1) for a in ("arm64", "universal2")]
PLATFORMS["Windows x86_64"] = ["win_amd64"]
# pip evaluates a requirement's markers on this machine (Linux) whatever --platform says: for the
# other systems the set is walked here with their markers, then checked package by package
MARKERS = {
    "macOS arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64",
                    "os_name": "posix"},
    "Windows x86_64": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64",
                       "os_name": "nt"},
}


def _dry_run(platforms: list[str], python: str, *, no_deps: bool, reqs: list[str]) -> tuple[bool, str, dict]:
    import tempfile

    with tempfile.TemporaryDirectory() as target:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                               *(["--no-deps"] if no_deps else []), "--only-binary=:all:",
                               *(a for t in platforms for a in ("--platform", t)), "--python-version", python,
                               "--implementation", "cp", "--target", target, "--report", "-", *reqs],
                              capture_output=True, text=True)
    if done.returncode != 0:
        return False, (done.stderr.strip().splitlines() or ["pip failed"])[-1], {}
    report = json.loads(done.stdout)
    return True, "", {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def binary_check(wheel: Path, label: str, python: str) -> tuple[bool, str]:
    """Does the package index hold a binary wheel (or a pure one) of every distribution
    ``<wheel>[client]`` needs on platform ``label`` (:data:`PLATFORMS`) for CPython ``python``
    ("3.12")? Linux: pip's resolver in dry-run from the wheel. macOS, Windows: the set walked
    with that system's markers (:data:`MARKERS`; this environment's versions), then pip in
    dry-run with ``--no-deps`` on exactly those pins (a requirement not installed here, e.g.
    colorama, unpinned). Both read the index's metadata: they need the network."""
    tags = PLATFORMS[label]
    if label not in MARKERS:
        ok, err, names = _dry_run(tags, python, no_deps=False, reqs=[f"fedpcd-app[client] @ {wheel.as_uri()}"])
    else:
        target = {**MARKERS[label], "python_version": python, "python_full_version": f"{python}.0"}
        absent: set[str] = set()
        dists = closure(client_requirements(), target=target, absent=absent)
        reqs = [f"{n}=={d.version}" for n, d in sorted(dists.items())] + sorted(absent)
        ok, err, names = _dry_run(tags, python, no_deps=True, reqs=reqs)
    if not ok:
        return False, err
    return True, f"{len(names)} distributions, torch {names.get('torch')}, flwr {names.get('flwr')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resolver", action="store_true", help="also ask pip's resolver (package index: network)")
    ap.add_argument("--platforms", action="store_true",
                    help="check binary wheels for Linux x86_64/aarch64, macOS arm64, Windows on CPython 3.11/3.12 "
                         "(package index: network)")
    args = ap.parse_args(argv)
    mib = 1024 * 1024
    s = sizes()
    print(f"client set: {s['client_distributions']} distributions, {s['client'] / mib:.0f} MiB; torch's share "
          f"({s['torch_share_distributions']} distributions): {s['torch_share'] / mib:.0f} MiB; the rest: "
          f"{s['client_without_torch'] / mib:.0f} MiB; this environment's site-packages (every extra): "
          f"{s['full_site_packages'] / mib:.0f} MiB")
    print("client set:", " ".join(sorted(client_closure())))
    if args.resolver:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            names = resolver_report(build_wheel(Path(tmp)))
        bad = sorted(set(names) & set(SERVER_SIDE))
        print(f"pip's resolver, fedpcd-app[client]: {len(names)} distributions; server-side among them: "
              f"{', '.join(bad) or 'none'}")
        print("resolver:", " ".join(names))
    if args.platforms:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            wheel = build_wheel(Path(tmp))
            for label in PLATFORMS:
                for python in ("3.11", "3.12"):
                    ok, what = binary_check(wheel, label, python)
                    print(f"{label:<15} CPython {python}: {'wheels for all' if ok else 'MISSING'}: {what}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())
