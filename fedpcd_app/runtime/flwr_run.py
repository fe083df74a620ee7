"""``flwr run .`` of this app on Flower's local (Ray) simulation, with an honest exit status.

    python -m fedpcd_app.flwr_run [--run-config "method='fedpcd' ..."]... [--federation-config "..."]...
                                  [--ray-address HOST:PORT|auto]

(``scripts/flwr_run.sh`` runs this with the project's environment.) What it does, in order:

1. composes the ``--run-config`` arguments key by key (``key=value`` strings or TOML files:
   a later one replaces the keys it names) and validates the whole config, and checks that
   ``output-dir`` can be written, before anything starts: a problem is one line, exit 2;
2. composes the federation config the same way over this script's defaults
   (``num-supernodes=<num-clients> client-resources-num-cpus=1``): ``--federation-config
   "num-supernodes=2"`` replaces the default, it is not appended to it;
3. starts a private SuperLink (its own ``FLWR_HOME`` in a temporary folder, a free port:
   :class:`LocalSuperLink`), so that two runs from one checkout, or a
   plain ``flwr run`` next to it, never share one; its simulation gets a private local Ray
   (``RAY_ADDRESS=local``: never a cluster the shell or a stale address file names) unless
   ``--ray-address`` asks to join an existing cluster, checked to answer first
   (:func:`resolve_ray_address`; docs/deployment.md, section 5);
4. ``flwr run`` with ``--format json``: the run id it prints is *the* run (no run id: the
   start failed, exit 1 with Flower's message), then ``flwr log <run-id> --stream`` shows the
   run's log until it ends, then ``flwr ls --run-id <run-id>`` gives its status;
5. stops the SuperLink and every process it started (the SuperExec, the simulation, Ray),
   by PID; prints ``run <id> status: <status> (<seconds> s)`` and, for a failed run, Flower's
   status details (the app's one-line error); exit 0 only for ``finished:completed``, else 1.

Ctrl-C (SIGINT) or SIGTERM: ``flwr stop <run-id>``, then everything it started is stopped,
one line, exit 130.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from fedcore.config import ConfigError

PROJECT = Path(__file__).resolve().parents[2]  # the Flower app (pyproject.toml) `flwr run` builds
EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130
DEFAULT_FEDERATION = "client-resources-num-cpus=1"  # and num-supernodes=<num-clients>
STATUS_TIMEOUT = 60.0  # seconds to wait, after the log stream ends, for the run's final status


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM while a run is going (a KeyboardInterrupt: no ``except Exception`` of a
    caller, nor a test runner, takes it for an error and goes on)."""


def flwr_bin() -> str:
    return str(Path(sys.executable).parent / "flwr")


def compose_federation(num_clients: int, overrides: list[str]) -> str:
    """This script's federation defaults with the user's ``--federation-config`` strings over
    them, key by key (a key given twice would be refused by Flower as "an invalid format")."""
    from fedcore import overrides as ov

    return ov.render(ov.compose(f"num-supernodes={num_clients} {DEFAULT_FEDERATION}", *overrides))


def start_run(link, project: Path, run_config: Path, federation: str, env: dict[str, str]) -> int:
    """``flwr run`` (detached); the run id Flower printed. RuntimeError (one line) without one."""
    proc = subprocess.run([flwr_bin(), "run", str(project), link.name, "--format", "json",
                           "--federation-config", federation, "--run-config", str(run_config)],
                          env=env, cwd=project, capture_output=True, text=True, check=False)
    payload = last_json(proc.stdout)
    run_id = payload.get("run-id") if payload else None
    if not run_id:
        why = (payload or {}).get("error-message") or (proc.stderr.strip() or proc.stdout.strip() or "no output")
        raise RuntimeError(f"flwr run did not start a run (exit code {proc.returncode}): "
                           + " ".join(str(why).split())[:500])
    return int(run_id)


