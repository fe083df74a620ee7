"""SCAFFOLD (Karimireddy et al., ICML 2020), option II: control variates against client drift.

Clients (``client_app.methods.scaffold``) take corrected steps g − c_i + c and return
their model y_i and Δc_i. The server, with Δy_i = y_i − θ_t:

    θ ← θ + η_g · mean_i Δy_i,    c ← c + (|S|/N) · mean_i Δc_i = c + (1/N) Σ_i Δc_i

η_g is ``server-lr``/η_l (default, server-lr = 0: η_g = 1, the plain mean of the y_i).

State (all explicit, in :meth:`state_dict`): the server control variate c, and a mirror of
every client's c_i kept exactly from the Δc_i replies (c_i ← c_i + Δc_i in float32, the
same sum the client stores). Clients keep c_i in their context state, which a restarted
run loses; so after :meth:`load_state_dict` the strategy sends each client its mirrored
c_i (record ``scaffold-c-i``) the next time it is sampled, until a reply from it arrives.
"""

from __future__ import annotations

import torch

from client_app.methods.scaffold import C_CLIENT, C_GLOBAL, DELTA_C
from fedcore import flat
from strategies.base import FairStrategy, RoundPlan, unpack_replies
from strategies.registry import register


def scaffold_server_step(theta: torch.Tensor, local: torch.Tensor, delta_c: torch.Tensor,
                         c: torch.Tensor, num_clients: int, server_step: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(θ + η_g·mean(y_i − θ), c + (1/N)·Σ Δc_i) for (m, d) ``local`` and ``delta_c``."""
    new_theta = theta + server_step * (local.mean(dim=0) - theta)
    new_c = c + delta_c.sum(dim=0) / num_clients
    return new_theta, new_c


class ScaffoldStrategy(FairStrategy):
    client_method = "scaffold"
    # The update needs only sums, but the exact c_i mirror (for resume) needs each Δc_i.
    needs_individual_updates = True
    required_records = (DELTA_C,)

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.c: torch.Tensor | None = None  # server control variate (d,), zeros at start
        self.client_c: dict[int, torch.Tensor] = {}  # partition id -> mirrored c_i
        self.pending_restore: set[int] = set()  # clients that must be sent their c_i

    def begin_round(self, server_round, arrays):
        super().begin_round(server_round, arrays)
        if self.c is None:
            self.c = torch.zeros(self.spec.dim)
        return RoundPlan(
            records={C_GLOBAL: self.to_record(self.c)},
            client_records={pid: {C_CLIENT: self.to_record(self.client_c[pid])} for pid in self.pending_restore},
        )

    def aggregate_train(self, server_round, replies):
        from flwr.app import MetricRecord

        replies = list(replies)
        batch = unpack_replies(replies)
        delta_c = flat.records_to_matrix([r.content[DELTA_C] for r in replies])
        theta = self.current_flat()
        step = (self.cfg.server_lr / self.round_lr(server_round)) if self.cfg.server_lr else 1.0
        new_theta, self.c = scaffold_server_step(theta, batch.local, delta_c, self.c, self.cfg.num_clients, step)
        for pid, dc in zip(batch.partition_ids, delta_c):
            self.client_c[pid] = self.client_c.get(pid, torch.zeros_like(dc)) + dc
            self.pending_restore.discard(pid)
        return self.to_record(new_theta), MetricRecord({
            "update-norm": float((new_theta - theta).norm()),
            "scaffold-c-norm": float(self.c.norm()),
        })

    def state_dict(self):
        ids = sorted(self.client_c)
        return {
            "c": None if self.c is None else self.c.clone(),
            "client_ids": ids,
            "client_c": torch.stack([self.client_c[i] for i in ids]) if ids else torch.zeros(0),
        }

    def load_state_dict(self, state):
        self.c = None if state["c"] is None else torch.as_tensor(state["c"], dtype=torch.float32).clone()
        rows = torch.as_tensor(state["client_c"], dtype=torch.float32)
        self.client_c = {int(pid): rows[k].clone() for k, pid in enumerate(state["client_ids"])}
        self.pending_restore = set(self.client_c)


@register("scaffold")
def build(cfg):
    return ScaffoldStrategy(cfg)
