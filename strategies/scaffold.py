"""SCAFFOLD (Karimireddy et al., ICML 2020), option II: control variates against client drift.

Clients (``client_app.methods.scaffold``) take corrected steps g − c_i + c and return
their model y_i and Δc_i. The server, with Δy_i = y_i − θ_t:

    θ ← θ + η_g · mean_i Δy_i,    c ← c + (|S|/N) · mean_i Δc_i = c + (1/N) Σ_i Δc_i

η_g is ``server-lr``/η_l (default, server-lr = 0: η_g = 1, the plain mean of the y_i).

No hyperparameters of its own; N is ``num_clients`` (the federation's size; None = the
number of connected nodes at sampling time). It reads ``num-steps`` (K_i) beside Δc_i: the
bound on Δc_i is set from it (:meth:`ScaffoldMethod.check`).

State (:class:`State`, checkpointed generically): the server control variate c, a mirror
of every client's c_i kept exactly from the Δc_i replies (c_i ← c_i + Δc_i in float32, the
same sum the client stores), and the clients still owed their c_i. Clients keep c_i in
their context state, which a restarted run loses; so after a restore (:meth:`ScaffoldMethod.restored`)
the strategy sends each client its mirrored c_i (record ``scaffold-c-i``) the next time it
is sampled, until a reply from it arrives. The same for one client whose SuperNode restarted
(:meth:`ScaffoldMethod.node_changed`). Record names are in :mod:`fedcore.keys`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from fedcore import flat, keys
from fedcore.params import NoParams
from strategies.base import Method, Reads, Request, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register

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


class ScaffoldMethod(Method):
    """SCAFFOLD's server (see the module docstring); clients run ``client_app.methods.scaffold``."""

    Params = NoParams
    weighting = "uniform"  # θ + η_g · mean Δy_i
    client_method = keys.SCAFFOLD
    # The update needs only sums, but the exact c_i mirror (for resume) needs each Δc_i.
    needs_individual_updates = True

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(num_steps=True, records=(keys.SCAFFOLD_DELTA_C,))

    def init(self) -> State:
        return State()

    def restored(self, state: State) -> State:
        """After a resume: every mirrored client is owed its c_i."""
        return dataclasses.replace(state, pending_restore=set(state.client_c))

    def node_changed(self, state: State, client: int) -> State:
        """A client on a new node lost its c_i: send it the mirrored one (as after a restore)."""
        if client not in state.client_c:
            return state
        return dataclasses.replace(state, pending_restore={*state.pending_restore, client})

    @staticmethod
    def control(state: State, d: int) -> torch.Tensor:
        """c, zeros before the first round."""
        return state.c if state.c is not None else torch.zeros(d)

    def request(self, server_round: int, state: State, current) -> Request:
        spec = flat.spec_of(current)
        return Request(records={keys.SCAFFOLD_C: flat.flat_to_record(self.control(state, spec.dim), spec)})

    def client_records(self, state: State, client, current):
        if client in state.pending_restore:
            return {keys.SCAFFOLD_C_CLIENT: flat.flat_to_record(state.client_c[client], flat.spec_of(current))}
        return {}

    def check(self, round_: Round, state: State) -> dict[int, str]:
        """Δc_i bounded by the client's own accepted update: option II gives
        Δc_i = (θ_t − y_i)/(K_i η_l) − c on the parameters (0 − c_i = 0 elsewhere), so an honest
        ‖Δc_i‖ ≤ ‖c‖ + ‖θ_t − y_i‖/(K_i η_l) (K_i its num-steps); a reply above
        :data:`DELTA_C_SLACK` × that is dropped (a huge or scaled Δc would move c for every client)."""
        theta = round_.theta_as(torch.float64)
        c_norm = float(self.control(state, theta.numel()).double().norm())
        out = {}
        for i, (dc_record, model) in enumerate(zip(round_.records[keys.SCAFFOLD_DELTA_C], round_.models)):
            dc = float(flat.record_to_flat(dc_record, dtype=torch.float64).norm())
            dy = float((theta - flat.record_to_flat(model, dtype=torch.float64)).norm())
            k = float(round_.value(keys.NUM_STEPS)[i])
            k = int(k) if math.isfinite(k) and k >= 1 else 1
            bound = DELTA_C_SLACK * (c_norm + dy / (k * round_.lr)) + 1e-6
            if not dc <= bound:
                out[i] = (f"record '{keys.SCAFFOLD_DELTA_C}' has norm {dc:.3g}, above {bound:.3g} = "
                          f"{DELTA_C_SLACK:g} x (‖c‖ + ‖θ_t − y_i‖/(K_i η_l)), what its own update allows")
        return out

    def aggregate(self, round_: Round, state: State) -> Step:
        delta_c = round_.record_matrix(keys.SCAFFOLD_DELTA_C)
        theta = round_.theta
        n = self.setting.num_clients or round_.num_nodes
        if n is None:
            raise RuntimeError("Scaffold needs num_clients (N) or a configure_train() that saw the nodes")
        new_theta, c = scaffold_server_step(theta, round_.model_matrix, delta_c, self.control(state, theta.numel()), n,
                                            round_.step_scale)
        client_c, pending = dict(state.client_c), set(state.pending_restore)
        for pid, dc in zip(round_.clients, delta_c):
            client_c[pid] = client_c.get(pid, torch.zeros_like(dc)) + dc
            pending.discard(pid)
        return Step(new_theta, State(c, client_c, pending), {
            "update-norm": float((new_theta - theta).norm()),
            "scaffold-c-norm": float(c.norm()),
        })


@register("scaffold")
class Scaffold(FairStrategy):
    """SCAFFOLD (see the module docstring): ``Scaffold(num_clients=100, fraction_train=0.1)``; its
    clients run ``client_app.methods.scaffold`` (a foreign ClientApp: ``client_app.foreign.ClientSide``)."""

    method_class = ScaffoldMethod
    Params = NoParams

    def __init__(self, *, params: NoParams | None = None, **common: Any) -> None:
        super().__init__(method_params(NoParams, params, "Scaffold"), **common)
