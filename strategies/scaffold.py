"""SCAFFOLD (Karimireddy et al., ICML 2020), option II: control variates against client drift.

Clients (``client_app.methods.scaffold``) take corrected steps g − c_i + c and return
their model y_i and Δc_i. The server, with Δy_i = y_i − θ_t:

    θ ← θ + η_g · mean_i Δy_i,    c ← c + (|S|/N) · mean_i Δc_i = c + (1/N) Σ_i Δc_i

η_g is ``server-lr``/η_l (default, server-lr = 0: η_g = 1, the plain mean of the y_i).

No hyperparameters of its own; N is ``num_clients`` (the federation's size; None = the
number of connected nodes at sampling time).

State (:class:`State`, checkpointed generically): the server control variate c, a mirror
of every client's c_i kept exactly from the Δc_i replies (c_i ← c_i + Δc_i in float32, the
same sum the client stores), and the clients still owed their c_i. Clients keep c_i in
their context state, which a restarted run loses; so after a restore (:meth:`Scaffold.on_restored`)
the strategy sends each client its mirrored c_i (record ``scaffold-c-i``) the next time it
is sampled, until a reply from it arrives. The same for one client whose SuperNode restarted
(:meth:`Scaffold.on_node_changed`). Record names are in :mod:`fedcore.keys`.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from flwr.app import MetricRecord

from fedcore import flat, keys
from strategies.base import FairStrategy
from strategies.registry import register
from strategies.rounds import Aggregated

# Honest Δc_i meet their bound exactly up to float32 rounding: 5 % covers that and nothing more.
DELTA_C_SLACK = 1.05


@dataclasses.dataclass
class State:
    c: torch.Tensor | None = None  # server control variate (d,), zeros until the first round
    client_c: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # partition id → mirrored c_i
    pending_restore: set[int] = dataclasses.field(default_factory=set)  # clients to be sent their c_i


def scaffold_server_step(theta: torch.Tensor, local: torch.Tensor, delta_c: torch.Tensor,
                         c: torch.Tensor, num_clients: int, server_step: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(θ + η_g·mean(y_i − θ), c + (1/N)·Σ Δc_i) for (m, d) ``local`` and ``delta_c``."""
    new_theta = theta + server_step * (local.mean(dim=0) - theta)
    new_c = c + delta_c.sum(dim=0) / num_clients
    return new_theta, new_c


@register("scaffold")
class Scaffold(FairStrategy):
    """SCAFFOLD's server (see the module docstring); clients run ``client_app.methods.scaffold``."""

    weighting = "uniform"  # θ + η_g · mean Δy_i

    client_method = keys.SCAFFOLD
    # The update needs only sums, but the exact c_i mirror (for resume) needs each Δc_i.
    needs_individual_updates = True
    required_records = (keys.SCAFFOLD_DELTA_C,)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_nodes: int | None = None  # N when num_clients is None (seen at sampling)

    State = State

    def on_restored(self) -> None:
        """After ``self.state`` is assigned from a checkpoint: every mirrored client is owed its c_i."""
        self.state.pending_restore = set(self.state.client_c)

    def on_node_changed(self, client: int) -> None:
        """A client on a new node lost its c_i: send it the mirrored one (as after a restore)."""
        if client in self.state.client_c:
            self.state.pending_restore.add(client)

    def configure_train(self, server_round, arrays, config, grid, context=None):
        if self.num_clients is None:
            self.num_nodes = len(list(grid.get_node_ids()))
        return super().configure_train(server_round, arrays, config, grid, context)

    def _c(self) -> torch.Tensor:
        if self.state.c is None:
            self.state.c = torch.zeros(self.spec.dim)
        return self.state.c

    def round_records(self, server_round):
        return {keys.SCAFFOLD_C: self.to_record(self._c())}

    def client_records(self, client):
        if client in self.state.pending_restore:
            return {keys.SCAFFOLD_C_CLIENT: self.to_record(self.state.client_c[client])}
        return {}

    def check_valid(self, server_round, replies):
        """Δc_i bounded by the client's own accepted update: option II gives
        Δc_i = (θ_t − y_i)/(K_i η_l) − c on the parameters (0 − c_i = 0 elsewhere), so an honest
        ‖Δc_i‖ ≤ ‖c‖ + ‖θ_t − y_i‖/(K_i η_l) (K_i its num-steps, at least 1); a reply above
        :data:`DELTA_C_SLACK` × that is dropped (a huge or scaled Δc would move c for every client)."""
        theta = self.current_flat(torch.float64)
        c_norm = float(self._c().double().norm())
        lr = self.round_lr(server_round)
        out = {}
        for i, reply in enumerate(replies):
            dc = float(flat.record_to_flat(reply.content[keys.SCAFFOLD_DELTA_C], dtype=torch.float64).norm())
            dy = float((theta - flat.record_to_flat(reply.content[keys.ARRAYS], dtype=torch.float64)).norm())
            k = reply.content[keys.METRICS].get(keys.NUM_STEPS, 1)
            k = int(k) if isinstance(k, (int, float)) and math.isfinite(k) and k >= 1 else 1
            bound = DELTA_C_SLACK * (c_norm + dy / (k * lr)) + 1e-6
            if not dc <= bound:
                out[i] = (f"record '{keys.SCAFFOLD_DELTA_C}' has norm {dc:.3g}, above {bound:.3g} = "
                          f"{DELTA_C_SLACK:g} x (‖c‖ + ‖θ_t − y_i‖/(K_i η_l)), what its own update allows")
        return out

    def aggregate_valid(self, server_round, replies):
        st = self.state
        batch = self.read_updates(replies)
        delta_c = flat.records_to_matrix([r.content[keys.SCAFFOLD_DELTA_C] for r in replies])
        theta = batch.theta
        n = self.num_clients or self.num_nodes
        if n is None:
            raise RuntimeError("Scaffold needs num_clients (N) or a configure_train() that saw the nodes")
        new_theta, st.c = scaffold_server_step(theta, batch.models, delta_c, self._c(), n,
                                               self.step_scale(server_round))
        for pid, dc in zip(batch.partition_ids, delta_c):
            st.client_c[pid] = st.client_c.get(pid, torch.zeros_like(dc)) + dc
            st.pending_restore.discard(pid)
        return Aggregated(self.to_record(new_theta), MetricRecord({
            "update-norm": float((new_theta - theta).norm()),
            "scaffold-c-norm": float(st.c.norm()),
        }))
