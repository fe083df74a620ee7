"""One flat parameter vector per model: the shared conversion every method uses.

Flower moves models as ``ArrayRecord``s whose ``Array.data`` holds ``np.save`` bytes.
Deserialising each array with ``Array.numpy()`` copies it through a BytesIO; here the
array bytes are viewed in place (``np.frombuffer`` past the ``.npy`` header) and copied
once, straight into a preallocated row of the (m, d) update matrix.
"""

from __future__ import annotations

import dataclasses
import io
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # pure maths stays importable without Flower
    from flwr.app import ArrayRecord


@dataclasses.dataclass(frozen=True)
class FlatSpec:
    """Names, shapes and dtypes of a model's arrays, in ArrayRecord order."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    @property
    def dim(self) -> int:
        return int(sum(self.sizes))

    def offsets(self) -> list[tuple[int, int]]:
        out, start = [], 0
        for n in self.sizes:
            out.append((start, start + n))
            start += n
        return out


def spec_of(arrays: ArrayRecord) -> FlatSpec:
    return FlatSpec(
        keys=tuple(arrays.keys()),
        shapes=tuple(tuple(int(s) for s in a.shape) for a in arrays.values()),
        dtypes=tuple(str(a.dtype) for a in arrays.values()),
    )


# .npy headers already parsed: header bytes -> (shape, fortran, dtype, data offset, element count). A
# run sends the same few (shape, dtype) headers thousands of times; numpy parses each with
# ast.literal_eval, several arrays per reply and pass (docs/performance.md, rule 5).
_HEADERS: dict[bytes, tuple] = {}
_MAGIC = b"\x93NUMPY"


def _parsed(buf) -> tuple:
    """(shape, fortran, dtype, offset, count) of the .npy bytes ``buf``."""
    key = None
    if buf[:6] == _MAGIC and buf[6] in (1, 2):
        width = 2 if buf[6] == 1 else 4
        end = 8 + width + int.from_bytes(buf[8:8 + width], "little")
        key = bytes(buf[:end])
        hit = _HEADERS.get(key)
        if hit is not None:
            return hit
    fp = io.BytesIO(buf)  # shares the bytes (copy-on-write): no copy here
    version = np.lib.format.read_magic(fp)
    read_header = (
        np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read_header(fp)
    out = (shape, fortran, dtype, fp.tell(), int(np.prod(shape, dtype=np.int64)))
    if key is not None and len(key) == out[3]:
        if len(_HEADERS) > 4096:
            _HEADERS.clear()
        _HEADERS[key] = out
    return out


def _npy_header(buf) -> tuple:
    """(shape, fortran, dtype, offset) of the .npy bytes ``buf``."""
    return _parsed(buf)[:4]


def header_cache_size() -> int:
    """How many distinct .npy headers :func:`array_view` holds parsed."""
    return len(_HEADERS)


def clear_header_cache() -> None:
    """Forget the parsed .npy headers (the next read of each parses it again)."""
    _HEADERS.clear()


def array_view(array) -> np.ndarray:
    """A read-only numpy view of a Flower ``Array`` without copying its data."""
    buf = array.data
    shape, fortran, dtype, offset, count = _parsed(buf)
    if fortran or dtype.hasobject:
        return array.numpy()
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)


def record_to_flat(arrays: ArrayRecord, out: torch.Tensor | None = None, dtype=torch.float32) -> torch.Tensor:
    """The model as one (d,) tensor (written into ``out`` when given)."""
    views = [array_view(a).reshape(-1) for a in arrays.values()]
    d = sum(v.size for v in views)
    if out is None:
        out = torch.empty(d, dtype=dtype)
    elif out.numel() != d:
        raise ValueError(f"model has {d} parameters, the output row has {out.numel()}")
    start = 0
    out_np = out.numpy()
    for v in views:
        out_np[start : start + v.size] = v  # one copy (with dtype cast if needed)
        start += v.size
    return out


def records_to_matrix(records: list[ArrayRecord], dtype=torch.float32) -> torch.Tensor:
    """Stack m models into an (m, d) tensor."""
    if not records:
        return torch.empty(0, 0, dtype=dtype)
    d = sum(int(np.prod(a.shape, dtype=np.int64)) for a in records[0].values())
    out = torch.empty(len(records), d, dtype=dtype)
    for i, rec in enumerate(records):
        record_to_flat(rec, out=out[i], dtype=dtype)
    return out


def records_to_deltas(current: torch.Tensor, records: list[ArrayRecord],
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Δ_i = θ_t − θ_i as an (m, d) matrix, computed straight from the reply bytes.

    One pass per reply (no copy of θ_i before the subtraction). ``out``, when given, is a
    persistent buffer of at least m rows of ``current``'s dtype; reusing it across rounds
    spares the page faults of a fresh (m, d) allocation, which at ResNet-18 size cost about as
    much as the subtraction itself (docs/performance.md, rule 5). Shared helper: any method that
    works on the raw updates can use it.
    """
    m, d = len(records), current.numel()
    if out is None:
        out = torch.empty(m, d, dtype=current.dtype)
    elif out.shape[0] < m or out.shape[1] != d or out.dtype != current.dtype:
        raise ValueError(f"delta buffer {tuple(out.shape)} {out.dtype} cannot hold {m} x {d} {current.dtype}")
    cur = current.numpy()
    rows = out.numpy()
    for i, rec in enumerate(records):
        start = 0
        for array in rec.values():
            v = array_view(array).reshape(-1)
            if start + v.size > d:
                raise ValueError(f"reply {i} has more than the model's {d} parameters")
            np.subtract(cur[start : start + v.size], v, out=rows[i, start : start + v.size])
            start += v.size
        if start != d:
            raise ValueError(f"reply {i} has {start} parameters, the model {d}")
    return out[:m]


