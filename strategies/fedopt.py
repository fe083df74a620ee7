"""Server optimisers on the FedAvg pseudo-gradient: FedAvgM (Hsu, Qi, Brown, 2019,
arXiv:1909.06335) and FedAdam / FedYogi / FedAdagrad (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021).

Flower ships all four in ``flwr.serverapp.strategy``; this module wraps them instead of
rewriting them. The wrapped strategy aggregates the validated replies exactly as Flower
does; :meth:`begin_round` hands it θ_t (Flower's own ``configure_train`` would, but the
rounds here are driven by ``fedpcd_app.server_app``), and its moments are the checkpoint
state. With Δ = avg θ_i − θ_t (Flower's sign) and p_i = n_i / Σ n_j:

* FedAvgM: v ← β v + (θ_t − avg θ_i) (v = the first pseudo-gradient in round 1),
  θ ← θ − η_s v.
* FedAdam: m ← β₁m + (1−β₁)Δ, v ← β₂v + (1−β₂)Δ², θ ← θ + η̂ m / (√v + τ) with Flower's
  bias-corrected η̂ = η √(1−β₂^(t+1)) / (1−β₁^(t+1)).
* FedYogi: as FedAdam with v ← v − (1−β₂) Δ² sign(v − Δ²) and no bias correction.
* FedAdagrad: m = Δ, v ← v + Δ², θ ← θ + η m / (√v + τ).

Hyperparameters (defaults: FedAvgM β from Hsu et al., the rest Flower's)
---------------
fedavgm-server-lr : float, default 1.0 — η_s > 0.
fedavgm-momentum : float, default 0.9 — β ∈ [0, 1); β = 0 with η_s = 1 is FedAvg.
fedadam-eta 0.1, fedadam-beta1 0.9, fedadam-beta2 0.99, fedadam-tau 0.001.
fedyogi-eta 0.01, fedyogi-beta1 0.9, fedyogi-beta2 0.99, fedyogi-tau 0.001.
fedadagrad-eta 0.1, fedadagrad-tau 0.001.
η > 0, β ∈ [0, 1), τ > 0 (the adaptivity floor: large τ makes FedAdagrad plain SGD on Δ).
"""

from __future__ import annotations

import numpy as np

from fedcore import flat
from strategies.base import FairStrategy
from strategies.registry import register


def _no_metrics(contents, weighted_by_key):
    """Flower would average every reply metric (partition ids included): report none."""
    from flwr.app import MetricRecord

    del contents, weighted_by_key
    return MetricRecord()


def _copy_arrays(arrays) -> list[np.ndarray] | dict[str, np.ndarray] | None:
    if arrays is None:
        return None
    if isinstance(arrays, dict):
        return {k: np.array(v, copy=True) for k, v in arrays.items()}
    return [np.array(v, copy=True) for v in arrays]


class FlowerServerOpt(FairStrategy):
    """A Flower server-optimiser strategy behind the FairStrategy protocol."""

    # Only the weighted mean of the local models enters: works under secure aggregation.
    needs_individual_updates = False

    def __init__(self, cfg, inner) -> None:
        super().__init__(cfg)
        self.inner = inner

    def begin_round(self, server_round, arrays):
        plan = super().begin_round(server_round, arrays)
        self.inner.current_arrays = self._inner_view(arrays)
        return plan

    def _inner_view(self, arrays):
        """θ_t in the form the wrapped strategy keeps it."""
        raise NotImplementedError

    def aggregate_train(self, server_round, replies):
        from flwr.app import MetricRecord

        new_arrays, _ = self.inner.aggregate_train(server_round, list(replies))
        if new_arrays is None:
            return None, None
        theta = self.current_flat()
        # Flower's arithmetic can promote to float64: back to the model's own dtypes.
        new = flat.record_to_flat(new_arrays)
        return self.to_record(new), MetricRecord({"update-norm": float((theta - new).norm())})


class FedAvgMStrategy(FlowerServerOpt):
    """Flower's FedAvgM (state: its momentum vector)."""

    def _inner_view(self, arrays):
        return arrays

    def state_dict(self):
        return {"momentum_vector": _copy_arrays(self.inner.momentum_vector)}

    def load_state_dict(self, state):
        self.inner.momentum_vector = _copy_arrays(state["momentum_vector"])


class FedOptStrategy(FlowerServerOpt):
    """Flower's FedAdam / FedYogi / FedAdagrad (state: the moments m_t, v_t)."""

    def _inner_view(self, arrays):
        return {k: a.numpy() for k, a in arrays.items()}

    def state_dict(self):
        return {"m_t": _copy_arrays(self.inner.m_t), "v_t": _copy_arrays(self.inner.v_t)}

    def load_state_dict(self, state):
        self.inner.m_t = _copy_arrays(state["m_t"])
        self.inner.v_t = _copy_arrays(state["v_t"])


def _eta(cfg, method):
    return cfg.get_float(f"{method}-eta", low=0.0, low_open=True)


def _beta(cfg, key):
    value = cfg.get_float(key, low=0.0)
    if value >= 1.0:
        from fedcore.config import ConfigError

        raise ConfigError(f"run-config key '{key}' = {value} must be < 1")
    return value


def _tau(cfg, method):
    return cfg.get_float(f"{method}-tau", low=0.0, low_open=True)


@register("fedavgm")
def build_fedavgm(cfg):
    from flwr.serverapp.strategy import FedAvgM

    inner = FedAvgM(
        server_learning_rate=cfg.get_float("fedavgm-server-lr", low=0.0, low_open=True),
        server_momentum=_beta(cfg, "fedavgm-momentum"),
        train_metrics_aggr_fn=_no_metrics,
    )
    return FedAvgMStrategy(cfg, inner)


@register("fedadam")
def build_fedadam(cfg):
    from flwr.serverapp.strategy import FedAdam

    inner = FedAdam(
        eta=_eta(cfg, "fedadam"), eta_l=cfg.lr, beta_1=_beta(cfg, "fedadam-beta1"),
        beta_2=_beta(cfg, "fedadam-beta2"), tau=_tau(cfg, "fedadam"), train_metrics_aggr_fn=_no_metrics,
    )
    return FedOptStrategy(cfg, inner)


@register("fedyogi")
def build_fedyogi(cfg):
    from flwr.serverapp.strategy import FedYogi

    inner = FedYogi(
        eta=_eta(cfg, "fedyogi"), eta_l=cfg.lr, beta_1=_beta(cfg, "fedyogi-beta1"),
        beta_2=_beta(cfg, "fedyogi-beta2"), tau=_tau(cfg, "fedyogi"), train_metrics_aggr_fn=_no_metrics,
    )
    return FedOptStrategy(cfg, inner)


@register("fedadagrad")
def build_fedadagrad(cfg):
    from flwr.serverapp.strategy import FedAdagrad

    inner = FedAdagrad(eta=_eta(cfg, "fedadagrad"), eta_l=cfg.lr, tau=_tau(cfg, "fedadagrad"),
                       train_metrics_aggr_fn=_no_metrics)
    return FedOptStrategy(cfg, inner)
