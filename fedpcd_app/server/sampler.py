"""Which partitions train in which round: the server's own seeded availability model.

The draw of round t depends only on (seed, t) — not on the method, nor on what happened
in earlier rounds — so every method under one seed sees the same clients in the same
rounds, and a run resumed at round k draws exactly what the uninterrupted run drew.

Three availability models (``participation``), after the random access model (RAM) of
FedeRage (paper 003, Sec. II-B): an external mechanism, hidden from the strategy, decides
who reaches the server.

* ``uniform`` (default) — M = round(fraction-train · N) clients without replacement,
  every client equally likely.
* ``skewed`` — exactly M clients per round, client i present with the per-round
  probability π_i of a skewed profile (Σ π_i = M). Drawn by systematic πps sampling over
  a fresh random order each round (Madow, 1949), which gives exactly these inclusion
  probabilities with a fixed round size.
* ``bernoulli`` — each client present independently with probability π_i: variable-size
  rounds (E|S_t| = M), possibly empty.
* ``size-proportional`` — the q-FFL/FedProx authors' ``select_clients``: M clients drawn
  without replacement with probability p_k = n_k / Σ n_j ∝ the client's training size
  (numpy ``choice(replace=False, p=p)``, i.e. successive draws ∝ p among those not yet
  drawn), seeded by (seed, round) as the other schemes. The FedAvg family then averages the
  drawn clients uniformly (``fedavg-weighting`` is taken as ``uniform``), so the aggregate
  stays unbiased for Σ_k p_k F_k; methods whose server rule weights by data size in another
  way are refused in one line (:data:`SIZE_PROPORTIONAL_REFUSED`). The profile's
  ``probabilities`` are then the per-round inclusion probabilities estimated from
  :data:`PROFILE_DRAWS` seeded draws (there is no closed form), ``draw_weights`` the p_k.

The profile π (``availability-*`` keys): ``availability-rare-clients`` = k clients are
present with probability ``availability-rare-prob`` per round, the other N − k share the
remaining M − k·p_rare equally (capped at 1). Which clients are rare:
``availability-rare-choice`` = ``rarest-classes`` (the holders of the classes held by the
fewest clients, as in the paper's experiments: the rarest data arrives the least often)
or ``last`` (partition ids N − k … N − 1). The strategy never sees π; the server writes
it to ``availability.json`` for the figures.
"""

from __future__ import annotations

import numpy as np

from fedcore.config import APP, ConfigError, RunConfig
from fedcore.seeding import numpy_rng
from strategies import craft

PROFILE_DRAWS = 4000

# participation = "size-proportional": what it changes per method (docs/methods/index.md, "Participation").
# The FedAvg family averages the drawn clients uniformly; these keep their own server rule
# (it has no data-size weights, so drawing ∝ n_k only tilts which clients are seen) ...
FEDAVG_FAMILY = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "propfair")
SIZE_PROPORTIONAL_OWN_RULE = ("qffl", "federage", "scaffold", "fedfv", "fedlf", "fedheal", "fedpw", "config-fl",
                              "fedmedian", "fedtrimmedavg", "adafed")
# ... and these weight by data size (or need every client each round) in a way the uniform
# mean does not replace: drawing ∝ n_k would count the sizes twice.
SIZE_PROPORTIONAL_REFUSED = {
    "fedpcd": "its primary direction ḡ weights the replies by data size",
    "craft": "craft-rho='data-size' weights the replies by data size (craft-rho='uniform' is allowed)",
    "fednova": "its step weights the normalised updates by data size p_i",
    "fedmgda": "its λ is kept near the data-size weights",
    "afl": "its mixture λ is over all clients (the paper's full participation), falling back to data-size weights",
    "ditto": "its shared model is a data-size-weighted FedAvg",
    "krum": "not checked for it", "multikrum": "Flower's MultiKrum averages the kept replies by data size",
    "bulyan": "not checked for it",
    "term": "its tilted weights are the data-size weights times e^(t·loss)",
    "fedfa": "its weights read each client's participation count, which size-proportional draws tilt",
}


def size_proportional_refusal(method: str, params) -> str | None:
    """Why ``participation = "size-proportional"`` is refused for this method (None: allowed)."""
    if method in FEDAVG_FAMILY or method in SIZE_PROPORTIONAL_OWN_RULE:
        return None
    if method == "craft" and craft.Params.from_run_config(params).rho == "uniform":
        return None
    return SIZE_PROPORTIONAL_REFUSED.get(method, "its server rule was not checked for size-proportional draws")


