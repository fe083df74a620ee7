"""Which partitions train in which round: the server's own seeded sampler.

The draw of round t depends only on (seed, t) — not on the method, nor on what happened
in earlier rounds — so every method under one seed sees the same clients in the same
rounds, and a run resumed at round k draws exactly what the uninterrupted run drew.
"""

from __future__ import annotations

import numpy as np

from fedpcd_app.config import RunConfig
from fedpcd_app.seeding import numpy_rng


class Sampler:
    """Uniform sampling of ``round(fraction-train · N)`` partition ids without replacement."""

    def __init__(self, cfg: RunConfig, available: list[int] | None = None) -> None:
        self.cfg = cfg
        self.available = np.array(sorted(available if available is not None else range(cfg.num_clients)))
        self.per_round = min(cfg.clients_per_round, len(self.available))

    def sample(self, server_round: int) -> list[int]:
        rng = numpy_rng(self.cfg.seed, "sample", server_round)
        picked = rng.choice(len(self.available), size=self.per_round, replace=False)
        return sorted(int(p) for p in self.available[picked])

    def describe(self) -> str:
        return f"uniform, {self.per_round} of {len(self.available)} per round"


def build_sampler(cfg: RunConfig, available: list[int] | None = None) -> Sampler:
    return Sampler(cfg, available)