def deltas_into(
    current: torch.Tensor,
    records: list[ArrayRecord],
    rows: torch.Tensor,
    copies: list[torch.Tensor] | None = None,
    block: int = 1 << 16,
) -> np.ndarray:
    """Δ_i = ``current`` − θ_i of every record into ``rows[i]`` and ``copies[i]``; ‖Δ_i‖².

    One pass over the replies' bytes, block by cache-sized block: each block of Δ_i is
    computed into ``rows[i]``, then copied into ``copies[i]`` (a (d,) host tensor, e.g. a
    row of a cache) and squared while it is still in the cache, so the copy and the norm
    cost a fraction of the passes over d they would take afterwards. ‖Δ_i‖² is the float64
    sum of the blocks' float32 dot products: NaN or Inf when reply i holds NaN/Inf (its rows
    are written all the same: the caller drops it). Host tensors of ``current``'s dtype;
    ``rows`` (≥ len(records), d). A BLAS matrix-vector product per block (to fold a weighted sum
    in) costs many times the pass: a threaded BLAS wakes its threads for each call (figures:
    docs/performance.md, rule 5).
    """
    d, m = current.numel(), len(records)
    if m == 0:
        return np.zeros(0)
    if rows.shape[0] < m or rows.shape[1] != d:
        raise ValueError(f"row buffer {tuple(rows.shape)} cannot hold {m} x {d}")
    cur, out = current.numpy(), rows.numpy()
    extra = None if copies is None else [c.numpy() for c in copies]
    sq = np.zeros(m)
    per_record = [list(rec.values()) for rec in records]
    if any(len(arrays) != len(per_record[0]) for arrays in per_record):
        raise ValueError("replies hold different numbers of arrays")
    start = 0
    for a in range(len(per_record[0])):
        views = [array_view(arrays[a]).reshape(-1) for arrays in per_record]
        n = views[0].size
        if any(v.size != n for v in views) or start + n > d:
            raise ValueError(f"replies' array {a} sizes {[v.size for v in views]} "
                             f"do not fit the model's {d} parameters")
        for lo in range(0, n, block):
            hi = min(lo + block, n)
            c0, c1 = start + lo, start + hi
            for i, v in enumerate(views):
                blk = out[i, c0:c1]
                np.subtract(cur[c0:c1], v[lo:hi], out=blk)
                if extra is not None:
                    extra[i][c0:c1] = blk
                sq[i] += float(np.dot(blk, blk))
        start += n
    if start != d:
        raise ValueError(f"replies have {start} parameters, the model {d}")
    return sq


BLOCK_ELEMS = 1 << 22  # an (m, columns) float32 block of 16 MB: large enough that each
# product is one substantial BLAS call (many tiny calls stall on thread barriers when
# the cores are shared), small enough that no (m, d) matrix is ever built


