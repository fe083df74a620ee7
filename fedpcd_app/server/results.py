"""The results contract: ``summary.json``, ``rounds.jsonl`` and ``clients.csv``.

* ``rounds.jsonl`` — one JSON object per round, appended and flushed as the round ends
  (a crash loses nothing already computed): train metrics, dropped replies, the
  strategy's diagnostics and, on evaluation rounds, the fairness metrics.
* ``clients.csv`` — one row per client: partition id, train/test sizes, rounds sampled,
  final accuracy and loss.
* ``summary.json`` — method, seed, rounds, the final fairness metrics (``mean_acc``,
  ``std_acc``, ``worst10_acc``, ``best10_acc``, ``min_acc``, ``jain``), ``central_acc``,
  per-client accuracies and the full resolved config.

Accuracies are fractions in [0, 1].

**One run per folder.** A run holds ``<output-dir>/.lock`` (its PID and the process's start
time) from the moment its writer opens the folder until it ends (``close``, or any exit:
``Experiment.run`` releases it in a ``finally``, and an interpreter exit through ``atexit``).
A second run into a folder whose lock belongs to a live process is refused in one line (a
:class:`ConfigError` naming the key and the PID, also raised by ``fedpcd_app.server.config.check``
before anything starts). A lock left by a process that is gone (killed, or its PID reused by
another program since) is stale and taken over with a warning. One process may open the
same folder again (an earlier run of it ended or was abandoned).

**A full disk** (any ``OSError`` writing a results file, or torch's ``RuntimeError`` inside
``torch.save``) ends the run with one line (:class:`fedpcd_app.server.checkpoint.OutputError`)
naming the file, the cause and the last checkpoint, which stays intact. ``final_model.pt``,
``summary.json`` and ``clients.csv`` are written atomically (temp file, fsync, rename): a
failed write leaves the previous file or none, never a truncated one.

**A folder never mixes two runs.** A run whose ``output-dir`` already holds another run's
results (``summary.json``, a non-empty ``rounds.jsonl``, ``clients.csv``, ``final_model.pt``
or a checkpoint) is refused in one line (:func:`check_output_dir_reusable`, from
``fedpcd_app.server.config.check``, before any data is loaded or file opened) naming the three
ways on: ``resume-from='<that folder>'`` (continue it: the only way a folder takes a second
process's rounds), a new ``output-dir``, or ``overwrite = true``, which deletes those results
(the files above, ``checkpoints/``, ``report.*``, ``figures/``, ``availability.json``) before
the run writes anything. A run that did not finish (interrupted, crashed, stopped) is named so,
with the round of its last checkpoint.
"""

from __future__ import annotations

import atexit
import csv
import json
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedcore.config import ConfigError, RunConfig
from fedpcd_app.server.checkpoint import OutputError, path_for, rounds_in, write_cause

log = logging.getLogger("fedpcd")

SUMMARY = "summary.json"
ROUNDS = "rounds.jsonl"
CLIENTS = "clients.csv"
LOCK = ".lock"
FINAL_MODEL = "final_model.pt"


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat field 22), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    """``pid`` runs and is the process that wrote the lock (not a later one with its PID)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    now = _start_time(pid)
    return start is None or now is None or now == start


def lock_holder(folder: str | Path) -> tuple[int, str | None] | None:
    """(pid, start time) of the live *other* process holding ``folder``'s lock, else None."""
    try:
        fields = (Path(folder) / LOCK).read_text().split()
        pid, start = int(fields[0]), (fields[1] if len(fields) > 1 else None)
    except (OSError, ValueError, IndexError):
        return None
    if pid == os.getpid() or not _alive(pid, start):
        return None
    return pid, start


RESULTS = (SUMMARY, CLIENTS, FINAL_MODEL)  # with a non-empty rounds.jsonl and checkpoints: a run's results
# What overwrite = true deletes (a run's own files only: never anything else in the folder).
CLEARED_FILES = (SUMMARY, ROUNDS, CLIENTS, FINAL_MODEL, "availability.json", "report.md", "report.csv")
CLEARED_DIRS = ("checkpoints", "figures", "tensorboard")
OVERWRITE_KEY = "overwrite"