def inclusion_probabilities(weights: np.ndarray, m: float) -> np.ndarray:
    """π ∝ weights with Σ π = m and π ≤ 1 (clients that would exceed 1 are capped at 1).

    The standard πps construction: cap, then spread the rest over the uncapped clients in
    proportion to their weights, until no value exceeds 1.
    """
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("availability weights must be >= 0 with a positive sum")
    if m > np.count_nonzero(w):
        raise ValueError(f"cannot draw {m} clients from {np.count_nonzero(w)} with nonzero availability")
    pi = np.zeros_like(w)
    capped = np.zeros(w.size, dtype=bool)
    while True:
        free = ~capped
        pi[free] = (m - capped.sum()) * w[free] / w[free].sum()
        over = free & (pi > 1.0)
        if not over.any():
            break
        capped |= over
        pi[capped] = 1.0
    return pi


def systematic_sample(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of a fixed-size sample with P(i in sample) = π_i exactly (Σ π integer).

    Madow's systematic sampling: lay the π_i end to end in a random order and take the
    items under the points u, u + 1, …, u + M − 1 with u ~ U[0, 1).
    """
    order = rng.permutation(pi.size)
    edges = np.concatenate([[0.0], np.cumsum(pi[order])])
    m = int(round(edges[-1]))
    edges *= m / edges[-1]  # exact total: no point can fall past the last edge
    points = rng.uniform() + np.arange(m)
    picked = np.searchsorted(edges, points, side="right") - 1
    return order[np.clip(picked, 0, pi.size - 1)]


def rarest_class_holders(label_counts: np.ndarray, k: int) -> list[int]:
    """The k clients holding the classes held by the fewest clients (ties: fewer examples).

    Walks the classes from the rarest and takes each one's holders (largest share first)
    until k clients are chosen.
    """
    holders = (label_counts > 0).sum(axis=0)
    totals = label_counts.sum(axis=0)
    chosen: list[int] = []
    for c in np.lexsort((totals, holders)):  # by holder count, then by size
        if holders[c] == 0:
            continue
        for client in np.argsort(-label_counts[:, c], kind="stable"):
            if label_counts[client, c] > 0 and int(client) not in chosen:
                chosen.append(int(client))
            if len(chosen) == k:
                return sorted(chosen)
    return sorted(chosen)




def rare_clients(cfg: RunConfig) -> int:
    """``availability-rare-clients``, checked. The default (3) assumes a federation of at least
    4 clients: with fewer it becomes num-clients − 1 (at least one frequent client), so the
    defaults run on 2 devices; another value must leave a frequent client (one line naming
    the fix otherwise)."""
    n = cfg.num_clients
    k = cfg.availability_rare_clients
    if k == APP["availability-rare-clients"].default and k >= n:
        return max(0, n - 1)
    if k > n:
        raise ConfigError(f"run-config key 'availability-rare-clients' = {k} is more than num-clients = {n}: "
                          f"set availability-rare-clients to at most {max(0, n - 1)}")
    return k


class Sampler:
    """Seeded availability model over the present partition ids (see the module doc)."""

    def __init__(self, cfg: RunConfig, available: list[int] | None = None) -> None:
        self.cfg = cfg
        self.available = np.array(sorted(available if available is not None else range(cfg.num_clients)))
        self.per_round = min(cfg.clients_per_round, len(self.available))
        self.participation = cfg.participation
        self.rare_clients: list[int] = []
        self.draw_weights: np.ndarray | None = None
        if self.participation == "uniform":
            self.probabilities = np.full(len(self.available), self.per_round / len(self.available))
        elif self.participation == "size-proportional":
            self.draw_weights = self._size_weights()
            self.probabilities = self._estimated_inclusion()
        else:
            self.probabilities = self._skewed_profile()

    def _size_weights(self) -> np.ndarray:
        """p_k = n_k / Σ n_j over the present clients (n_k: training-split size)."""
        from client_app.data import load_federated_data  # the server holds the data already

        train = load_federated_data(self.cfg).train_idx
        n = np.array([len(train[int(p)]) for p in self.available], dtype=np.float64)
        if np.count_nonzero(n) < self.per_round:
            raise ConfigError(f"run-config key 'participation' = 'size-proportional': only {np.count_nonzero(n)} "
                              f"clients hold training data, fewer than the {self.per_round} drawn per round; "
                              "lower fraction-train")
        return n / n.sum()

    def _estimated_inclusion(self) -> np.ndarray:
        """P(client in a round), from PROFILE_DRAWS seeded draws (for availability.json only)."""
        rng = numpy_rng(self.cfg.seed, "size-proportional-profile")
        counts = np.zeros(len(self.available))
        for _ in range(PROFILE_DRAWS):
            counts[rng.choice(len(self.available), size=self.per_round, replace=False, p=self.draw_weights)] += 1
        return counts / PROFILE_DRAWS

    def _skewed_profile(self) -> np.ndarray:
        cfg = self.cfg
        k = rare_clients(cfg)
        p_rare = cfg.availability_rare_prob
        choice = cfg.availability_rare_choice
        if k * p_rare >= self.per_round:
            raise ConfigError(
                f"run-config key 'availability-rare-prob' = {p_rare}: {k} rare clients would fill the "
                f"{self.per_round} places of a round; lower it or availability-rare-clients"
            )
        if choice == "last":
            rare = list(range(cfg.num_clients - k, cfg.num_clients))
        else:
            from client_app.data import load_federated_data  # the server holds the data already

            rare = rarest_class_holders(load_federated_data(cfg).label_counts(), k)
        self.rare_clients = [r for r in rare if r in set(self.available.tolist())]
        is_rare = np.isin(self.available, self.rare_clients)
        # Rare clients keep their probability; the others share what remains of M equally.
        weights = np.where(is_rare, 0.0, 1.0)
        pi = np.where(is_rare, p_rare, 0.0)
        rest = self.per_round - pi.sum()
        if (~is_rare).sum() < rest:
            raise ConfigError(
                f"run-config key 'fraction-train': {self.per_round} per round cannot be filled by "
                f"{(~is_rare).sum()} frequent clients; lower fraction-train or availability-rare-clients"
            )
        pi[~is_rare] = inclusion_probabilities(weights[~is_rare], rest) if (~is_rare).any() else 0.0
        return pi

    def sample(self, server_round: int) -> list[int]:
        """The partitions present in ``server_round``: seeded by (seed, round) alone."""
        rng = numpy_rng(self.cfg.seed, "sample", server_round)
        if self.participation == "uniform":
            picked = rng.choice(len(self.available), size=self.per_round, replace=False)
        elif self.participation == "size-proportional":  # the q-FFL authors' select_clients(pk=...)
            picked = rng.choice(len(self.available), size=self.per_round, replace=False, p=self.draw_weights)
        elif self.participation == "skewed":
            picked = systematic_sample(self.probabilities, rng)
        else:
            picked = np.flatnonzero(rng.uniform(size=len(self.available)) < self.probabilities)
        return sorted(int(p) for p in self.available[picked])

    def profile(self) -> dict:
        """The availability profile (for ``availability.json``; never given to a strategy)."""
        probs = np.zeros(self.cfg.num_clients)
        probs[self.available] = self.probabilities
        extra = {}
        if self.draw_weights is not None:
            weights = np.zeros(self.cfg.num_clients)
            weights[self.available] = self.draw_weights
            extra = {"draw_weights": weights.tolist(), "probabilities_estimated_from": PROFILE_DRAWS}
        return {**extra,
            "participation": self.participation,
            "per_round": self.per_round,
            "probabilities": probs.tolist(),
            "rare_clients": self.rare_clients,
            "available": self.available.tolist(),
        }

    def describe(self) -> str:
        n = len(self.available)
        if self.participation == "uniform":
            return f"uniform, {self.per_round} of {n} per round"
        if self.participation == "size-proportional":
            return f"size-proportional, {self.per_round} of {n} per round (p_k = n_k / sum n)"
        size = f"{self.per_round}" if self.participation == "skewed" else f"~{self.per_round} (variable)"
        return (f"{self.participation}, {size} of {n} per round; rare clients {self.rare_clients} "
                f"at p={self.probabilities[np.isin(self.available, self.rare_clients)].max(initial=0):.3g}")


def build_sampler(cfg: RunConfig, available: list[int] | None = None) -> Sampler:
    return Sampler(cfg, available)