def weighted_sum(records: list[ArrayRecord], weights: torch.Tensor, out: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Σ_i w_i θ_i (float32, or ``dtype``: float64 for a float64 model) for m ArrayRecords, without stacking them.

    Equals ``weights.float() @ records_to_matrix(records)`` bit for bit: each column block is the
    same float32 matrix-vector product over the same m values in the same order
    (``tests/test_benchmarks_perf.py`` checks it). The matrix was a first-touch allocation of m × d
    floats, a large part of FedAvg's round (docs/performance.md, rule 5). ``out``: a (d,) float32
    tensor to write into.
    """
    views = [[array_view(a).reshape(-1) for a in rec.values()] for rec in records]
    return weighted_sum_views(views, weights, out=out, dtype=dtype)


class UpdateWriter:
    """Writes a round's updates Δ_i = θ_t − θ_i into rows a kernel keeps across rounds (FedPCD's
    work rows, CRAFT's matrix; :meth:`strategies.base.Round.write_updates`), and keeps what
    that needs from round to round: θ_t's float32 host vector (a fresh (d,) tensor per round
    costs its first-touch page faults: ~45 MB at ResNet-18) and one (pinned) host row through
    which rows outside host memory are written (``server-device`` cuda)."""

    def __init__(self) -> None:
        self._theta: torch.Tensor | None = None
        self._staging: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """The memory the kept buffers hold."""
        return sum(t.numel() * t.element_size() for t in (self._theta, self._staging) if t is not None)

    def theta(self, arrays: ArrayRecord) -> torch.Tensor:
        """θ_t as a float32 host vector, written into the kept buffer."""
        d = sum(int(np.prod(a.shape, dtype=np.int64)) for a in arrays.values())
        if self._theta is None or self._theta.numel() != d:
            self._theta = torch.empty(d, dtype=torch.float32)
        return record_to_flat(arrays, out=self._theta)

    def write(self, theta: torch.Tensor, records: list[ArrayRecord], rows: torch.Tensor,
              copies: list[torch.Tensor] | None = None, norms: bool = False) -> np.ndarray | None:
        """Δ_i of each record into ``rows[i]`` (and ``copies[i]``), straight from the reply bytes;
        ‖Δ_i‖² (float64) when ``norms`` (or ``copies``) asks for them, else None. In host memory one
        pass does it all (:func:`records_to_deltas`, :func:`deltas_into`); other devices: :meth:`stage`."""
        if rows.device.type != "cpu":
            return self.stage(theta, records, rows, copies, norms)
        if copies is None and not norms:
            records_to_deltas(theta, records, out=rows)
            return None
        return deltas_into(theta, records, rows, copies)

    def stage(self, theta: torch.Tensor, records: list[ArrayRecord], rows: torch.Tensor,
              copies: list[torch.Tensor] | None = None, norms: bool = False) -> np.ndarray | None:
        """:meth:`write` through the host row, copied to ``rows[i]`` on any device (tests run it on
        the CPU); the copies and the norms then in torch on the rows' device."""
        d, m = theta.numel(), len(records)
        if self._staging is None or self._staging.shape[1] != d:
            self._staging = torch.empty(1, d, dtype=theta.dtype, pin_memory=torch.cuda.is_available())
        for i, rec in enumerate(records):
            rows[i].copy_(records_to_deltas(theta, [rec], out=self._staging)[0])
        for i in range(m if copies is not None else 0):
            copies[i].copy_(rows[i])
        if copies is None and not norms:
            return None
        return torch.linalg.vector_norm(rows[:m], dim=1).double().cpu().numpy() ** 2


# .npy headers already written: (dtype, shape) -> (the header bytes np.save writes, Array.dtype).
_SAVED: dict[tuple, tuple[bytes, str]] = {}


