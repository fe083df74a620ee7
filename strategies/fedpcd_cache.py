"""FedPCD's server-side history cache with an incrementally maintained Gram matrix.

Paper ``000_*`` §3 (history window H) and ``../shared/spec/ALGORITHMS.md`` step 3/4/6.
Each entry is a client's latest *constraint direction* c̃_i (its pseudo-gradient after
the run's normalisation), keyed by partition id and stamped with the round it was seen:

* a returning client overwrites its entry (same slot, so it is never counted twice);
* an entry stamped s is a constraint in rounds s … s+H and gone afterwards (H = 0: the
  current round only);
* the Gram matrix Q_jk = c̃_jᵀc̃_k of the entries is kept; a round computes only the
  rows of its k new/replaced entries — O(k·m'·d) — as one matmul.

Normalisation statistics (``ema`` mode) are per client and updated when it is seen, so a
cached entry's direction never changes: its Gram entries stay valid until it expires.

An entry is a stored row r_j times a float64 factor f_j: c̃_j = f_j r_j. FedPCD's float32
cache stores the raw update Δ_j (f_j = s_j/η_l), written straight from the reply bytes
while Δ_j is computed (:meth:`claim` the rows, :meth:`products`, :meth:`commit`): no
scaling pass over the entries. :meth:`insert` stores scaled rows (f_j = 1): the 16-bit
cache, whose rows are rounded after scaling, and :func:`strategies.fedpcd.fedpcd_direction`.

Storage is one (capacity × d) tensor reused across rounds, so one matrix product covers
every entry (no first-touch page faults after warm-up). With ``max_rows`` (FedPCD passes
min(N, (H+1)·clients per round), the most entries the window can hold) the rows are
allocated once and the store grows as a longer view of them: an untouched row costs no
resident memory, and no growth ever copies the entries (a copy would hold the old and the
new store at once: twice the cache). Without a bound (or past it) it grows geometrically
with one copy (warm-up only). The store lives on the device of the rows inserted (CUDA
when the strategy's ``server-device`` is). ``dtype`` may be ``bfloat16``/``float16`` to
halve the memory; products are then computed in float32 chunk by chunk.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from fedcore.state import transient

_MIN_ROWS = 16
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
        β of the per-client EMA of ‖g_i‖² used by ``scales(..., mode="ema")``.
    max_rows : int or None
        The most entries the cache can hold at once (rows allocated up front, touched only
        when written); None = grow geometrically.
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

    def __post_init__(self) -> None:
        if self.history < 0:
            raise ValueError(f"history window must be >= 0, got {self.history}")
        self.history, self.ema_beta = int(self.history), float(self.ema_beta)
        if self.store.dtype != self.dtype:
            self.store = self.store.to(self.dtype)
        if self.factor.shape != (self.capacity,):  # a checkpoint from before the factors: rows scaled
            self.factor = np.ones(self.capacity)

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

    def pids(self, slots: list[int] | None = None) -> list[int]:
        return [self.slot_pid[s] for s in (self.active_slots() if slots is None else slots)]

    def gram_of(self, slots: list[int]) -> np.ndarray:
        return self.gram[np.ix_(slots, slots)]

    def row(self, slot: int) -> torch.Tensor:
        """The stored row r of a slot (the entry is ``factor[slot]`` · r)."""
        return self.store[slot]

    def matrix(self, slots: list[int] | None = None) -> torch.Tensor:
        """The entries c̃_j as an (m', d) float32 matrix (a copy: for tests and checks)."""
        slots = self.active_slots() if slots is None else slots
        if not slots:
            return torch.empty(0, self.dim or 0)
        return torch.stack([self.row(s).float() * float(self.factor[s]) for s in slots])

    # -- normalisation -------------------------------------------------------------------
    def scales(self, pids: list[int], norms: torch.Tensor, mode: str, eps: float) -> torch.Tensor:
        """Factor s_i with c̃_i = s_i g_i for the current clients (float64).

        ``l2``: 1/(‖g_i‖ + ε); ``none``: 1; ``ema``: 1/(√v̂_i + ε) with v̂_i the
        bias-corrected EMA of ‖g_i‖² of client i, updated here with this round's norm.
        """
        norms = norms.double()
        if mode == "l2":
            return 1.0 / (norms + eps)
        if mode == "none":
            return torch.ones_like(norms)
        if mode != "ema":
            raise ValueError(f"unknown normalisation {mode!r}")
        beta, out = self.ema_beta, torch.empty_like(norms)
        for i, (pid, n) in enumerate(zip(pids, norms.tolist())):
            v, k = self.ema.get(pid, (0.0, 0))
            v, k = beta * v + (1.0 - beta) * n * n, k + 1
            self.ema[pid] = (v, k)
            out[i] = 1.0 / (np.sqrt(v / (1.0 - beta**k)) + eps)
        return out

    # -- updates -------------------------------------------------------------------------
    def expire(self, server_round: int) -> None:
        """Drop entries older than H rounds (stamp < round − H)."""
        for slot in [s for s, t in self.stamp.items() if t < server_round - self.history]:
            pid = self.slot_pid.pop(slot)
            del self.pid_slot[pid], self.stamp[slot]

    def _slot_for(self, pid: int, like: torch.Tensor) -> int:
        if pid in self.pid_slot:  # returning client: overwrite its entry in place
            return self.pid_slot[pid]
        used = set(self.slot_pid)
        slot = next((s for s in range(self.capacity) if s not in used), self.capacity)
        if slot >= self.capacity:
            self._grow(slot + 1, like.device)
        return slot

    def _grow(self, need: int, device: torch.device) -> None:
        """A store of at least ``need`` rows; the lowest free slot is reused first, so the
        entries stay in a compact prefix and one matmul covers them. Within the allocation
        the store becomes a longer view of it (no copy); past it, a new allocation (the
        ``max_rows`` bound, else geometric headroom) and one copy of the entries."""
        rows = self._rows
        if rows is None or need > rows.shape[0] or rows.device != device or rows.data_ptr() != self.store.data_ptr():
            bounded = self.max_rows is not None and need <= self.max_rows
            n = self.max_rows if bounded else max(need, _MIN_ROWS, int(self.capacity * 1.5))
            rows = torch.empty(n, self.dim, dtype=self.dtype, device=device)  # pages touched on first write
            if self.capacity:
                rows[: self.capacity].copy_(self.store)
            self._rows = rows
        cap = need if self.max_rows is not None and need <= rows.shape[0] else rows.shape[0]
        self.store = rows[:cap]
        gram = np.zeros((cap, cap), dtype=np.float64)
        old = self.gram.shape[0]
        gram[:old, :old] = self.gram
        self.gram = gram
        self.factor = np.concatenate([self.factor, np.ones(cap - old)])

    def _check_dim(self, rows: torch.Tensor) -> None:
        if self.dim is None:
            self.dim = int(rows.shape[1])
        elif rows.shape[1] != self.dim:
            raise ValueError(f"cache holds {self.dim}-dim directions, got {rows.shape[1]}")
        if self.store.device != rows.device and self.capacity:  # e.g. a CPU checkpoint resumed on a GPU
            self.store, self._rows = self.store.to(rows.device), None

    def claim(self, pids: list[int], like: torch.Tensor) -> list[int]:
        """The row each client's new direction is written into before :meth:`commit`: its
        own entry's row for a returning client (overwritten in place), else the lowest free
        row (the store grows as needed). Call :meth:`expire` first, so that expired rows
        are reused. A row that then holds no usable direction goes back with :meth:`release`."""
        self._check_dim(like)
        used, out = set(self.slot_pid), []
        free = (s for s in range(self.capacity) if s not in used)
        for pid in pids:
            slot = self.pid_slot.get(pid)
            if slot is None:
                slot = next(free, None)
                if slot is None:
                    slot = self.capacity
                    self._grow(slot + 1, like.device)
            out.append(slot)
        return out

    def release(self, pid: int, slot: int) -> None:
        """A claimed row holds no usable direction (a reply with NaN/Inf): if it was the
        client's entry, that entry is gone (its row was being overwritten)."""
        if self.slot_pid.get(slot) == pid:
            del self.slot_pid[slot], self.pid_slot[pid], self.stamp[slot]

    def products(self, rows: torch.Tensor, slots: list[int]) -> np.ndarray:
        """rows @ r_jᵀ with every stored row r_j up to the last of ``slots`` (one matmul, float64
        result, shape (n, capacity); only the columns of stored rows are meaningful)."""
        return self._products(rows, slots)

    def commit(self, server_round: int, pids: list[int], slots: list[int], factors, prods: np.ndarray) -> None:
        """The rows r_i written into ``slots`` (from :meth:`claim`) become the entries of
        ``pids``, c̃_i = ``factors``_i · r_i, stamped ``server_round`` (a returning client's
        previous entry elsewhere is dropped). ``prods`` (n, capacity): r_iᵀ r_j with every stored row
        (:meth:`products` of the same rows), which gives the new Gram rows
        Q_ij = f_i (r_iᵀ r_j) f_j."""
        if len(set(pids)) != len(pids) or len(slots) != len(pids):
            raise ValueError("commit() needs one distinct partition id per claimed slot")
        factors = np.asarray(factors, dtype=np.float64)
        for pid, slot, f in zip(pids, slots, factors):
            old = self.pid_slot.get(pid)
            if old is not None and old != slot:
                del self.slot_pid[old], self.stamp[old]
            self.slot_pid[slot], self.pid_slot[pid], self.stamp[slot] = pid, slot, server_round
            self.factor[slot] = f
        self._set_gram_rows(np.asarray(slots), factors[:, None] * prods * self.factor[None, :])

    def _set_gram_rows(self, new: np.ndarray, block: np.ndarray) -> None:
        """Q[new, :] = Q[:, new]ᵀ = block (n, capacity), one value per new pair."""
        if not new.size:
            return
        self.gram[new, :] = block
        self.gram[:, new] = block.T
        nn = block[:, new]
        self.gram[np.ix_(new, new)] = 0.5 * (nn + nn.T)

    def insert(self, server_round: int, pids: list[int], rows: torch.Tensor, n_new: int,
               scales=None) -> np.ndarray:
        """Store the current clients' directions and update the Gram matrix.

        ``rows`` is a float32 (n_new + e, d) matrix: its first ``n_new`` rows v_i belong
        to ``pids`` and are stored as c̃_i = scales_i · v_i (scales default to 1: one fused
        pass, no separate scaling of the rows); the e extra rows (e.g. ḡ) are only
        multiplied with the entries. Expires old entries first. With 16-bit storage the
        new rows are replaced in place by their stored values c̃_i, so the Gram matrix is
        exactly that of what is stored. Returns the products of the extra rows with every
        entry, (e, m') in ``active_slots()`` order (squeezed when e = 1).
        """
        if len(pids) != n_new or len(set(pids)) != n_new:
            raise ValueError("insert() needs one distinct partition id per new row")
        self._check_dim(rows)
        scales = np.ones(n_new) if scales is None else np.asarray(scales, dtype=np.float64)
        self.expire(server_round)
        new_slots = []
        exact = self.dtype == rows.dtype
        for i, pid in enumerate(pids):
            slot = self._slot_for(pid, rows)
            self.slot_pid[slot], self.pid_slot[pid], self.stamp[slot] = pid, slot, server_round
            self.factor[slot] = 1.0
            torch.mul(rows[i], float(scales[i]), out=self.row(slot))
            if not exact:  # Gram of the stored (rounded) values: Q = C Cᵀ exactly
                rows[i].copy_(self.row(slot))
            new_slots.append(slot)
        slots = self.active_slots()
        prods = self._products(rows, slots) * self.factor[None, :]  # (n_new + e, capacity): rows · c̃_j
        self._set_gram_rows(np.asarray(new_slots, dtype=np.int64),
                            prods[:n_new] * (scales[:, None] if exact else 1.0))  # c̃_iᵀ c̃_j
        extra = prods[n_new:][:, slots]
        return extra[0] if extra.shape[0] == 1 else extra

    def _products(self, rows: torch.Tensor, slots: list[int]) -> np.ndarray:
        """rows @ entriesᵀ over the prefix of slots holding entries: one pass (float32)."""
        out = np.zeros((rows.shape[0], self.capacity), dtype=np.float64)
        if not slots:
            return out
        hi = max(slots) + 1
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
                out.add_(self.row(slot).to(out.dtype), alpha=c)
            return out
        i = 0
        while i < len(slots):
            j = i
            while j + 1 < len(slots) and slots[j + 1] - slots[i] < _GROUP_SPAN:
                j += 1
            lo, hi = slots[i], slots[j] + 1
            vec = torch.zeros(hi - lo, dtype=out.dtype)
            vec[torch.tensor(slots[i : j + 1]) - lo] = torch.tensor(coefs[i : j + 1], dtype=out.dtype)
            out.addmv_(self.store[lo:hi].T, vec.to(out.device))
            i = j + 1
        return out