def held_results(folder: str | Path) -> str | None:
    """What another run left in ``folder`` (a phrase for the refusal), None when nothing."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = [name for name in RESULTS if (folder / name).exists()]
    records = 0
    if (folder / ROUNDS).is_file():
        with open(folder / ROUNDS, "rb") as fh:
            records = sum(1 for line in fh if line.strip())
    ckpts = rounds_in(folder)
    if not found and not records and not ckpts:
        return None
    summary = None
    if (folder / SUMMARY).is_file():
        try:
            summary = json.loads((folder / SUMMARY).read_text())
        except (OSError, ValueError):
            summary = None
    last = f", its last checkpoint is of round {ckpts[-1]}" if ckpts else ", no checkpoint"
    if isinstance(summary, dict) and summary.get("complete") is True:
        return f"a finished run of {summary.get('rounds', '?')} rounds, method {summary.get('method', '?')!r}"
    if isinstance(summary, dict) and summary.get("incomplete_reason"):
        why = str(summary["incomplete_reason"]).splitlines()[0][:120]
        return f"a run that did not finish ({why}){last}"
    return f"a run that did not finish ({records} round record(s) in {ROUNDS}, no summary{last})"


def last_recorded_round(folder: str | Path) -> int | None:
    """The last round ``folder``'s ``rounds.jsonl`` records (``folder`` may be its checkpoints
    folder), None when it records none; a line cut short by a crash is skipped."""
    folder = Path(folder)
    path = (folder.parent if folder.name == "checkpoints" else folder) / ROUNDS
    last = None
    try:
        with open(path, "rb") as fh:
            for line in fh:
                try:
                    r = json.loads(line).get("round")
                except (ValueError, AttributeError):
                    continue
                if isinstance(r, int) and not isinstance(r, bool):
                    last = r if last is None else max(last, r)
    except OSError:
        return None
    return last


def check_output_dir_reusable(cfg: RunConfig) -> None:
    """One-line :class:`ConfigError` when ``output-dir`` holds another run's results and this
    run neither resumes that folder nor says ``overwrite = true`` (nothing is touched)."""
    if not cfg.output_dir:
        return
    folder = Path(cfg.output_dir).expanduser().resolve()
    resume = cfg.resume_from
    own_resume = bool(resume) and Path(resume).expanduser().resolve() in (folder, folder / "checkpoints")
    overwrite = cfg.overwrite
    if own_resume and overwrite:
        raise ConfigError(f"run-config key '{OVERWRITE_KEY}' = true would delete the checkpoints that resume-from = "
                          f"'{resume}' continues from: drop overwrite, or resume into a new output-dir")
    if own_resume or overwrite:
        return
    what = held_results(folder)
    if what is not None:
        raise ConfigError(f"run-config key 'output-dir' = '{cfg.output_dir}' holds another run's results ({what}): "
                          f"continue it with resume-from='{folder}', give this run a new output-dir, or set "
                          f"{OVERWRITE_KEY}=true to delete those results first")


def clear_results(folder: Path) -> list[str]:
    """``overwrite = true``: delete a run's own files in ``folder`` (see the module docstring)."""
    import shutil

    gone = []
    for name in CLEARED_FILES:
        if (folder / name).is_file():
            (folder / name).unlink()
            gone.append(name)
    for name in CLEARED_DIRS:
        if (folder / name).is_dir() and not (folder / name).is_symlink():
            shutil.rmtree(folder / name)
            gone.append(name + "/")
    return gone


def busy_error(folder: str | Path, pid: int) -> ConfigError:
    return ConfigError(f"run-config key 'output-dir' = '{folder}' is in use by a live run (pid {pid}, lock file "
                       f"{Path(folder) / LOCK}): give this run another output-dir, or wait for that run to end")


def check_output_dir_free(folder: str | Path) -> None:
    """One-line :class:`ConfigError` when a live other process holds ``folder`` (nothing taken)."""
    if folder and (holder := lock_holder(folder)) is not None:
        raise busy_error(folder, holder[0])