def to_array(ndarray: np.ndarray):
    """``flwr.app.Array(ndarray)``, the same bytes (``np.save``'s), at a fraction of the cost: the
    ``.npy`` header of each (dtype, shape) is written once, and the data is copied once, straight
    after it. ``np.save`` through a BytesIO formats and pads the header on every call, which costs
    more than copying a small model's data (six arrays per MLP reply and request; docs/performance.md,
    rule 5)."""
    from flwr.app import Array

    if not ndarray.flags.c_contiguous or ndarray.dtype.hasobject:
        return Array(ndarray)  # np.save writes these in another layout: its own path
    key = (ndarray.dtype.str, ndarray.shape)
    hit = _SAVED.get(key)
    if hit is None:
        array = Array(ndarray)
        if len(_SAVED) > 4096:
            _SAVED.clear()
        _SAVED[key] = (array.data[: _parsed(array.data)[3]], array.dtype)
        return array
    header, dtype = hit
    return Array(dtype=dtype, shape=ndarray.shape, stype="numpy.ndarray",
                 data=b"".join((header, ndarray.reshape(-1).view(np.uint8))))


def state_to_record(state) -> ArrayRecord:
    """``ArrayRecord(state)`` of a torch ``state_dict`` (name → tensor), the same record
    (:func:`to_array` per tensor, on the host)."""
    from flwr.app import ArrayRecord

    record = ArrayRecord()
    for name, tensor in state.items():
        record[name] = to_array(tensor.detach().cpu().numpy())
    return record


def flat_to_record(flat: torch.Tensor, spec: FlatSpec) -> ArrayRecord:
    """Inverse of :func:`record_to_flat` (arrays get the spec's shapes and dtypes)."""
    from flwr.app import ArrayRecord

    flat_np = flat.detach().cpu().numpy()
    record = ArrayRecord()
    for key, shape, dt, (a, b) in zip(spec.keys, spec.shapes, spec.dtypes, spec.offsets()):
        # reshaped after the copy: np.ascontiguousarray returns at least 1-d, so a 0-dim array
        # (a scalar nn.Parameter) would come back with shape (1,)
        record[key] = to_array(np.ascontiguousarray(flat_np[a:b], dtype=dt).reshape(shape))
    return record


def model_deltas(current: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """Δ_i = θ_t − θ_i for each row of ``local`` (in place on ``local``: no second copy)."""
    return torch.sub(current.unsqueeze(0), local, out=local)


# -- one model spec's facts, worked out once per run ------------------------------------------------
# The readers below give what the ones above give (the same views and sums) for
# the records of one spec: what they would work out anew for every array of every record (each
# array's place, dtype, .npy header) is worked out once per spec (:func:`spec_layout`).


@dataclasses.dataclass(frozen=True)
class SpecLayout:
    """What a :class:`FlatSpec` fixes for every record of a run (:func:`spec_layout`): per array
    its numpy dtype, element count and first index in the flat vector (``dim`` in all), and the
    ``.npy`` header ``np.save`` writes for its shape and dtype with the byte length of such an
    array's data (None and -1 where no such header could be made: those arrays take the general
    path)."""

    spec: FlatSpec
    dtypes: tuple[np.dtype | None, ...]
    counts: tuple[int, ...]
    starts: tuple[int, ...]
    dim: int
    headers: tuple[bytes | None, ...]
    nbytes: tuple[int, ...]

    @property
    def largest(self) -> int:
        return max(self.counts, default=0)


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes | None:
    """The ``.npy`` header ``np.save`` writes for a C-ordered array of ``shape`` and ``dtype``
    (format 1.0, the one it writes whenever the header fits), checked by reading it back; None
    when it cannot be made or does not read back as exactly that array."""
    try:
        fp = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            fp, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)})
        header = fp.getvalue()
        got_shape, fortran, got_dtype, offset, _ = _parsed(header)
    except Exception:  # noqa: BLE001 - no header: the general path reads these arrays
        return None
    if (tuple(got_shape) != tuple(shape) or fortran or got_dtype != dtype or got_dtype.hasobject
            or offset != len(header)):
        return None
    return header


_LAYOUTS: dict[FlatSpec, SpecLayout] = {}


def spec_layout(spec: FlatSpec) -> SpecLayout:
    """The spec's :class:`SpecLayout`, worked out at its first use (kept for up to 64 specs: a run
    has one)."""
    hit = _LAYOUTS.get(spec)
    if hit is not None:
        return hit
    dtypes, headers, nbytes, counts, starts, start = [], [], [], [], [], 0
    for shape, name in zip(spec.shapes, spec.dtypes):
        count = int(np.prod(shape, dtype=np.int64))
        try:
            dtype = np.dtype(name)
        except TypeError:
            dtype = None
        header = npy_header(shape, dtype) if dtype is not None and str(dtype) == name else None
        dtypes.append(dtype)
        headers.append(header)
        nbytes.append(len(header) + count * dtype.itemsize if header is not None else -1)
        counts.append(count)
        starts.append(start)
        start += count
    layout = SpecLayout(spec, tuple(dtypes), tuple(counts), tuple(starts), start, tuple(headers), tuple(nbytes))
    if len(_LAYOUTS) >= 64:
        _LAYOUTS.clear()
    _LAYOUTS[spec] = layout
    return layout


