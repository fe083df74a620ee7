"""FedPCD's server-side history cache with an incrementally maintained Gram matrix.

The history of *FedPCD: Priority-Constrained Federated Aggregation* (2026; §3, window H;
full reference in :mod:`strategies.fedpcd`): every client seen in the last H rounds stays a
constraint c̃_jᵀ d ≥ τ‖c̃_j‖² of round t's program, with its latest direction; the Gram matrix
Q = C Cᵀ of the constraints feeds the dual μ* = argmin_{μ≥0} ½ μᵀQμ + μᵀ(C g̃_0 − b).
Each entry is a client's latest *constraint direction* c̃_i (its pseudo-gradient after
the run's normalisation), keyed by partition id and stamped with the round it was seen:

* a returning client overwrites its entry (same slot, so it is never counted twice);
* an entry stamped s is a constraint in rounds s … s+H and gone afterwards (H = 0: the
  current round only);
* the Gram matrix Q_jk = c̃_jᵀc̃_k of the entries is kept; a round computes only the
  rows of its k new/replaced entries — O(k·m'·d) — as one matmul.

One way in, per round: :meth:`HistoryCache.admit` the round's clients (entries older than
the window leave; each client gets the row its direction goes into: its own entry's row
when it returns, else the lowest free one), then :meth:`Admission.commit` the directions
that become entries; the commit returns the round's :class:`Constraints`. An admission is
committed once, and only the latest one.

An entry is a stored row r_j times a float64 factor f_j: c̃_j = f_j r_j. With float32
storage the rows are the raw updates Δ_j (f_j = s_j/η_l), which the caller writes into
:attr:`Admission.rows` while it computes them: no pass copies or scales them in afterwards.
With 16-bit storage the commit stores the scaled rows (f_j = 1) and writes the rounded
values back into the caller's rows, so the Gram matrix is exactly that of what is stored.
Normalisation statistics (``ema`` mode) are per client and updated when it is seen, so a
cached entry's direction never changes: its Gram entries stay valid until it expires.

Storage is one (capacity × d) tensor reused across rounds, so one matrix product covers
every entry (no first-touch page faults after warm-up). With ``max_rows`` (FedPCD passes
min(N, (H+1)·clients per round), the most entries the window can hold) the rows are
allocated once and the store grows as a longer view of them: an untouched row costs no
resident memory, and no growth ever copies the entries (a copy would hold the old and the
new store at once: twice the cache). Without a bound (or past it) a round that brings more
new clients than there are free rows grows the store once, by the rows it lacks, into an
allocation with one more such round of headroom and never more than (H + 1) × the round's
clients (one copy per growth): the store holds at most the entries the window can hold,
(H + 1) × the most clients a round has brought, whatever N is (known, unknown or wrong).
The store lives on the device of the rows admitted (CUDA when the strategy's
``server-device`` is). ``dtype`` may be ``bfloat16``/``float16`` to
halve the memory; products are then computed in float32 chunk by chunk.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from fedcore.state import transient

_GROUP_SPAN = 16  # add_rows: entries this close are summed in one pass
_CHUNK_ELEMS = 1 << 22  # float32 elements converted at a time from 16-bit storage (16 MB)


@dataclasses.dataclass
class HistoryCache:
    """Latest direction per client within a window of H rounds, with their Gram matrix.

    A plain dataclass: it *is* FedPCD's checkpointed state (:mod:`fedcore.state`).

    Parameters
    ----------
    history : int
        H ≥ 0, the window in rounds (0 = current round only).
    dtype : torch.dtype, default float32
        Storage of the entries (float32, bfloat16 or float16).
    ema_beta : float, default 0.9
        β of the per-client EMA of ‖g_i‖² (``ema``: client → (EMA, times seen)) that
        ``fedpcd-normalize = 'ema'`` keeps (:func:`strategies.fedpcd.normalise`).
    max_rows : int or None
        The most entries the cache can hold at once (rows allocated up front, touched only
        when written); None = grow by what each round needs (see the module docstring).
    """

    history: int
    dtype: torch.dtype = torch.float32
    ema_beta: float = 0.9
    dim: int | None = None
    store: torch.Tensor = dataclasses.field(default_factory=lambda: torch.empty(0, 0))  # (capacity, d)
    slot_pid: dict[int, int] = dataclasses.field(default_factory=dict)
    pid_slot: dict[int, int] = dataclasses.field(default_factory=dict)
    stamp: dict[int, int] = dataclasses.field(default_factory=dict)
    gram: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), dtype=np.float64))
    ema: dict[int, tuple[float, int]] = dataclasses.field(default_factory=dict)  # pid -> (EMA of ‖g‖², seen)
    max_rows: int | None = None
    factor: np.ndarray = dataclasses.field(default_factory=lambda: np.ones(0))  # (capacity,) c̃ = f·row
    _chunk: torch.Tensor | None = transient()  # float32 scratch for 16-bit storage
    _rows: torch.Tensor | None = transient()  # the allocation ``store`` is a leading view of
    _admission: Admission | None = transient()  # the latest admission, until it is committed

    def __post_init__(self) -> None:
        if self.history < 0:
            raise ValueError(f"history window must be >= 0, got {self.history}")
        self.history, self.ema_beta = int(self.history), float(self.ema_beta)
        if self.store.dtype != self.dtype:
            self.store = self.store.to(self.dtype)
        if self.factor.shape != (self.capacity,):
            raise ValueError(f"the FedPCD cache in this checkpoint has {self.capacity} rows but {self.factor.size} "
                             "factors: it was written by a version before the entries had factors and cannot be "
                             "resumed (start the run anew)")

    # -- queries -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.slot_pid)

    @property
    def capacity(self) -> int:
        return int(self.store.shape[0])

    def active_slots(self) -> list[int]:
        """Slots of the entries, in slot order (the constraint order of the QP)."""
        return sorted(self.slot_pid)

    def gram_of(self, slots: list[int]) -> np.ndarray:
        return self.gram[np.ix_(slots, slots)]

    def add_rows(self, out: torch.Tensor, slots: list[int], coefs) -> torch.Tensor:
        """out += Σ coef_j · entry_j (float32, in place; entry_j = factor_j · row_j).

        Nearby slots are summed as one matrix-vector product over their span (zero
        coefficients in the gaps): ``out`` is read and written once per group, not once
        per entry.
        """
        order = np.argsort(slots)
        slots = [int(slots[i]) for i in order]
        coefs = np.asarray(coefs, dtype=np.float64)[order] * self.factor[slots]
        if self.dtype != out.dtype:  # 16-bit storage: one converted row at a time
            for slot, c in zip(slots, coefs.tolist()):
                out.add_(self.store[slot].to(out.dtype), alpha=c)
            return out
        i = 0
        while i < len(slots):
            j = i
            while j + 1 < len(slots) and slots[j + 1] - slots[i] < _GROUP_SPAN:
                j += 1
            lo, hi = slots[i], slots[j] + 1
            # a row of the span that holds no entry may be storage never written (torch.empty): its
            # zero coefficient times a NaN of garbage would be NaN, so it is zeroed first (it is free)
            unused = [r for r in range(lo, hi) if r not in self.slot_pid and r not in slots[i : j + 1]]
            if unused:
                self.store[unused] = 0
            vec = torch.zeros(hi - lo, dtype=out.dtype)
            vec[torch.tensor(slots[i : j + 1]) - lo] = torch.tensor(coefs[i : j + 1], dtype=out.dtype)
            out.addmv_(self.store[lo:hi].T, vec.to(out.device))
            i = j + 1
        return out

    # -- the way in ----------------------------------------------------------------------
    def admit(self, server_round: int, clients: list[int], dim: int, device: torch.device) -> Admission:
        """The round's clients (distinct ids; their directions have ``dim`` values on ``device``)
        enter: entries older than H rounds (stamp < round − H) leave, and each client gets the
        row its direction goes into — its own entry's row when it returns (overwritten in
        place), else the lowest free row (the store grows as needed). Nothing else changes
        until :meth:`Admission.commit`."""
        if len(set(clients)) != len(clients):
            raise ValueError(f"the cache admits one direction per client, got clients {clients}")
        self._check_dim(dim, device)
        for slot in [s for s, t in self.stamp.items() if t < server_round - self.history]:
            del self.pid_slot[self.slot_pid.pop(slot)], self.stamp[slot]
        used = set(self.slot_pid)
        free = [s for s in range(self.capacity) if s not in used]
        short = sum(client not in self.pid_slot for client in clients) - len(free)
        if short > 0:  # one growth for the whole round, by the rows it lacks
            old = self.capacity
            self._grow(old + short, device, headroom=len(clients))
            free += range(old, self.capacity)
        free.reverse()  # lowest free row first (pop from the end)
        slots = {client: (self.pid_slot[client] if client in self.pid_slot else free.pop()) for client in clients}
        rows = [self.store[slots[c]] for c in clients] if self.dtype == torch.float32 else None
        self._admission = Admission(self, server_round, slots, rows)
        return self._admission

    # -- internals -----------------------------------------------------------------------
    def _grow(self, need: int, device: torch.device, headroom: int = 0) -> None:
        """A store of exactly ``need`` rows; the lowest free slot is reused first, so the
        entries stay in a compact prefix and one matmul covers them. Within the allocation
        the store becomes a longer view of it (no copy); past it, a new allocation and one
        copy of the entries: the ``max_rows`` bound when it holds ``need``, else ``need`` plus
        ``headroom`` rows (the round's clients: one more round like it fits without a copy),
        never more than the window can hold, (H + 1) × ``headroom``. So the store never
        exceeds the entries the window holds, whatever ``max_rows`` (N) is: known, unknown
        or wrong."""
        rows = self._rows
        if rows is None or need > rows.shape[0] or rows.device != device or rows.data_ptr() != self.store.data_ptr():
            bounded = self.max_rows is not None and need <= self.max_rows
            n = self.max_rows if bounded else max(need, min(need + headroom, (self.history + 1) * headroom))
            rows = torch.empty(n, self.dim, dtype=self.dtype, device=device)  # pages touched on first write
            if self.capacity:
                rows[: self.capacity].copy_(self.store)
            self._rows = rows
        cap = need
        self.store = rows[:cap]
        gram = np.zeros((cap, cap), dtype=np.float64)
        old = self.gram.shape[0]
        gram[:old, :old] = self.gram
        self.gram = gram
        self.factor = np.concatenate([self.factor, np.ones(cap - old)])

    def _check_dim(self, dim: int, device: torch.device) -> None:
        if self.dim is None:
            self.dim = int(dim)
        elif dim != self.dim:
            raise ValueError(f"cache holds {self.dim}-dim directions, got {dim}")
        if self.store.device != device and self.capacity:  # e.g. a CPU checkpoint resumed on a GPU
            self.store, self._rows = self.store.to(device), None

    def _set_gram_rows(self, new: np.ndarray, block: np.ndarray) -> None:
        """Q[new, :] = Q[:, new]ᵀ = block (n, capacity), one value per new pair."""
        if not new.size:
            return
        self.gram[new, :] = block
        self.gram[:, new] = block.T
        nn = block[:, new]
        self.gram[np.ix_(new, new)] = 0.5 * (nn + nn.T)

    def _products(self, rows: torch.Tensor, hi: int) -> np.ndarray:
        """rows @ r_jᵀ with the stored rows r_0 … r_{hi−1} (one pass, float32), as float64
        (n, capacity); the columns from ``hi`` on are 0."""
        out = np.zeros((rows.shape[0], self.capacity), dtype=np.float64)
        if not hi:
            return out
        entries = self.store[:hi]
        if entries.dtype == rows.dtype:
            res = rows @ entries.T
        else:  # 16-bit storage: convert column chunks into a reused float32 buffer
            res = torch.zeros(rows.shape[0], hi, dtype=torch.float32, device=rows.device)
            cols = max(1, _CHUNK_ELEMS // hi)
            if self._chunk is None or self._chunk.numel() < hi * cols or self._chunk.device != rows.device:
                self._chunk = torch.empty(hi * cols, dtype=torch.float32, device=rows.device)
            for a in range(0, self.dim, cols):
                e = min(a + cols, self.dim)
                tmp = self._chunk[: hi * (e - a)].view(hi, e - a)
                tmp.copy_(entries[:, a:e])
                res.addmm_(rows[:, a:e], tmp.T)
        out[:, :hi] = res.double().cpu().numpy()
        return out


@dataclasses.dataclass
class Constraints:
    """The constraint directions c̃_j of a round's QP: the cache entries in ``slots`` (slot
    order), their Gram matrix Q = C Cᵀ and their products c̃_jᵀḡ with the primary direction."""

    cache: HistoryCache = dataclasses.field(repr=False)
    slots: list[int]
    gram: np.ndarray  # (m', m') float64
    c_dot_gbar: np.ndarray  # (m',) float64

    def subset(self, keep: list[int]) -> Constraints:
        """The constraints ``keep`` (indices), in their order."""
        return Constraints(self.cache, [self.slots[j] for j in keep], self.gram[np.ix_(keep, keep)],
                           np.asarray(self.c_dot_gbar)[keep])

    def add_to(self, out: torch.Tensor, js, coefs) -> torch.Tensor:
        """out += Σ coef_j c̃_j over the constraints ``js`` (only their rows are read)."""
        return self.cache.add_rows(out, [self.slots[j] for j in js], coefs)


@dataclasses.dataclass(frozen=True)
class Admission:
    """A round's clients admitted to the cache (:meth:`HistoryCache.admit`): ``slots`` maps each
    to the row its direction goes into. With float32 storage ``rows`` are those rows, in the
    order the clients were admitted: the caller writes each client's raw update Δ_i into its
    row while it computes it. With 16-bit storage ``rows`` is None (the commit rounds them)."""

    cache: HistoryCache = dataclasses.field(repr=False)
    round: int
    slots: dict[int, int]
    rows: list[torch.Tensor] | None

    def commit(self, rows: torch.Tensor | None = None, clients: list[int] = (), entries: list[int] = (),
               factors=(), weights=(), ema: dict[int, tuple[float, int]] | None = None) -> Constraints:
        """The round's directions become entries; returns every entry of the window as the QP's
        :class:`Constraints`.

        ``rows`` (k + 1, d) float32: the raw updates Δ_i of ``clients`` (admitted ones, in their
        admission order), then ḡ = Σ ``weights``_i Δ_i. The clients ``entries`` (indices into
        ``clients``) get the entry c̃ = ``factors``_j · Δ, stamped with the round, and their
        updated normalisation statistics ``ema``; every other admitted client's row goes back
        and its entry is gone (a returning client's row was being overwritten). No ``rows``:
        no client of the round leaves an entry.
        """
        cache = self.cache
        if cache._admission is not self:
            raise RuntimeError("commit() needs the cache's latest admission, once")
        cache._admission = None
        keep = [clients[i] for i in entries]
        for client, slot in self.slots.items():  # rows that hold no entry go back
            if client not in keep and cache.slot_pid.get(slot) == client:
                del cache.slot_pid[slot], cache.pid_slot[client], cache.stamp[slot]
        cache.ema.update(ema or {})
        new = np.asarray([self.slots[c] for c in keep], dtype=np.int64)
        for client, slot in zip(keep, new.tolist()):
            cache.slot_pid[slot], cache.pid_slot[client], cache.stamp[slot] = client, slot, self.round
        slots = cache.active_slots()
        if rows is None:
            return Constraints(cache, slots, cache.gram_of(slots), np.zeros(len(slots)))
        factors, k, hi = np.asarray(factors, dtype=np.float64), len(clients), max(slots, default=-1) + 1
        if self.rows is not None:  # float32: the rows hold Δ_i already; c̃_i = f_i Δ_i
            prods = cache._products(rows[:k], hi)  # Δ_iᵀ r_j
            cache.factor[new] = factors
            cache._set_gram_rows(new, factors[:, None] * prods[list(entries)] * cache.factor[None, :])
            c_dot_gbar = (np.asarray(weights) @ prods[:, slots]) * cache.factor[slots]
        else:  # 16-bit: c̃_i = f_i Δ_i rounded into the store and back into the rows, then one
            # product of those rows and ḡ (unrounded) with the entries
            sub = rows[: k + 1] if len(keep) == k else rows[[*entries, k]]
            for i, slot in enumerate(new.tolist()):
                torch.mul(sub[i], float(factors[i]), out=cache.store[slot])
                sub[i].copy_(cache.store[slot])
            prods = cache._products(sub, hi)
            cache._set_gram_rows(new, prods[: len(keep)])
            c_dot_gbar = prods[len(keep), slots]
        return Constraints(cache, slots, cache.gram_of(slots), c_dot_gbar)
