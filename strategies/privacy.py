"""Central differential privacy around a sum-only method: Flower's server-side clipping wrappers.

``dp = "fixed"`` is Flower's ``DifferentialPrivacyServerSideFixedClipping`` (McMahan et al., ICLR
2018, arXiv:1710.06963), ``dp = "adaptive"`` its ``DifferentialPrivacyServerSideAdaptiveClipping``
(Andrew et al., NeurIPS 2021, arXiv:1905.03871), as a transform of the method
(:class:`CentralDP`, a :class:`strategies.base.Transform`) in Flower's own numpy arithmetic (its
``flwr.supercore.differential_privacy`` steps: the same bits). Each round:

1. every update θ_i − θ_t is scaled to norm ≤ C (the clipping norm);
2. the inner strategy aggregates the clipped replies as usual (its :meth:`aggregate_valid`);
3. Gaussian noise N(0, σ² I) is added to the aggregated model, σ = z·C/m (Flower's
   ``compute_stdv``; z the noise multiplier, m the round's valid replies);
4. adaptive only: C ← C·exp(−η_C (b̃ − q)), b̃ the fraction of updates not clipped plus
   N(0, σ_b²/m²) count noise (σ_b = ``dp-clipped-count-stddev``, 0 = Flower's default
   clients-per-round / 20), q the target quantile of the update norms (Andrew et al.'s γ: C
   settles where a fraction q of the updates fits under it); z is raised to
   z' = (z⁻² − (2σ_b)⁻²)^(−1/2) to pay for the count (so z < 2σ_b is required). Flower 1.42
   moves C the other way (it counts the *clipped* updates); here C follows Andrew et al., and
   σ uses the C the round's update moved to, as Flower's wrapper does.

Only for methods whose aggregate is a weighted sum of the replies (``needs_individual_updates``
False; :func:`check` refuses the others): σ = z·C/m is the Gaussian mechanism's calibration
for a uniform mean of clipped updates (FedeRage's average; FedAvg's when the clients hold
equal amounts of data — with example weights p_i a client's sensitivity is max p_i·C, not
C/m). For Flower's server optimisers (FedAvgM, FedAdam, ...) the noise lands on the
optimiser's output, as when Flower's wrapper wraps them. No privacy accountant runs (ε is
not computed: Flower's accountant needs the ``dp-accounting`` package, not a dependency);
every round's z, C, σ and clipped count are in rounds.jsonl under ``privacy``.

The noise (and the adaptive count's noise) come from a NumPy ``RandomState`` seeded from (seed,
round): the draws Flower's wrappers make from the global generator seeded so, without touching
it; runs and resumed runs are reproducible. The state is the method's with the clipping norm
beside it (:class:`State`), checkpointed whole with the run.

"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedcore import flat
from fedcore.config import ConfigError
from fedcore.params import MethodParams, hyper
from fedcore.seeding import derive_seed
from strategies.base import Method, Round, Step, Transform

log = logging.getLogger("fedpcd")
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
    inner: Any  # the method's own state
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


# -- Flower's steps (flwr.supercore.differential_privacy), on numpy arrays ------------------------------
def update_norm(arrays: list[np.ndarray]) -> float:
    """Flower's ``get_norm``: √(Σ ‖array‖²) of the flattened arrays."""
    return float(np.sqrt(sum([np.linalg.norm(a.flat) ** 2 for a in arrays])))


def clip_model(model: list[np.ndarray], current: list[np.ndarray],
               clipping_norm: float) -> tuple[list[np.ndarray], bool]:
    """(θ_t + min(1, C/‖θ_i − θ_t‖)·(θ_i − θ_t), whether it was clipped): Flower's
    ``compute_clip_model_update`` / ``compute_adaptive_clip_model_update``."""
    update = [np.subtract(x, y) for x, y in zip(model, current)]
    factor = min(1, clipping_norm / update_norm(update))
    for array in update:
        array *= factor
    return [c + u for c, u in zip(current, update)], factor < 1


def noise_std(noise_multiplier: float, clipping_norm: float, num_sampled: int) -> float:
    """σ = z·C/m (Flower's ``compute_stdv``)."""
    return float((noise_multiplier * clipping_norm) / num_sampled)