def record_views(record: ArrayRecord, layout: SpecLayout) -> list[np.ndarray]:
    """``[array_view(a).reshape(-1) for a in record.values()]``, the same views: an array whose
    bytes are the spec's header and exactly its data is viewed at once, any other through
    :func:`array_view` (a record of another length wholly so)."""
    arrays = list(record.values())
    if len(arrays) != len(layout.counts):
        return [array_view(a).reshape(-1) for a in arrays]
    out = []
    for array, header, nbytes, dtype, count in zip(arrays, layout.headers, layout.nbytes, layout.dtypes,
                                                   layout.counts):
        data = array.data
        if header is not None and type(data) is bytes and len(data) == nbytes and data.startswith(header):
            out.append(np.frombuffer(data, dtype=dtype, count=count, offset=len(header)))
        else:
            out.append(array_view(array).reshape(-1))
    return out


def concat_into(views: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """The views end to end in the flat ``out`` (one copy; cast as an assignment casts)."""
    if all(v.dtype == out.dtype for v in views) and sum(v.size for v in views) == out.size:
        return np.concatenate(views, out=out)
    start = 0
    for v in views:
        out[start : start + v.size] = v
        start += v.size
    if start != out.size:
        raise ValueError(f"the arrays hold {start} values, the output {out.size}")
    return out


def record_to_flat_views(views: list[np.ndarray], dtype=torch.float32) -> torch.Tensor:
    """:func:`record_to_flat` of the record whose :func:`record_views` are ``views``."""
    out = torch.empty(sum(v.size for v in views), dtype=dtype)
    concat_into(views, out.numpy())
    return out


def weighted_sum_views(views: list[list[np.ndarray]], weights: torch.Tensor, out: torch.Tensor | None = None,
                       dtype: torch.dtype = torch.float32, buf: np.ndarray | None = None) -> torch.Tensor:
    """:func:`weighted_sum` of the records whose :func:`record_views` are ``views``: the same
    column blocks, the same matrix-vector product on each, so the same bits. ``buf``: a flat
    array of the blocks' dtype to build them in when it is large enough (a fresh one otherwise)."""
    sizes = [v.size for v in views[0]]
    for i, vs in enumerate(views):
        if [v.size for v in vs] != sizes:
            raise ValueError(f"reply {i} has arrays of sizes {[v.size for v in vs]}, the first reply {sizes}")
    m, d = len(views), int(sum(sizes))
    if out is None:
        out = torch.empty(d, dtype=dtype)
    w = weights.to(out.dtype)
    cols = max(1, min(d, BLOCK_ELEMS // max(m, 1)))
    np_dtype = torch.empty(0, dtype=out.dtype).numpy().dtype
    if buf is None or buf.dtype != np_dtype or buf.size < m * cols:
        buf = np.empty(m * cols, dtype=np_dtype)
    if cols == d:  # one block: each record's arrays end to end in its row
        block = buf[: m * d].reshape(m, d)
        for i, vs in enumerate(views):
            concat_into(vs, block[i])
        torch.mv(torch.from_numpy(block).T, w, out=out[0:d])
        return out
    starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    k = 0  # first array overlapping the block
    for a in range(0, d, cols):
        e = min(a + cols, d)
        block = buf[: m * (e - a)].reshape(m, e - a)
        while starts[k + 1] <= a:
            k += 1
        j = k
        while j < len(sizes) and starts[j] < e:  # the arrays' pieces inside [a, e)
            lo, hi = max(a, starts[j]), min(e, starts[j + 1])
            for i in range(m):
                block[i, lo - a : hi - a] = views[i][j][lo - starts[j] : hi - starts[j]]  # one copy
            j += 1
        torch.mv(torch.from_numpy(block).T, w, out=out[a:e])
    return out