class OutputLock:
    """``<folder>/.lock`` held by this process (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK
        self.text = f"{os.getpid()} {_start_time(os.getpid()) or '-'}\n"
        self.held = False

    def acquire(self) -> None:
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = lock_holder(self.path.parent)
                if holder is not None:
                    raise busy_error(self.path.parent, holder[0]) from None
                stale = self.path.read_text(errors="replace").split()[:1] if self.path.exists() else []
                if stale and stale[0] != str(os.getpid()):
                    log.warning("output-dir %s: taking over the stale lock of process %s (no longer running)",
                                self.path.parent, stale[0])
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(self.text)
            self.held = True
            atexit.register(self.release)
            return
        raise ConfigError(f"run-config key 'output-dir' = '{self.path.parent}': its lock {self.path} keeps "
                          "changing (another run is starting there): give this run another output-dir")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            if self.path.read_text() == self.text:
                self.path.unlink()
        except OSError:
            pass


@contextmanager
def writing(path: Path, folder: Path):
    """Any ``OSError`` writing ``path`` (a full disk), or torch's ``RuntimeError`` inside
    ``torch.save`` (its own writer's "file write failed") → one :class:`OutputError` line."""
    try:
        yield
    except OutputError:
        raise
    except (OSError, RuntimeError) as exc:
        found = rounds_in(folder)
        last = (f"the last checkpoint, {path_for(folder, found[-1])}, is intact" if found
                else "no checkpoint was written (checkpoint-every)")
        raise OutputError(f"cannot write {path}: {write_cause(exc)}; {last}; free space and resume with "
                          f"resume-from='{folder}'") from None


def _atomic(path: Path, write) -> None:
    """``write(fh)`` into a temp file beside ``path``, fsync, rename over ``path``; one
    :class:`OutputError` line on any failure, ``path`` untouched then."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with writing(path, path.parent):
        try:
            with open(tmp, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def default_output_dir(cfg: RunConfig) -> Path:
    """``$FEDPCD_OUTPUT_ROOT`` (or ./outputs) / <method>/seed<seed>-<timestamp>."""
    root = Path(os.environ.get("FEDPCD_OUTPUT_ROOT", "outputs")).resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return root / cfg.method / f"seed{cfg.seed}-{stamp}-{os.getpid()}"


def _clean(value: Any) -> Any:
    """JSON-safe: numpy/torch scalars → float/int, non-finite → None."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist"):
        return _clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: Path, obj: Any) -> None:
    text = json.dumps(_clean(obj), indent=2, sort_keys=True).encode()
    _atomic(path, lambda fh: fh.write(text))


class ResultsWriter:
    """The run's files in its folder. ``history``: the records a resumed run starts from (its
    checkpoint's), written to ``rounds.jsonl`` atomically before the run appends to it."""

    def __init__(self, cfg: RunConfig, out_dir: Path | None = None, history: list[dict[str, Any]] = ()) -> None:
        self.dir = Path(out_dir or (cfg.output_dir or default_output_dir(cfg))).resolve()
        with writing(self.dir, self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = OutputLock(self.dir)
        self.lock.acquire()  # a live run in this folder: one line, before rounds.jsonl is touched
        try:  # the folder check again, under the lock: no other run can write there in between
            check_output_dir_reusable(cfg.replace(output_dir=str(self.dir)))
        except ConfigError:
            self.lock.release()
            raise
        self.cfg = cfg
        if cfg.overwrite:
            with writing(self.dir, self.dir):
                if gone := clear_results(self.dir):
                    log.warning("output-dir %s: overwrite = true deleted the earlier run's %s", self.dir,
                                ", ".join(gone))
        text = "".join(json.dumps(_clean(r), sort_keys=True) + "\n" for r in history).encode()
        _atomic(self.dir / ROUNDS, lambda fh: fh.write(text))
        with writing(self.dir / ROUNDS, self.dir):
            self._rounds = open(self.dir / ROUNDS, "a")

    def round(self, record: dict[str, Any]) -> None:
        with writing(self.dir / ROUNDS, self.dir):
            self._rounds.write(json.dumps(_clean(record), sort_keys=True) + "\n")
            self._rounds.flush()

    def clients(self, rows: list[dict[str, Any]]) -> None:
        import io

        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(_clean(rows))
        text = buf.getvalue().encode()
        _atomic(self.dir / CLIENTS, lambda fh: fh.write(text))

    def model(self, state_dict: dict[str, Any]) -> None:
        """The final global model: a plain state_dict (``torch.load(path, weights_only=True)``),
        written atomically."""
        import torch

        _atomic(self.dir / FINAL_MODEL, lambda fh: torch.save(state_dict, fh))

    def summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.dir / SUMMARY, summary)

    def close(self) -> None:
        try:
            self._rounds.close()
        except OSError:
            pass  # the run is ending; its error (if any) is already on its way
        self.lock.release()


def read_rounds(folder: str | Path) -> list[dict[str, Any]]:
    with open(Path(folder) / ROUNDS) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_summary(folder: str | Path) -> dict[str, Any]:
    with open(Path(folder) / SUMMARY) as fh:
        return json.load(fh)
