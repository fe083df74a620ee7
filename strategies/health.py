"""Nothing fails silently: rounds in which every reply was dropped for the same reason.

A foreign ClientApp that does not send what a method needs (FedeRage's ``federage-beta``,
AFL's ``loss-before``, SCAFFOLD's control-variate record) has every reply dropped, every
round, for the same reason; so has a federation whose clients all crash. The model then never
moves. :class:`DropStreak` watches the rounds: the first such round logs the reason at ERROR
once, with the client piece that sends the missing field and how to add it; after
:data:`DROP_STREAK_LIMIT` such rounds in a row the round's outcome carries a
:class:`NoTrainingError` with that line, so ``Strategy.start`` raises it and the app's run
ends failed (``complete: false``, ``incomplete_reason``), never a normal finish with the
untrained model. A round with a valid reply resets the count. The streak is run state: the app
keeps it in its run state and checkpoints it (:meth:`DropStreak.as_dict`), so a resumed run ends
where the uninterrupted one would; a strategy started by Flower's loop keeps its own.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence

log = logging.getLogger("fedpcd")

#: Rounds in a row with every reply dropped for the same reason before the run is ended.
DROP_STREAK_LIMIT = 3

_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_MISSING = re.compile(r"missing (?:metric|record|array(?:record)?) '([^']+)'", re.IGNORECASE)


class NoTrainingError(RuntimeError):
    """Every reply of several rounds in a row was dropped for the same reason: nothing trains."""


def reason_kind(reason: str) -> str:
    """A drop reason with its numbers masked: replies dropped 'for the same reason' share it."""
    return _NUMBER.sub("#", reason)


def missing_field(reason: str) -> str | None:
    """The reply field a reason says is missing (``missing metric 'federage-beta'`` → ``federage-beta``)."""
    match = _MISSING.search(reason)
    return match.group(1) if match else None


def client_hint(method: str, reason: str) -> str:
    """What to change on the clients: the method's documented client piece when the reason is a
    field the clients did not send (:func:`fedcore.client_pieces.how_to_send`), else where to look."""
    from fedcore.client_pieces import how_to_send

    field = missing_field(reason)
    line = how_to_send(method, reason) if field is not None else None
    if line is not None:
        return line
    if field is not None:
        return f"the clients must send '{field}' (docs/library.md: the client side of each method)"
    return "see the clients' logs and the drop reasons in the round's record"


@dataclasses.dataclass
class DropStreak:
    """Rounds in a row whose every reply was dropped for one reason (see the module docstring)."""

    limit: int = DROP_STREAK_LIMIT
    kind: str | None = None
    rounds: int = 0

    def observe(self, method: str, server_round: int, valid: int, reasons: Sequence[str]) -> NoTrainingError | None:
        """One round: ``valid`` replies kept, ``reasons`` of the dropped ones. The error that ends
        the run once the streak reaches :attr:`limit` (None otherwise)."""
        kinds = {reason_kind(r) for r in reasons}
        if valid or len(kinds) != 1:
            self.kind, self.rounds = None, 0
            return None
        kind = kinds.pop()
        self.rounds = self.rounds + 1 if kind == self.kind else 1
        self.kind = kind
        line = (f"{method}: every reply of round {server_round} was dropped ({len(reasons)} of {len(reasons)}): "
                f"{reasons[0]}; {client_hint(method, reasons[0])}")
        if self.rounds == 1:
            log.error("%s (the run ends after %d such rounds in a row)", line, self.limit)
        if self.rounds >= self.limit:
            return NoTrainingError(f"{line} ({self.rounds} rounds in a row: nothing trained)")
        return None

    def as_dict(self) -> dict:
        """The streak so far (the app checkpoints it with its run state; the limit is the run's)."""
        return {"kind": self.kind, "rounds": int(self.rounds)}

    @classmethod
    def from_dict(cls, raw) -> DropStreak:
        """Rebuilt from :meth:`as_dict` (a checkpoint); anything else is refused in one line."""
        try:
            kind, rounds = raw["kind"], int(raw["rounds"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint's drop streak is unreadable ({type(exc).__name__}: {exc})") from None
        if rounds < 0 or (kind is None) != (rounds == 0) or not (kind is None or isinstance(kind, str)):
            raise ValueError("checkpoint's drop streak holds a negative count or a count without its reason")
        return cls(kind=kind, rounds=rounds)