def adaptive_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z' = (z⁻² − (2σ_b)⁻²)^(−1/2): z raised to pay for the noisy count (Flower's
    ``compute_adaptive_noise_params``); 0 stays 0."""
    if noise_multiplier <= 0:
        return 0.0
    value = (noise_multiplier ** (-2) - (2 * count_stddev) ** (-2)) ** -0.5
    if value / noise_multiplier >= 2:
        log.warning("central DP: a significant amount of noise (%s) has to be added: raise dp-clipped-count-stddev",
                    value / noise_multiplier)
    return value


class CentralDP(Transform):
    """Server-side DP clipping and noise around a sum-only method (see the module docstring):
    ``CentralDP(FedAvgMethod(), Params(mode="fixed"), seed=0, clients_per_round=10)``. Reported
    as ``privacy`` in the round's defences."""

    def __init__(self, inner: Method, params: Params, *, seed: int = 0, clients_per_round: int = 1) -> None:
        if params.mode not in ("fixed", "adaptive"):
            raise ConfigError(f"run-config key 'dp' = {params.mode!r}: CentralDP needs 'fixed' or 'adaptive'")
        if inner.needs_individual_updates:
            raise ConfigError(f"{inner.name or type(inner).__name__} does not aggregate a sum of the updates: "
                              "central DP (dp) runs only with sum-only methods")
        super().__init__(inner)
        self.dp, self.dp_seed = params, seed
        self.count_stddev = params.count_stddev(clients_per_round)

    def init(self) -> State:
        return State(self.inner.init(), self.dp.clipping_norm)

    def restore(self, fields) -> State:
        inner = fields.get("inner")
        from fedcore.state import Fields

        return State(self.inner.restore(inner) if isinstance(inner, Fields) else inner, float(fields["clipping_norm"]))

    def restored(self, state: State) -> State:
        return dataclasses.replace(state, inner=self.inner.restored(state.inner))

    def node_changed(self, state: State, client: int) -> State:
        return dataclasses.replace(state, inner=self.inner.node_changed(state.inner, client))

    def request(self, server_round, state, current):
        return self.inner.request(server_round, state.inner, current)

    def client_records(self, state, client, current):
        return self.inner.client_records(state.inner, client, current)

    def evaluation_model(self, state, current):
        return self.inner.evaluation_model(state.inner, current)

    def check(self, round_, state):
        return self.inner.check(round_, state.inner)

    def aggregate(self, round_: Round, state: State) -> Step:
        """The inner method on the clipped models, with noise; the round's report as ``privacy``."""
        p, m, clip = self.dp, len(round_), state.clipping_norm
        theta = round_.theta_as(torch.float64)
        norms = [float((flat.record_to_flat(r, dtype=torch.float64) - theta).norm()) for r in round_.models]
        current = [a.numpy() for a in round_.current.values()]
        names = list(round_.current.keys())
        rng = np.random.RandomState(derive_seed(self.dp_seed, "dp-noise", round_.number) % 2**32)
        # Flower's clipping divides by the update's norm: a zero update (a free rider's) needs no clipping
        models, clipped = list(round_.models), 0
        for i, (record, norm) in enumerate(zip(round_.models, norms)):
            if norm > 0.0:
                model, was_clipped = clip_model([a.numpy() for a in record.values()], current, clip)
                models[i] = ArrayRecord({k: flat.to_array(np.asarray(v)) for k, v in zip(names, model)})
                clipped += int(was_clipped)
        z, next_clip = p.noise_multiplier, clip
        if p.mode == "adaptive":
            z = adaptive_noise_multiplier(p.noise_multiplier, self.count_stddev)
            counted = sum(n > 0.0 for n in norms)
            # the noisy fraction of clipped updates over every update (zero ones are never clipped), then
            # Andrew et al.'s step on the fraction left unclipped
            fraction = float(rng.normal(clipped, self.count_stddev)) / float(counted + (m - counted))
            next_clip = clip * math.exp(-p.clip_norm_lr * ((1.0 - fraction) - p.target_quantile))
        step = self.inner.aggregate(round_.with_models(models), state.inner)
        sigma = noise_std(z, next_clip, m)
        model = step.model
        if model is not None:
            arrays = (round_.to_record(model) if isinstance(model, torch.Tensor) else
                      ArrayRecord({k: flat.to_array(np.asarray(v)) for k, v in model.items()}))
            noisy = {}
            for key, array in zip(arrays.keys(), arrays.to_numpy_ndarrays()):
                array += rng.normal(0, sigma, array.shape).astype(array.dtype)
                noisy[key] = array
            model = noisy
        report = {"mode": p.mode, "noise_multiplier": float(z), "clipping_norm": clip, "noise_std": sigma,
                  "num_clipped": sum(n > clip for n in norms), "num_updates": m}
        if p.mode == "adaptive":
            report["next_clipping_norm"] = next_clip
        return dataclasses.replace(step, model=model, state=State(step.state, next_clip),
                                   defence={**step.defence, "privacy": report})

    def describe(self, state: State) -> dict[str, Any]:
        """The privacy parameters for summary.json."""
        p = self.dp
        out = {"mode": p.mode, "noise_multiplier": p.noise_multiplier, "clipping_norm": p.clipping_norm}
        if p.mode == "adaptive":
            out.update(target_quantile=p.target_quantile, clip_norm_lr=p.clip_norm_lr,
                       clipped_count_stddev=self.count_stddev, final_clipping_norm=state.clipping_norm)
        return out