def last_json(text: str) -> dict[str, Any] | None:
    """The JSON object in ``flwr ... --format json``'s output (warnings may precede it)."""
    start = text.find("{")
    while start != -1:
        try:
            return json.loads(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
    return None


def follow(link, run_id: int, env: dict[str, str]) -> int:
    """``flwr log <run-id> --stream``: the run's log on this terminal until the run ends."""
    return subprocess.run([flwr_bin(), "log", str(run_id), link.name, "--stream"], env=env,
                          check=False).returncode


def run_info(link, run_id: int, env: dict[str, str]) -> dict[str, Any]:
    """``flwr ls --run-id <run-id> --format json``: that run's entry ({} if not listed)."""
    proc = subprocess.run([flwr_bin(), "ls", link.name, "--run-id", str(run_id), "--format", "json"],
                          env=env, capture_output=True, text=True, check=False)
    payload = last_json(proc.stdout) or {}
    for run in payload.get("runs", []):
        if str(run.get("run-id")) == str(run_id):
            return run
    return {}


def final_status(link, run_id: int, env: dict[str, str], timeout: float = STATUS_TIMEOUT) -> dict[str, Any]:
    """The run's entry once its status is ``finished:*`` (or what it is after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        info = run_info(link, run_id, env)
        if str(info.get("status", "")).startswith("finished") or time.monotonic() > deadline:
            return info
        time.sleep(0.5)


def flwr_env(home: Path, ray_address: str | None = None) -> dict[str, str]:
    """The environment of the SuperLink and the flwr CLI: a private FLWR_HOME, this Python's
    environment (no run-time dependency install, no network), no telemetry, and the Ray the
    simulation uses: ``RAY_ADDRESS`` (which Flower's ``ray.init()`` reads; its backend config
    has no address) is the cluster asked for (:func:`resolve_ray_address`) or, when none was,
    ``local``: a private Ray instance, whatever ``RAY_ADDRESS`` the caller's shell holds and
    whatever cluster Ray's address file (``/tmp/ray/ray_current_cluster``) names — a stale one
    made the simulation wait for minutes on a cluster that was gone."""
    bin_dir = Path(sys.executable).parent
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "RAY_ADDRESS": ray_address or "local",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def ray_address_file() -> Path:
    """The file ``ray start`` writes its cluster's address to and a plain ``ray.init()`` reads
    (Ray's rule: ``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp``, then ``ray/ray_current_cluster``)."""
    root = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(root) / "ray" / "ray_current_cluster"


def resolve_ray_address(address: str, *, probe_timeout: float = 5.0) -> str:
    """The Ray cluster a run or a sweep was asked to join, as ``host:port`` (its head's GCS
    address), checked to answer; ``local`` is returned as is (a private Ray on this machine).
    ``auto``: ``$RAY_ADDRESS`` if it names one, else the cluster Ray's address file names (the
    last ``ray start`` on this machine). ConfigError (one line) when there is none or it does
    not answer: a dead cluster is an error up front, never a wait."""
    where = address
    if address == "local":
        return address
    if address == "auto":
        env = os.environ.get("RAY_ADDRESS", "")
        if env and env not in ("auto", "local"):
            address, where = env, f"auto (RAY_ADDRESS={env})"
        else:
            file = ray_address_file()
            try:
                address = file.read_text().strip()
            except OSError:
                raise ConfigError(f"Ray address 'auto': no Ray cluster was started on this machine (no {file}); "
                                  "start one with `ray start --head` or give its address host:port") from None
            where = f"auto ({file} names {address})"
    if address.startswith("ray://"):
        raise ConfigError(f"Ray address '{address}': Ray Client (ray://) is not supported; give the head's "
                          "GCS address host:port (`ray start --head` prints it)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"Ray address '{address}' is not host:port, 'auto' or 'local'; e.g. 10.0.0.1:6379")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=probe_timeout):
            pass
    except OSError as exc:
        raise ConfigError(f"Ray address {where}: no Ray cluster answers at {address} ({exc.strerror or exc}); "
                          "start it (`ray start --head`) or give the address of a live one") from None
    return address


def run_app(raw: dict[str, Any], federation: str, *, project: Path | None = None,
            on_start=None, ray_address: str | None = None) -> tuple[int, dict[str, Any]]:
    """Run the validated flat config ``raw`` with ``flwr run`` on a private SuperLink:
    (run id, its ``flwr ls`` entry). :class:`Interrupted` on SIGINT/SIGTERM, after the run
    and every process are stopped. ``ray_address``: the Ray cluster the simulation joins
    (``host:port`` from :func:`resolve_ray_address`); None: a private local Ray."""
    project = project or PROJECT
    with tempfile.TemporaryDirectory(prefix="fedpcd-flwr-") as tmp, _signals_raise():
        home = Path(tmp)
        run_config = home / "run_config.toml"
        run_config.write_text("".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in raw.items()))
        env = flwr_env(home, ray_address)
        run_id = None
        link = LocalSuperLink(home, env)
        try:
            run_id = start_run(link, project, run_config, federation, env)
            if on_start is not None:
                on_start(run_id)
            follow(link, run_id, env)
            return run_id, final_status(link, run_id, env)
        except KeyboardInterrupt:  # Interrupted (SIGTERM) included
            # The SuperLink is this call's own (a private FLWR_HOME): stopping it stops the run (its
            # processes get SIGTERM: the ServerApp checkpoints the rounds done). A `flwr stop` first
            # only marked the run stopped in a database deleted right after, for seconds of CLI start-up.
            with _signals_ignored():  # a second Ctrl-C does not cut the cleanup short
                link.stop()
            raise Interrupted(run_id) from None
        finally:
            with _signals_ignored():
                link.stop()


class _signals_raise:
    """SIGTERM raises like SIGINT does (KeyboardInterrupt) while a run is going."""

    def __enter__(self):
        def handler(signum, frame):
            raise Interrupted()

        self.old = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self.old)


class _signals_ignored:
    def __enter__(self):
        self.old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


def prepare(run_configs: list[str]) -> dict[str, Any]:
    """The composed, validated flat config with an absolute, writable ``output-dir``
    (ConfigError / OverrideError, one line, otherwise)."""
    from fedcore import overrides as ov
    from fedcore.config import parse_overrides, resolve
    from fedpcd_app.server.config import check
    from fedpcd_app.server.results import default_output_dir

    raw = resolve(parse_overrides(ov.render(ov.compose(*run_configs))))
    cfg = check(raw)
    check_local_data(cfg)
    raw["output-dir"] = str(Path(raw["output-dir"] or default_output_dir(cfg)).resolve())
    check_output_dir(raw["output-dir"])
    return raw


def check_local_data(cfg) -> None:
    """A local ``dataset-path`` loaded once before anything starts: a missing folder or bad data
    is one line (DataError) here, not a failed run behind a SuperLink and Ray."""
    if cfg.dataset_path:
        from client_app.data import load_federated_data

        load_federated_data(cfg)


def check_output_dir(path: str | os.PathLike) -> None:
    """ConfigError (one line) unless ``output-dir`` can be written: a file can be created in it
    or, when it does not exist yet, in its nearest existing parent. Checked before a run starts,
    so that a read-only or misspelt folder is not a traceback after the run's first minutes."""
    target = Path(path).expanduser().absolute()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    problem = None
    if not probe.is_dir():
        problem = f"{probe} is not a folder"
    else:
        try:
            fd, name = tempfile.mkstemp(prefix=".fedpcd-write-check-", dir=probe)
            os.close(fd)
            os.unlink(name)
        except OSError as exc:
            problem = f"{probe} cannot be written ({exc.strerror or exc})"
    if problem:
        raise ConfigError(f"run-config key 'output-dir' = '{path}': {problem}; "
                          "give output-dir='<a folder you can write>'")


def _toml_key(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


class LocalSuperLink:
    """``flower-superlink --simulation`` on a free local port, with its own FLWR_HOME (a
    ``config.toml`` naming it), and every process it starts tracked so that :meth:`stop`
    ends them all by PID: Ray's actors and servers outlive the run otherwise."""

    name = "fedpcd-local"

    def __init__(self, home: Path, env: dict[str, str], startup_timeout: float = 60.0) -> None:
        self.home, self.env = home, env
        self.port = free_port()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{self.name}"\n\n[superlink.{self.name}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.log = home / "superlink.log"
        cmd = [str(Path(sys.executable).parent / "flower-superlink"), "--insecure", "--simulation",
               "--host", "127.0.0.1", "--port", str(self.port), "--log-file", str(self.log),
               "--disable-runtime-dependency-installation"]
        self.process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        self.seen: dict[int, int] = {}  # pid -> start time (a reused pid is not ours)
        self._stop_watch = threading.Event()
        self._watch = threading.Thread(target=self._track, daemon=True)
        self._watch.start()
        deadline = time.monotonic() + startup_timeout
        try:
            while not self._healthy():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the local SuperLink did not start (exit code {self.process.poll()}); "
                                       f"its log: {self.log}")
                time.sleep(0.2)
        except BaseException:  # a failed start, or Ctrl-C while it starts: nothing left behind
            self.stop()
            raise

    def __enter__(self) -> LocalSuperLink:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def _track(self) -> None:
        while not self._stop_watch.wait(0.25):
            self.seen.update(descendants(self.process.pid))

    def stop(self) -> None:
        """SIGTERM the SuperLink and everything it started, then SIGKILL what remains, by PID."""
        self.seen.update(descendants(self.process.pid))
        self._stop_watch.set()
        self._watch.join()
        self.seen.update(descendants(self.process.pid))
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
            if self.process.poll() is None:
                self.process.send_signal(sig)
            alive = [pid for pid, started in self.seen.items() if start_time(pid) == started]
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while (alive or self.process.poll() is None) and time.monotonic() < deadline:
                time.sleep(0.05)
                alive = [pid for pid in alive if start_time(pid) == self.seen[pid]]
            if not alive and self.process.poll() is not None:
                break
        self.process.wait()
        shutil.rmtree(self.home / "apps", ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot) from /proc, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else int(fields[19])  # a zombie is already gone


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root`` (pid -> start time), from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        started = start_time(pid)
        if started is not None:
            out[pid] = started
        stack.extend(children.get(pid, []))
    return out


def add_ray_address_argument(parser: argparse.ArgumentParser) -> None:
    """``--ray-address``: join an existing Ray cluster (shared with ``simulate --engine ray``)."""
    parser.add_argument("--ray-address", default="", metavar="HOST:PORT|auto",
                        help="run the simulation's clients on this existing Ray cluster (its head's address, or "
                             "'auto': the one `ray start` on this machine made); default: a private local Ray, "
                             "never a cluster that was not asked for")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedpcd_app.flwr_run", description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", action="append", default=[],
                        help="key=value overrides (strings in inner quotes) or a TOML file; repeatable")
    parser.add_argument("--federation-config", action="append", default=[],
                        help="e.g. \"num-supernodes=2 client-resources-num-cpus=1\"; repeatable")
    add_ray_address_argument(parser)
    args = parser.parse_args(argv)
    try:
        ray_address = resolve_ray_address(args.ray_address) if args.ray_address else None
        raw = prepare(args.run_config)
        from fedcore.config import parse_run_config

        federation = compose_federation(parse_run_config(raw).num_clients, args.federation_config)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - ConfigError, OverrideError, flwr's: one line each
        name = "" if isinstance(exc, ValueError) else f"{type(exc).__name__}: "
        print(f"error: {name}{exc}".splitlines()[0], file=sys.stderr)
        return EXIT_CONFIG
    start = time.monotonic()
    try:
        run_id, info = run_app(raw, federation, ray_address=ray_address,
                               on_start=lambda rid: print(f"run {rid} started -> {raw['output-dir']}", flush=True))
    except Interrupted as exc:
        rid = exc.args[0] if exc.args else None
        print(f"interrupted: run {rid} stopped" if rid else "interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except RuntimeError as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return EXIT_FAILED
    status = info.get("status", "unknown (not listed by flwr ls)")
    print(f"run {run_id} status: {status} ({time.monotonic() - start:.0f} s)", flush=True)
    if status != "finished:completed":
        details = " ".join(str(info.get("status-details", "")).split())
        if details:
            print(f"error: {details}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
