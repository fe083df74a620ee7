"""Checkpoints of the complete server state, written atomically, and exact resume.

Every ``checkpoint-every`` rounds (0 = never) the ServerApp writes
``<output-dir>/checkpoints/round-<t>.pt`` holding

* the global model θ_t (name → numpy array, in ArrayRecord order), and central DP's
  adaptive clipping norm when ``dp`` is on,
* the strategy's ``state`` (FedPCD's cache and Gram, CRAFT's reference, SCAFFOLD's
  control variate, AFL's λ and averaged model, FedeRage's β, ...) as a plain tree
  (:mod:`fedcore.state`: no per-method save code), and the method's hyperparameters,
* the round t, ``times_sampled`` per partition and the metric history (every
  rounds.jsonl record so far, plus the last evaluation),
* the method, seed, number of clients and the model's array spec, checked on resume.

There is no sampler RNG state to save: the clients of round t are drawn from a generator
seeded by (seed, t) alone (:mod:`fedpcd_app.sampler`), and every client draw (batch order,
model init) likewise derives from (seed, partition, round). A run resumed after round k
therefore draws exactly what the uninterrupted run drew in rounds k+1, k+2, ...

Atomicity: the file is written to a temporary name in the same folder, flushed, fsync-ed,
then renamed over its final name (``os.replace`` is atomic on POSIX), and the folder is
fsync-ed so the rename itself survives a power cut. A process killed mid-write leaves at
worst a stray ``*.tmp`` file, never a truncated ``round-<t>.pt``. :func:`latest` also
skips (with a warning) any checkpoint that fails to load, so a file damaged after the
fact falls back to the previous one. The newest ``checkpoint-keep`` files are kept.

Client-side state in Flower's ``context.state`` is not on the server and is not in the
checkpoint: SCAFFOLD's strategy mirrors the client control variates c_i on the server and
re-sends them after a resume; Ditto's personal models are lost on resume (each client
restarts its personal model from the global one), because they exist only on the nodes.

Checkpoints hold only dicts, lists, tensors and scalars: ``torch.load(path, weights_only=True)``
reads one (:func:`load` rebuilds the objects).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedcore.config import ConfigError
from fedcore.state import from_tree, to_tree

log = logging.getLogger("fedpcd")

FOLDER = "checkpoints"
FORMAT = 2  # 2: a weights_only tree (fedcore.state), the method's params
_NAME = re.compile(r"^round-(\d{6})\.pt$")


@dataclasses.dataclass
class Checkpoint:
    """The server state after ``round`` (see the module docstring)."""

    round: int
    method: str
    seed: int
    num_clients: int
    arrays: dict[str, np.ndarray]
    strategy: Any  # the strategy's state object (saved as a fedcore.state tree)
    params: dict[str, Any]  # the method's hyperparameters (run-config keys): must match on resume
    times_sampled: np.ndarray
    history: list[dict[str, Any]]
    last_eval: dict[str, Any]
    privacy: Any = None  # central DP's state (strategies.privacy.State), when dp is on
    averaged_iterate: Any = None  # eval-averaged-iterate: {"mean": θ̄_t, "count": t} (fedpcd_app.evaluation)


    def to_dict(self) -> dict[str, Any]:
        """A tree of dicts, lists, tensors and scalars (``torch.load(weights_only=True)`` reads it)."""
        return {"format": FORMAT, **{f.name: to_tree(getattr(self, f.name)) for f in dataclasses.fields(self)}}


def checkpoint_dir(folder: str | Path) -> Path:
    """``folder/checkpoints`` (``folder`` may also be the checkpoints folder itself)."""
    folder = Path(folder)
    return folder if folder.name == FOLDER else folder / FOLDER


def path_for(folder: str | Path, server_round: int) -> Path:
    return checkpoint_dir(folder) / f"round-{server_round:06d}.pt"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(folder: str | Path, ckpt: Checkpoint, keep: int = 2) -> Path:
    """Write ``ckpt`` atomically (temp file, fsync, rename); keep the newest ``keep`` files."""
    final = path_for(folder, ckpt.round)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(ckpt.to_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)  # only left behind when the write itself failed
    _fsync_dir(final.parent)
    if keep > 0:
        for old in rounds_in(folder)[:-keep]:
            path_for(folder, old).unlink(missing_ok=True)
    return final


def rounds_in(folder: str | Path) -> list[int]:
    """Rounds with a checkpoint file in ``folder``, ascending (temp files excluded)."""
    d = checkpoint_dir(folder)
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := _NAME.match(p.name)))


def load(path: str | Path) -> Checkpoint:
    """Load one checkpoint file; raises on a damaged or foreign file."""
    raw = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint of format {FORMAT}")
    return Checkpoint(**{f.name: from_tree(raw[f.name] if f.default is dataclasses.MISSING else raw.get(f.name))
                         for f in dataclasses.fields(Checkpoint)})


def latest(folder: str | Path) -> Checkpoint:
    """The newest checkpoint in ``folder`` that loads; damaged ones are skipped with a warning."""
    found = rounds_in(folder)
    for server_round in reversed(found):
        path = path_for(folder, server_round)
        try:
            return load(path)
        except Exception as exc:  # noqa: BLE001 - a damaged file falls back to the previous one
            log.warning("checkpoint %s cannot be loaded (%s: %s); trying an older one",
                        path, type(exc).__name__, exc)
    what = "none loads" if found else "none found"
    raise ConfigError(
        f"run-config key 'resume-from' = '{folder}': no checkpoint ({what} in {checkpoint_dir(folder)}); "
        "give the output-dir of a run with checkpoint-every > 0"
    )


def check_compatible(ckpt: Checkpoint, method: str, seed: int, num_clients: int,
                     arrays: dict[str, np.ndarray], params: dict[str, Any] | None = None) -> None:
    """Raise a one-line :class:`ConfigError` unless ``ckpt`` continues this run's setting."""
    for key, want in (params or {}).items():
        have = ckpt.params.get(key)
        if have != want:
            raise ConfigError(
                f"run-config key '{key}' = {want!r} but the checkpoint of round {ckpt.round} was written "
                f"with {have!r}: resume with the same {key}"
            )
    for key, have, want in (("method", ckpt.method, method), ("seed", ckpt.seed, seed),
                            ("num-clients", ckpt.num_clients, num_clients)):
        if have != want:
            raise ConfigError(
                f"run-config key '{key}' = {want!r} but the checkpoint of round {ckpt.round} was written "
                f"with {have!r}: resume with the same {key}"
            )
    ours = [(k, tuple(a.shape), str(a.dtype)) for k, a in arrays.items()]
    theirs = [(k, tuple(a.shape), str(a.dtype)) for k, a in ckpt.arrays.items()]
    if ours != theirs:
        raise ConfigError(
            "run-config key 'model' (or 'dataset') differs from the checkpoint's: its arrays do not "
            "match this run's model; resume with the same model and dataset"
        )
