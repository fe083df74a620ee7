"""Central differential privacy around a sum-only method: Flower's server-side clipping wrappers.

``dp = "fixed"`` runs the method's aggregation inside Flower's
``DifferentialPrivacyServerSideFixedClipping`` (McMahan et al., ICLR 2018, arXiv:1710.06963),
``dp = "adaptive"`` inside ``DifferentialPrivacyServerSideAdaptiveClipping`` (Andrew et al.,
NeurIPS 2021, arXiv:1905.03871). Each round:

1. every update θ_i − θ_t is scaled to norm ≤ C (the clipping norm);
2. the inner strategy aggregates the clipped replies as usual (its :meth:`aggregate_valid`);
3. Gaussian noise N(0, σ² I) is added to the aggregated model, σ = z·C/m (Flower's
   ``compute_stdv``; z the noise multiplier, m the round's valid replies);
4. adaptive only: C ← C·exp(−η_C (b̃ − q)), b̃ the fraction of updates not clipped plus
   N(0, σ_b²/m²) count noise (σ_b = ``dp-clipped-count-stddev``, 0 = Flower's default
   clients-per-round / 20), q the target quantile of the update norms (Andrew et al.'s γ: C
   settles where a fraction q of the updates fits under it); z is raised to
   z' = (z⁻² − (2σ_b)⁻²)^(−1/2) to pay for the count (so z < 2σ_b is required). Flower 1.42
   moves C the other way (it counts the *clipped* updates): :class:`_AdaptiveClipping` keeps
   Flower's wrapper and corrects that one step.

Only for methods whose aggregate is a weighted sum of the replies (``needs_individual_updates``
False; :func:`check` refuses the others): σ = z·C/m is the Gaussian mechanism's calibration
for a uniform mean of clipped updates (FedeRage's average; FedAvg's when the clients hold
equal amounts of data — with example weights p_i a client's sensitivity is max p_i·C, not
C/m). For Flower's server optimisers (FedAvgM, FedAdam, ...) the noise lands on the
optimiser's output, as when Flower's wrapper wraps them. No privacy accountant runs (ε is
not computed: Flower's accountant needs the ``dp-accounting`` package, not a dependency);
every round's z, C, σ and clipped count are in rounds.jsonl under ``privacy``.

Flower draws the noise from NumPy's global generator: it is seeded from (seed, round) for
each aggregation and restored after, so runs and resumed runs are reproducible. The adaptive
clipping norm is this wrapper's only state (:class:`State`), checkpointed with the run.

"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from flwr.serverapp import strategy as flower
from flwr.supercore.differential_privacy import compute_stdv

from fedcore import flat, keys
from fedcore.config import ConfigError
from fedcore.params import MethodParams, hyper
from fedcore.seeding import derive_seed
from fedcore.state import Fields, rebuild
from strategies.rounds import Aggregated
from strategies.updates import client_of
from strategies.wrappers import StrategyWrapper

MODES = ("none", "fixed", "adaptive")


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "dp"
    mode: str = hyper("none", key="dp", choices=MODES, doc="central DP: none, fixed or adaptive clipping")
    noise_multiplier: float = hyper(1.0, low=0.0, doc="z, the noise multiplier")
    clipping_norm: float = hyper(1.0, low=0.0, low_open=True, doc="C, the clipping norm (adaptive: its start)")
    target_quantile: float = hyper(0.5, low=0.0, high=1.0, doc="adaptive: q, the quantile of the update norms C "
                                                                "settles at")
    clip_norm_lr: float = hyper(0.2, low=0.0, low_open=True, doc="adaptive: η_C, the clipping norm's step")
    clipped_count_stddev: float = hyper(0.0, low=0.0, doc="adaptive: σ_b, the clipped count's noise (0 = clients "
                                                          "per round / 20)")

    def count_stddev(self, clients_per_round: int) -> float:
        return self.clipped_count_stddev or clients_per_round / 20


@dataclasses.dataclass
class State:
    clipping_norm: float  # C of the next round (moves only under dp = "adaptive")


def check(params: Params, method: str, needs_individual_updates: bool, clients_per_round: int,
          secure: bool) -> None:
    """One-line :class:`ConfigError` unless ``dp`` can run with this method and federation."""
    if params.mode == "none":
        return
    if needs_individual_updates:
        raise ConfigError(f"run-config key 'dp' = {params.mode!r}: method '{method}' does not aggregate a sum of "
                          "the updates, so the noise calibration z*C/m does not hold; use a sum-only method "
                          "(fedavg, federage, fedprox, fedavgm, fedadam, ...) or dp='none'")
    if secure:
        raise ConfigError(f"run-config key 'dp' = {params.mode!r} clips each update on the server, which secure "
                          "aggregation hides: set secure-aggregation=false or dp='none'")
    sigma_b = params.count_stddev(clients_per_round)
    if params.mode == "adaptive" and params.noise_multiplier > 0 and params.noise_multiplier >= 2 * sigma_b:
        raise ConfigError(f"run-config key 'dp-noise-multiplier' = {params.noise_multiplier} must be below "
                          f"2 x dp-clipped-count-stddev = {2 * sigma_b} for adaptive clipping: raise "
                          "dp-clipped-count-stddev or lower the noise multiplier")


class _MethodStep(flower.Strategy):
    """What Flower's wrapper wraps: the method's own step on the (clipped) replies, with the
    zero updates the wrapper was not shown put back in client order; ``result`` its whole
    :class:`Aggregated` (Flower takes the arrays and metrics)."""

    def __init__(self, method, unclipped: list) -> None:
        self.method, self.unclipped = method, unclipped
        self.result = Aggregated(None)  # Flower's wrapper may refuse the replies without a step

    def aggregate_train(self, server_round, replies):
        self.result = self.method.aggregate_valid(server_round, sorted([*replies, *self.unclipped], key=client_of))
        return self.result.arrays, self.result.metrics

    def configure_train(self, *args):
        raise NotImplementedError

    def configure_evaluate(self, *args):
        raise NotImplementedError

    def aggregate_evaluate(self, *args):
        raise NotImplementedError

    def summary(self) -> None:
        self.method.summary()


class _AdaptiveClipping(flower.DifferentialPrivacyServerSideAdaptiveClipping):
    """Flower's server-side adaptive clipping with Andrew et al.'s direction of the norm update.

    Flower 1.42 hands its geometric update the (noisy) fraction of updates that were
    *clipped*, so C shrinks when every update is clipped and grows when none is: C runs away
    from the norms it should track (tests/test_defences.py measures both). Andrew et al.'s
    rule uses the fraction left *unclipped*, b̃: C ← C·exp(−η_C (b̃ − q)), which settles where
    a fraction q of the updates fits under C.
    """

    uncounted = 0  # zero updates kept from the wrapper (never clipped): they count in the fraction

    def _geometric_update(self, clipped_fraction: float) -> None:
        super()._geometric_update(1.0 - clipped_fraction)

    def _noisy_fraction(self, count: int, total: int) -> float:
        return super()._noisy_fraction(count, total + self.uncounted)


class CentralDP(StrategyWrapper):
    """Flower's server-side DP clipping around the inner strategy's :meth:`aggregate_valid`
    (a :class:`strategies.wrappers.StrategyWrapper`): ``CentralDP(FedAvg(), Params(mode="fixed"))``.
    Reported as ``privacy`` in the round's outcome; :attr:`dp_state` is checkpointed."""

    own = ("inner", "dp", "dp_seed", "count_stddev", "dp_state", "_dp_state")

    def __init__(self, strategy: Any, params: Params, *, seed: int = 0, clients_per_round: int = 1) -> None:
        super().__init__(strategy)
        if params.mode not in ("fixed", "adaptive"):
            raise ConfigError(f"run-config key 'dp' = {params.mode!r}: CentralDP needs 'fixed' or 'adaptive'")
        if strategy.needs_individual_updates:
            raise ConfigError(f"{strategy.name or type(strategy).__name__} does not aggregate a sum of the updates: "
                              "central DP (dp) runs only with sum-only methods")
        self.dp, self.dp_seed = params, seed
        self.count_stddev = params.count_stddev(clients_per_round)
        self.dp_state = State(params.clipping_norm)

    @property
    def dp_state(self) -> State:
        return self._dp_state

    @dp_state.setter
    def dp_state(self, value: Any) -> None:  # a checkpoint's saved fields are rebuilt here (fedcore.state)
        self._dp_state = rebuild(State, value) if isinstance(value, Fields) else value

    def aggregate_valid(self, server_round: int, replies: list) -> Aggregated:
        """The inner strategy on the clipped replies, with noise; the round's report as ``privacy``."""
        p, m, clip = self.dp, len(replies), self.dp_state.clipping_norm
        theta = self.current_flat(torch.float64)
        norms = [float((flat.record_to_flat(r.content[keys.ARRAYS], dtype=torch.float64) - theta).norm())
                 for r in replies]
        # Flower's clipping divides by the update's norm: a zero update (a free-rider's) needs
        # no clipping and goes straight to the method.
        step = _MethodStep(self.inner, [r for r, n in zip(replies, norms) if n == 0.0])
        if p.mode == "fixed":
            wrapper = flower.DifferentialPrivacyServerSideFixedClipping(step, p.noise_multiplier, clip, m)
        else:
            wrapper = _AdaptiveClipping(
                step, p.noise_multiplier, m, clip, p.target_quantile, p.clip_norm_lr, self.count_stddev)
            wrapper.uncounted = len(step.unclipped)
        wrapper.current_arrays = self.current_arrays
        saved = np.random.get_state()
        np.random.seed(derive_seed(self.dp_seed, "dp-noise", server_round) % 2**32)
        try:
            arrays, metrics = wrapper.aggregate_train(server_round, [r for r, n in zip(replies, norms) if n > 0.0])
        finally:
            np.random.set_state(saved)
        self.dp_state.clipping_norm = float(wrapper.clipping_norm)
        report = {"mode": p.mode, "noise_multiplier": float(wrapper.noise_multiplier), "clipping_norm": clip,
                  "noise_std": compute_stdv(wrapper.noise_multiplier, wrapper.clipping_norm, m),
                  "num_clipped": sum(n > clip for n in norms), "num_updates": m}
        if p.mode == "adaptive":
            report["next_clipping_norm"] = self.dp_state.clipping_norm
        inner = step.result
        return Aggregated(arrays, metrics, inner.dropped, {**inner.defence, "privacy": report})

    def describe(self) -> dict[str, Any]:
        """The privacy parameters for summary.json."""
        p = self.dp
        out = {"mode": p.mode, "noise_multiplier": p.noise_multiplier, "clipping_norm": p.clipping_norm}
        if p.mode == "adaptive":
            out.update(target_quantile=p.target_quantile, clip_norm_lr=p.clip_norm_lr,
                       clipped_count_stddev=self.count_stddev, final_clipping_norm=self.dp_state.clipping_norm)
        return out
