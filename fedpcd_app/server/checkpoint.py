"""Checkpoints of the complete server state, written atomically, and exact resume.

Every ``checkpoint-every`` rounds (0 = never) the ServerApp writes
``<output-dir>/checkpoints/round-<t>.pt`` holding

* the global model θ_t (name → numpy array, in ArrayRecord order),
* the method's ``state`` whole (FedPCD's cache and Gram, CRAFT's reference, SCAFFOLD's
  control variate, AFL's λ and averaged model, FedeRage's β, central DP's clipping norm around
  it, ...) as a plain tree (:mod:`fedcore.state`: no per-method save code), and the method's
  hyperparameters,
* with ``eval-averaged-iterate``, the running average θ̄_t of the global models and its count
  (:func:`fedpcd_app.server.evaluation.averaged`; a resume with the other value is refused),
* the run's state whole (:class:`fedpcd_app.server.run_state.RunState`): the round t,
  ``times_sampled`` per partition, the metric history (every rounds.jsonl record so far, plus
  the last evaluation), the size bound's trusted scale and near-bound count (``reply_trust``),
  the warnings written so far, the divergence watch's streaks (``watch``), the rounds in a row
  whose every reply was dropped (``streak``) and the run's resumes (``resumes``),
* the method, seed, number of clients and the model's array spec, checked on resume,
* the run's full config: on resume every training and data key (all but the operational
  ones of :data:`NOT_COMPARED`) must equal this run's, unless ``resume-allow-changes``
  lists it (``resume-allow-changes = "lr,local-epochs"``); a difference is refused in one
  line naming every differing key.

Every checkpoint carries a checksum: ``round-<t>.pt.sha256`` beside it (``sha256sum``'s
format, so ``sha256sum -c round-<t>.pt.sha256`` checks it by hand), written before the
checkpoint is renamed into place. :func:`load` verifies it; a file whose bytes do not match,
or that has no checksum, is *damaged*: :func:`latest` refuses it with a warning containing
"damaged" and uses the previous checkpoint.

A full disk (any ``OSError``, or the ``RuntimeError`` torch's own writer raises inside
``torch.save``) while writing ends the write with :class:`OutputError`, one line naming the
file, the cause and the last checkpoint, which is left intact (the new file is written beside
it under a temporary name and only renamed over nothing once complete).

**Authenticity (optional).** With the environment variable ``FEDPCD_CHECKPOINT_KEY`` set (any
non-empty secret; set but empty is an error, not "unsigned"), every checkpoint also gets
``round-<t>.pt.hmac``: the HMAC-SHA256 of its bytes under that key. With the key set,
:func:`load` refuses a checkpoint whose HMAC is missing or differs (:class:`ForgedCheckpoint`,
one line: written by someone without the key, or with another key): the sha256 file only catches
accidents, since anyone who can write the folder can
recompute it. Without the key nothing is signed or checked. Key or not, a loaded checkpoint's
model (and averaged iterate) must be finite, its ``times_sampled`` one count >= 0 per client
and its history a list of round records: a file failing that is refused like a damaged one.

**An older checkpoint than the run recorded.** When the newest checkpoint that loads is of an
earlier round than the folder's ``rounds.jsonl`` records (a newer one was damaged, deleted, or an
older signed one copied over it), the resume says so in one line (logged, kept in the run's
``warnings``) and every resume is listed in ``summary.json``'s ``resumes`` (``round``,
``last_recorded_round``, ``rolled_back``); the rounds after the checkpoint run again.

**Only this run's checkpoints.** Writing round t deletes the folder's checkpoints of rounds
after t (left by a timeline this run does not continue) and keeps the newest
``checkpoint-keep`` of the others, so ``resume-from`` never picks up another run's round.

There is no sampler RNG state to save: the clients of round t are drawn from a generator
seeded by (seed, t) alone (:mod:`fedpcd_app.server.sampler`), and every client draw (batch order,
model init) likewise derives from (seed, partition, round). A run resumed after round k
therefore draws exactly what the uninterrupted run drew in rounds k+1, k+2, ...

Atomicity: the file is written to a temporary name in the same folder, flushed, fsync-ed,
then renamed over its final name (``os.replace`` is atomic on POSIX), and the folder is
fsync-ed so the rename itself survives a power cut. A process killed mid-write leaves at
worst a stray ``*.tmp`` file, never a truncated ``round-<t>.pt``. :func:`latest` also
skips (with a warning) any checkpoint that fails to load, so a file damaged after the
fact falls back to the previous one (with its checksum, below). The newest ``checkpoint-keep`` files are kept.

Client-side state in Flower's ``context.state`` is not on the server and is not in the
checkpoint: SCAFFOLD's strategy mirrors the client control variates c_i on the server and
re-sends them after a resume; Ditto's personal models are lost on resume (each client
restarts its personal model from the global one), because they exist only on the nodes.

**Earlier files.** A checkpoint of an earlier format is read through one conversion per format:
format 2 (no ``warnings``, no ``watch``, :func:`from_format_2`): the resumed run starts its
warnings and divergence streaks anew (a warning in the log says so); format 3 (:func:`from_format_3`:
central DP's state beside the method's); format 4 (no drop streak, :func:`from_format_4`: counted
anew, said in the log). One without ``config`` or ``reply_trust`` (older still) is refused in one line.

Checkpoints hold only dicts, lists, tensors and scalars: ``torch.load(path, weights_only=True)``
reads one (:func:`load` rebuilds the objects).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import hmac
import logging
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.config import ConfigError

# torch (and fedcore.state, which needs it) are imported where a checkpoint is written or read:
# the run's report step reads results through fedpcd_app.server.results, which imports this
# module, and must not pay torch's import (seconds) to draw a few figures.


log = logging.getLogger("fedpcd")

FOLDER = "checkpoints"
CHECKSUM_SUFFIX = ".sha256"
HMAC_SUFFIX = ".hmac"
KEY_ENV = "FEDPCD_CHECKPOINT_KEY"  # the HMAC key (see the module docstring)
# Keys that do not change what the run computes (where it writes, how often it saves, logs,
# scores or waits): free to differ on resume. Every other key is compared with the checkpoint's.
NOT_COMPARED = frozenset({
    "output-dir", "resume-from", "resume-allow-changes", "num-server-rounds", "checkpoint-every",
    "checkpoint-keep", "log-every", "eval-every", "eval-batch-size", "tensorboard", "round-timeout",
    "server-device", "on-aggregation-error", "diverge-patience", "allow-unused-keys", "overwrite", "max-file-bytes",
})
# Keys no resume-allow-changes can free: the checkpoint's model and client ids depend on them.
FIXED = ("method", "seed", "num-clients")
# 2: a weights_only tree (fedcore.state), the method's params; 3: + warnings, watch (the run state whole);
# 4: central DP's clipping norm inside the method's state (was the field ``privacy``); 5: + the drop streak
# and the resumes (every field of the run state)
FORMAT = 5
FRESH_WATCH = {"refused_rounds": 0, "bad_loss_rounds": 0, "best_loss": math.inf}  # divergence.WatchCounts()
FRESH_STREAK = {"kind": None, "rounds": 0}  # strategies.health.DropStreak()
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
    config: dict[str, Any] = dataclasses.field(default_factory=dict)  # the run's full flat config, compared on resume
    averaged_iterate: Any = None  # eval-averaged-iterate: {"mean": θ̄_t, "count": t} (fedpcd_app.server.evaluation)
    # the trusted update scale and loss medians (fedcore.replies.ReplyTrust.as_dict)
    reply_trust: dict[str, Any] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)  # summary.json's, so far
    # the divergence watch's streaks (fedpcd_app.server.divergence.WatchCounts.as_dict)
    watch: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(FRESH_WATCH))
    # the rounds in a row whose every reply was dropped (strategies.health.DropStreak.as_dict)
    streak: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(FRESH_STREAK))
    resumes: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # summary.json's, so far

    def to_dict(self) -> dict[str, Any]:
        """A tree of dicts, lists, tensors and scalars (``torch.load(weights_only=True)`` reads it)."""
        from fedcore.state import to_tree

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


class OutputError(RuntimeError):
    """Results or a checkpoint could not be written (a full disk, a read-only folder): one line."""


def checksum_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_checksum(final: Path, digest: str) -> None:
    _write_side(checksum_path(final), f"{digest}  {final.name}\n")


def hmac_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + HMAC_SUFFIX)


def checkpoint_key() -> bytes | None:
    """``$FEDPCD_CHECKPOINT_KEY`` as bytes, None when unset; set but empty (or only blanks) is a
    one-line :class:`ConfigError` (an empty secret would sign nothing)."""
    key = os.environ.get(KEY_ENV)
    if key is None:
        return None
    if not key.strip():
        raise ConfigError(f"environment variable {KEY_ENV} is set but empty: set it to a secret to sign and check "
                          f"checkpoints, or unset it (unset {KEY_ENV}) to write them unsigned")
    return key.encode()


def _hmac_of(path: Path, key: bytes) -> str:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            mac.update(block)
    return mac.hexdigest()


def _write_side(side: Path, text: str) -> None:
    tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, side)
    finally:
        tmp.unlink(missing_ok=True)


def _remove(folder: str | Path, server_round: int) -> None:
    path = path_for(folder, server_round)
    for p in (path, checksum_path(path), hmac_path(path)):
        p.unlink(missing_ok=True)


def write(folder: str | Path, ckpt: Checkpoint, keep: int = 2) -> Path:
    """Write ``ckpt`` atomically (temp file, fsync, checksum, HMAC when a key is set, rename);
    delete checkpoints of later rounds and keep the newest ``keep`` of the others. Any
    ``OSError`` or torch ``RuntimeError`` (a full disk) is one :class:`OutputError`; earlier
    checkpoints stay."""
    import torch

    final = path_for(folder, ckpt.round)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    key = checkpoint_key()
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            torch.save(ckpt.to_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        _write_checksum(final, _sha256_of(tmp))  # before the rename: a checkpoint never lacks one
        if key is not None:
            _write_side(hmac_path(final), f"{_hmac_of(tmp, key)}  {final.name}\n")
        else:
            hmac_path(final).unlink(missing_ok=True)  # a stale one would not match these bytes
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except (OSError, RuntimeError) as exc:
        if isinstance(exc, OutputError):
            raise
        found = [r for r in rounds_in(folder) if r != ckpt.round]
        last = f"the last checkpoint, {path_for(folder, found[-1])}, is intact" if found else "no earlier checkpoint"
        raise OutputError(f"cannot write checkpoint {final}: {write_cause(exc)}; {last}; free space and resume "
                          f"with resume-from='{checkpoint_dir(folder).parent}'") from None
    finally:
        tmp.unlink(missing_ok=True)  # only left behind when the write itself failed
    found = rounds_in(folder)
    for later in (r for r in found if r > ckpt.round):  # another timeline's: never resumed from
        _remove(folder, later)
    if keep > 0:
        for old in [r for r in found if r <= ckpt.round][:-keep]:
            _remove(folder, old)
    return final


def rounds_in(folder: str | Path) -> list[int]:
    """Rounds with a checkpoint file in ``folder``, ascending (temp files excluded)."""
    d = checkpoint_dir(folder)
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := _NAME.match(p.name)))


class DamagedCheckpoint(ValueError):
    """A checkpoint whose bytes do not match its checksum, or that has none."""


class ForgedCheckpoint(DamagedCheckpoint):
    """With ``FEDPCD_CHECKPOINT_KEY`` set: a checkpoint whose HMAC is missing or differs."""


def verify(path: str | Path) -> None:
    """Raise :class:`DamagedCheckpoint` unless ``path``'s sha256 equals its checksum file's and,
    with ``FEDPCD_CHECKPOINT_KEY`` set, :class:`ForgedCheckpoint` unless its HMAC matches."""
    path, side = Path(path), checksum_path(path)
    try:
        want = side.read_text().split()[0]
    except (OSError, IndexError):
        raise DamagedCheckpoint(f"checkpoint {path} is damaged or unverifiable: no checksum file {side.name}") \
            from None
    have = _sha256_of(path)
    if have != want:
        raise DamagedCheckpoint(f"checkpoint {path} is damaged: its sha256 {have[:12]}... differs from the "
                                f"recorded {want[:12]}...")
    if (key := checkpoint_key()) is not None:
        try:
            signed = hmac_path(path).read_text().split()[0]
        except (OSError, IndexError):
            signed = ""
        if not hmac.compare_digest(signed, _hmac_of(path, key)):
            what = "has no HMAC file" if not signed else "fails its HMAC"
            raise ForgedCheckpoint(f"checkpoint {path} {what} under {KEY_ENV}: it was not written by a run holding "
                                   "this key (forged, or signed with another key); refused")


def check_restored(ckpt: Checkpoint, path: str | Path) -> None:
    """ValueError (one line) unless the model is finite, the counts one per client, the history records."""
    for name, a in ckpt.arrays.items():
        if not isinstance(a, np.ndarray) or (a.dtype.kind in "fc" and not np.isfinite(a).all()):
            raise ValueError(f"{path}: model array {name!r} is not a finite array")
    if (bad := _non_finite_in(ckpt.averaged_iterate, "averaged_iterate", inf_ok=False)) is not None:
        raise ValueError(f"{path}: the averaged iterate is not finite ({bad})")
    counts = np.asarray(ckpt.times_sampled)
    if (not isinstance(ckpt.num_clients, int) or counts.shape != (ckpt.num_clients,) or counts.dtype.kind not in "iu"
            or (counts < 0).any()):
        raise ValueError(f"{path}: times_sampled is not one count >= 0 per client ({ckpt.num_clients} clients)")
    if (not isinstance(ckpt.round, int) or ckpt.round < 0 or not isinstance(ckpt.history, list)
            or not all(isinstance(r, dict) for r in ckpt.history)):
        raise ValueError(f"{path}: its round or history is malformed")
    bad = _non_finite_in(ckpt.strategy)
    if bad:
        raise ValueError(f"{path}: the strategy state holds a NaN array ({bad})")


def _non_finite_in(tree: Any, where: str = "state", inf_ok: bool = True) -> str | None:
    """The path of the first array (or float) holding a NaN (or, unless ``inf_ok``, an inf: a
    strategy's state may use inf as a sentinel) in a loaded tree, else None."""
    torch = sys.modules.get("torch")  # no tensor exists unless torch was imported
    if torch is not None and isinstance(tree, torch.Tensor):
        tree = tree.detach().float().numpy() if tree.dtype.is_floating_point else None
    bad = np.isnan if inf_ok else (lambda a: ~np.isfinite(a))
    if isinstance(tree, np.ndarray):
        return where if tree.dtype.kind in "fc" and tree.size and bad(tree).any() else None
    if isinstance(tree, float):
        return where if (math.isnan(tree) if inf_ok else not math.isfinite(tree)) else None
    items = (tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ())
    for k, v in items:
        if (found := _non_finite_in(v, f"{where}.{k}", inf_ok)) is not None:
            return found
    return None


def load(path: str | Path) -> Checkpoint:
    """Load one checkpoint file after verifying its checksum; raises on a damaged or foreign file."""
    import torch

    from fedcore.state import from_tree

    verify(path)
    raw = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(raw, dict) and raw.get("format") == 2:
        raw = from_format_2(raw, path)
    if isinstance(raw, dict) and raw.get("format") == 3:
        raw = from_format_3(raw)
    if isinstance(raw, dict) and raw.get("format") == 4:
        raw = from_format_4(raw, path)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint of format {FORMAT}")
    ckpt = Checkpoint(**{f.name: from_tree(raw[f.name]) for f in dataclasses.fields(Checkpoint)
                         if f.name in raw or f.default is dataclasses.MISSING})
    missing = [name for name in ("config", "reply_trust") if not isinstance(getattr(ckpt, name), dict)
               or not getattr(ckpt, name)]
    if missing:  # files of an earlier version: what a resume compares and continues from is not there
        raise ValueError(f"{path} was written by an earlier version of this app (no {' or '.join(missing)} in it): "
                         "it cannot be resumed; start a new run")
    check_restored(ckpt, path)
    return ckpt


def from_format_2(raw: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A checkpoint of format 2 (before the run state was saved whole) as format 3: the one
    conversion an earlier file goes through. Format 2 lacks the run's warnings and the divergence
    watch's streaks: the resumed run starts them anew (said in the log), everything else is as saved."""
    log.warning("%s is a checkpoint of the earlier format 2: it holds no warnings and no divergence counts; the "
                "resumed run starts them anew (its other state is restored as saved)", path)
    return {**raw, "format": 3, "warnings": [], "watch": dict(FRESH_WATCH)}


def from_format_3(raw: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint of format 3 as format 4: central DP's state (its field ``privacy``) moved inside
    the method's state (:class:`strategies.privacy.State`: the method's own state and the clipping
    norm), where the transform around the method keeps it now. Nothing else changes."""
    out = {k: v for k, v in raw.items() if k != "privacy"}
    privacy = raw.get("privacy")
    if privacy is not None:
        from fedcore.state import from_tree, to_tree
        from strategies.privacy import State

        norm = float(from_tree(privacy)["clipping_norm"])
        out["strategy"] = to_tree(State(from_tree(raw["strategy"]), norm))
    return {**out, "format": 4}


def from_format_4(raw: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A checkpoint of format 4 as format 5: format 4 lacks the drop streak (rounds in a row whose
    every reply was dropped) and the resumes; the resumed run starts the streak anew (said in the
    log), everything else is as saved."""
    log.warning("%s is a checkpoint of the earlier format 4: it holds no drop streak; the resumed run counts the "
                "rounds whose every reply is dropped anew (its other state is restored as saved)", path)
    return {**raw, "format": FORMAT, "streak": dict(FRESH_STREAK), "resumes": []}


def latest(folder: str | Path) -> Checkpoint:
    """The newest checkpoint in ``folder`` that loads; damaged ones are skipped with a warning."""
    found = rounds_in(folder)
    for server_round in reversed(found):
        path = path_for(folder, server_round)
        try:
            return load(path)
        except DamagedCheckpoint as exc:
            log.warning("%s; refused, trying an older one", exc)
        except Exception as exc:  # noqa: BLE001 - a damaged file falls back to the previous one
            log.warning("checkpoint %s is damaged: it cannot be loaded (%s: %s); refused, trying an older one",
                        path, type(exc).__name__, exc)
    what = "none loads" if found else "none found"
    raise ConfigError(
        f"run-config key 'resume-from' = '{folder}': no checkpoint ({what} in {checkpoint_dir(folder)}); "
        "give the output-dir of a run with checkpoint-every > 0"
    )


def check_rounds_left(folder: str | Path, checkpoint_round: int, num_server_rounds: int) -> None:
    """ConfigError (one line) when the checkpoint of ``checkpoint_round`` leaves no round to run."""
    if checkpoint_round >= num_server_rounds:
        raise ConfigError(
            f"run-config key 'num-server-rounds' = {num_server_rounds}: the checkpoint in "
            f"{folder} is already at round {checkpoint_round}; set num-server-rounds above {checkpoint_round}"
        )


def allowed_changes(value: Any) -> set[str]:
    """``resume-allow-changes``: the listed keys (comma-separated)."""
    return {k.strip() for k in str(value or "").split(",") if k.strip()}


def check_config(ckpt: Checkpoint, config: dict[str, Any], allow: set[str] = frozenset()) -> None:
    """One-line :class:`ConfigError` naming every training or data key whose value differs from
    the checkpoint's run config (keys in ``allow`` and :data:`NOT_COMPARED` are not compared).
    """
    keys = sorted(set(ckpt.config) - NOT_COMPARED - set(allow))  # a key newer than the checkpoint: not known
    changed = [k for k in keys if ckpt.config.get(k) != config.get(k)]
    if changed:
        shown = ", ".join(f"{k} {ckpt.config.get(k)!r} -> {config.get(k)!r}" for k in changed[:6])
        more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
        raise ConfigError(
            f"run-config key(s) {', '.join(repr(k) for k in changed)} differ from the checkpoint of round "
            f"{ckpt.round} ({shown}{more}): resume with the same values, or list them in "
            f"resume-allow-changes='{','.join(changed)}' to continue on purpose with the new ones"
        )


def check_compatible(ckpt: Checkpoint, method: str, seed: int, num_clients: int,
                     arrays: dict[str, np.ndarray], params: dict[str, Any] | None = None,
                     allow: set[str] = frozenset()) -> None:
    """Raise a one-line :class:`ConfigError` unless ``ckpt`` continues this run's setting."""
    for key, want in (params or {}).items():
        if key in allow:
            continue
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


def write_cause(exc: BaseException) -> str:
    """An OSError's strerror and errno name, or a RuntimeError's first line."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'write failed'}"
