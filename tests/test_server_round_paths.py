"""The server round's cheaper paths keep their meaning bit for bit: a model spec's layout
(fedcore.flat.spec_layout: each array's .npy header worked out once), the views, sums and records
read and written through it, reply validation's one pass per array, and a round's requests built
from one validated config."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, RecordDict

from fedcore import flat, keys, replies
from fedcore.flat import spec_of
from strategies import requests
from tests.fakegrid import task_identity


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in arrays.items()})


def _of(arrays: dict[str, Array]) -> ArrayRecord:
    """An ArrayRecord of these very Arrays (ArrayRecord(dict) rebuilds them)."""
    out = ArrayRecord()
    for k, v in arrays.items():
        out[k] = v
    return out


def _model(seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((8, 5)).astype(dtype), "b1": rng.standard_normal(8).astype(dtype),
            "s": np.array(rng.standard_normal(), dtype=dtype), "w2": rng.standard_normal((3, 8)).astype(dtype),
            "empty": np.zeros((0, 4), dtype=dtype), "b2": rng.standard_normal(3).astype(dtype)}


def _lying(array: Array, data) -> Array:
    """An Array whose metadata says one thing and whose bytes hold another (``data`` may be any
    object: Flower checks the type only when an Array is built)."""
    out = Array(array.dtype, tuple(array.shape), array.stype, b"")
    out.data = data
    return out


def _npy(a: np.ndarray) -> bytes:
    return Array(a).data


# -- fedcore.flat: the spec's layout and what is read and written through it ----------------------
def test_spec_layout_headers_are_the_ones_np_save_writes():
    shapes = [(), (0,), (3,), (8, 5), (2, 3, 4), (10**6,), (1, 1, 1, 1, 7)]
    for dtype in (np.float32, np.float64, np.float16, np.int64, np.bool_, np.dtype(">f4")):
        arrays = {f"a{i}": np.zeros(s, dtype=dtype) for i, s in enumerate(shapes)}
        record = _record(arrays)
        layout = flat.spec_layout(spec_of(record))
        assert layout.counts == tuple(a.size for a in arrays.values())
        assert layout.starts == tuple(np.cumsum([0, *layout.counts])[:-1].tolist()) and layout.dim == sum(layout.counts)
        for array, header, nbytes in zip(record.values(), layout.headers, layout.nbytes):
            assert header is not None and array.data.startswith(header) and len(array.data) == nbytes
    assert flat.spec_layout(spec_of(_record(_model()))) is flat.spec_layout(spec_of(_record(_model(1))))


def test_spec_layout_is_kept_for_a_bounded_number_of_specs():
    for n in range(1, 200):
        flat.spec_layout(spec_of(_record({"w": np.zeros(n, np.float32)})))
    assert 0 < len(flat._LAYOUTS) <= 64
    spec = spec_of(_record({"w": np.zeros(3, np.float32)}))
    assert flat.spec_layout(spec).spec == spec  # a spec forgotten is worked out again


def test_record_views_are_the_array_views_whatever_the_bytes():
    model = _model()
    record = _record(model)
    layout = flat.spec_layout(spec_of(record))
    odd = {
        "w1": Array(np.asfortranarray(model["w1"])),  # an honest Fortran-ordered array: the general path
        "b1": _lying(record["b1"], bytearray(record["b1"].data)),  # bytes that are not `bytes`
        "s": record["s"],
        "w2": _lying(record["w2"], _npy(model["w2"].astype(np.float64))),  # another dtype in the bytes
        "empty": record["empty"],
        "b2": _lying(record["b2"], record["b2"].data[:-4] + _npy(np.zeros(1, np.float32))[-4:]),
    }
    for rec in (record, _of(odd), _of(dict(list(odd.items())[:3]))):
        got = flat.record_views(rec, layout)
        want = [flat.array_view(a).reshape(-1) for a in rec.values()]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    views = flat.record_views(record, layout)
    assert all(np.shares_memory(v, np.frombuffer(a.data, np.uint8)) for v, a in zip(views, record.values()) if v.size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [None, 7, 40])
def test_weighted_sum_views_is_weighted_sum_bit_for_bit(monkeypatch, dtype, block):
    """One block (each reply's arrays end to end in its row) and several (BLOCK_ELEMS small)."""
    if block is not None:
        monkeypatch.setattr(flat, "BLOCK_ELEMS", block)
    records = [_record(_model(seed)) for seed in range(5)]
    weights = torch.tensor([3.0, 1.0, 7.0, 2.0, 5.0], dtype=torch.float64) / 18
    layout = flat.spec_layout(spec_of(records[0]))
    want = flat.weighted_sum(records, weights, dtype=dtype)
    views = [flat.record_views(r, layout) for r in records]
    got = flat.weighted_sum_views(views, weights, dtype=dtype)
    assert got.dtype == want.dtype and torch.equal(got, want)
    buf = np.full(10**4, np.nan, dtype=torch.empty(0, dtype=dtype).numpy().dtype)  # a kept buffer, any content
    assert torch.equal(flat.weighted_sum_views(views, weights, dtype=dtype, buf=buf), want)
    with pytest.raises(ValueError, match="reply 1 has arrays of sizes"):
        flat.weighted_sum_views([views[0], views[1][:-1]], weights[:2])


def test_record_to_flat_views_and_flat_to_record_are_flowers_conversions():
    for dtype in (np.float32, np.float64, np.float16, np.int64):
        record = _record(_model(3, dtype))
        spec = spec_of(record)
        views = flat.record_views(record, flat.spec_layout(spec))
        for out in (torch.float32, torch.float64):
            assert torch.equal(flat.record_to_flat_views(views, out), flat.record_to_flat(record, dtype=out))
        vec = flat.record_to_flat(record) * 1.5
        got, values = flat.flat_to_record(vec, spec), vec.numpy()
        assert list(got.keys()) == list(spec.keys)
        for k, shape, dt, (a, b) in zip(spec.keys, spec.shapes, spec.dtypes, spec.offsets()):
            want = Array(np.ascontiguousarray(values[a:b], dtype=dt).reshape(shape))  # Flower's own
            assert (got[k].data, got[k].dtype, tuple(got[k].shape), got[k].stype) == \
                   (want.data, want.dtype, tuple(want.shape), want.stype), k
    spec = spec_of(_record(_model()))
    with pytest.raises(ValueError):  # a vector of another length
        flat.flat_to_record(torch.zeros(3), spec)


# -- fedcore.replies: one pass per array, the same reasons and norms --------------------------------
def _old_check_arrays(record, spec, what, theta=None):
    """The check before the one-pass rewrite (the reference the new one must equal)."""
    if not isinstance(record, ArrayRecord):
        return f"{what}: not an ArrayRecord", math.nan
    got = tuple(record.keys())
    if got != spec.keys:
        missing = sorted(set(spec.keys) - set(got))
        extra = sorted(set(got) - set(spec.keys))
        if missing or extra:
            return f"{what}: missing arrays {missing[:3]} extra arrays {extra[:3]}", math.nan
        return f"{what}: arrays in a different order", math.nan
    sq = 0.0
    for key, arr, shape, dtype in zip(spec.keys, record.values(), spec.shapes, spec.dtypes):
        if tuple(arr.shape) != shape:
            return f"{what}: array '{key}' has shape {tuple(arr.shape)}, expected {shape}", math.nan
        if str(arr.dtype) != dtype:
            return f"{what}: array '{key}' has dtype {arr.dtype}, expected {dtype}", math.nan
        try:
            reason = replies.payload_error(arr, shape, dtype)
            view = flat.array_view(arr) if reason is None else None
        except Exception as exc:  # noqa: BLE001
            reason = f"cannot be decoded ({type(exc).__name__})"
        if reason is not None:
            return f"{what}: array '{key}' {reason}", math.nan
        if theta is not None and view.size:
            diff = view.reshape(-1).astype(np.float64)
            diff -= theta[key]
            part = float(np.dot(diff, diff))
            if not math.isfinite(part) and not np.isfinite(view).all():
                return f"{what}: array '{key}' holds NaN or Inf", math.nan
            sq += part
        elif view.size and not np.isfinite(view).all():
            return f"{what}: array '{key}' holds NaN or Inf", math.nan
    return None, (math.sqrt(sq) if theta is not None else math.nan)


def _variants(seed: int) -> list[ArrayRecord]:
    rng = np.random.default_rng(seed)
    model = {k: np.asarray(v + rng.standard_normal(v.shape).astype(v.dtype) * 0.1) for k, v in _model().items()}
    record = _record(model)
    out = [record, _record({k: np.asarray(v * 1e20) for k, v in model.items()})]  # huge, finite
    for key in ("w1", "s", "b2"):
        bad = dict(model)
        bad[key] = np.full_like(model[key], np.nan) if key != "b2" else np.full_like(model[key], np.inf)
        out.append(_record(bad))
    a = record["w1"]
    lies = [_lying(a, a.data + b"\0"), _lying(a, _npy(model["w1"].astype(np.float64))), _lying(a, _npy(np.ones(9))),
            _lying(a, bytearray(a.data)), _lying(a, a.data[:20]), Array(np.asfortranarray(model["w1"])),
            Array("float32", (8, 5), "numpy.ndarray", b"\x93NUMPY\x09\x00" + a.data[8:]),
            Array("float64", (8, 5), "numpy.ndarray", a.data), Array("float32", (5, 8), "numpy.ndarray", a.data)]
    for lie in lies:
        out.append(_of({**dict(record.items()), "w1": lie}))
    out.append(_of({k: record[k] for k in reversed(list(record.keys()))}))
    out.append(_of({k: record[k] for k in list(record.keys())[:-1]}))
    return out


def test_check_arrays_gives_the_reasons_and_norms_it_gave():
    theta = _record(_model())
    spec = spec_of(theta)
    views = replies.theta_views(theta, spec)
    want_views = {k: flat.array_view(a).reshape(-1).astype(np.float64) for k, a in theta.items()}
    assert list(views) == list(want_views)
    assert all(views[k].dtype == np.float64 and np.array_equal(views[k], want_views[k]) for k in views)
    n = 0
    for seed in range(3):
        for record in _variants(seed):
            for th in (views, None):
                got = replies._check_arrays(record, spec, "model", th)
                want = _old_check_arrays(record, spec, "model", th)
                assert got[0] == want[0]
                assert (math.isnan(got[1]) and math.isnan(want[1])) or got[1] == want[1]
                n += got[0] is not None
    assert n > 10  # the variants reach the reasons


def test_median_is_numpys_without_its_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replies.median([3, 1.0, np.float32(2.0)]) == 2.0 and replies.median([4.0, 1.0]) == 2.5
        assert math.isnan(replies.median([1.0, math.nan, 2.0])) and math.isnan(replies.median([]))
        assert math.isnan(replies.median([math.inf, -math.inf])) and replies.median([1.7e308] * 2) == math.inf


# -- strategies.requests: one validated config per round, one content per message -------------------
class _Method:
    client_method = "fedavg"

    def __init__(self, client_records, round_records) -> None:
        self._client, self._round = client_records, round_records

    def request(self, server_round, state, current):
        from strategies.base import Request

        return Request({"mu": 0.5, "beta": [1.0, 2.0]}, self._round)

    def client_records(self, state, client, current):
        return self._client.get(client, {})


class _Strategy:
    want_loss_before = False
    state = None

    def __init__(self, client_records=None, round_records=None, **names):
        self.method = _Method(client_records or {}, round_records or {})
        self.__dict__.update(names)

    def round_lr(self, server_round):
        return 0.1


def _old_message(strategy, server_round, arrays, config, node, client, context):
    """A train request as it was built before (one ConfigRecord and RecordDict per message)."""
    base = requests.request_config(strategy, server_round, config, arrays)
    records = dict(strategy.method.request(server_round, None, arrays).records)
    cfg = ConfigRecord(base if client is None else {**base, keys.PARTITION_ID: client})
    content = {**requests._records(strategy, arrays, cfg), **records,
               **strategy.method.client_records(None, client, arrays)}
    if context.run_record is not None:
        content[keys.RUN_CONFIG] = context.run_record
    return RecordDict(content), node


def _as_plain(content: RecordDict) -> list:
    return [(k, type(v).__name__, dict(v.items()) if isinstance(v, ConfigRecord) else id(v))
            for k, v in content.items()]


@pytest.mark.parametrize("case", ["plain", "client-records", "flower-names", "record-named-config", "no-run-config",
                                  "node-data"])
def test_train_requests_hold_what_one_record_per_message_held(case):
    arrays = _record(_model())
    extra = ArrayRecord({"c": Array(np.ones(2, np.float32))})
    strategy = {
        "plain": _Strategy(round_records={"c": extra}),
        "client-records": _Strategy(client_records={3: {"ci": extra}}, round_records={"c": extra}),
        "flower-names": _Strategy(arrayrecord_key="model", configrecord_key="cfg"),
        "record-named-config": _Strategy(round_records={keys.CONFIG: ConfigRecord({"x": 1})}),
        "no-run-config": _Strategy(),
        "node-data": _Strategy(round_records={"c": extra}),
    }[case]
    run_config = {"seed": 1, "method": "fedavg"}
    if case == "node-data":  # what the server learned from the nodes travels in the run-config record
        run_config.update({"client-data": "node", "input-shape": "1x8x8", "num-classes": 10, "data-mean": "0.5",
                           "data-std": "0.2"})
    context = requests.RunContext(run_config=None if case == "no-run-config" else run_config)
    targets = {1001: 1, 1003: 3, 1005: None, 1002: 2}
    with task_identity():
        msgs = requests.train_requests(strategy, 4, arrays, ConfigRecord({"extra": "x"}), targets, context)
        want = [_old_message(strategy, 4, arrays, ConfigRecord({"extra": "x"}), n, c, context)
                for n, c in targets.items()]
    assert [int(m.metadata.dst_node_id) for m in msgs] == list(targets)
    assert all(m.metadata.message_type == MessageType.TRAIN and m.metadata.group_id == "4" for m in msgs)
    assert [_as_plain(m.content) for m in msgs] == [_as_plain(c) for c, _ in want]
    if case == "node-data":
        assert all(dict(m.content[keys.RUN_CONFIG]) == {"input-shape": "1x8x8", "num-classes": 10, "data-mean": "0.5",
                                                        "data-std": "0.2"} for m in msgs)
    else:
        assert all(keys.RUN_CONFIG not in m.content for m in msgs)
    # each message owns its content and its config: changing one changes no other
    config_key = getattr(strategy, "configrecord_key", keys.CONFIG)
    msgs[0].content["added"] = ConfigRecord({"y": 2})
    assert all("added" not in m.content for m in msgs[1:])
    if case != "record-named-config":  # else the strategy's one record, shared as it always was
        msgs[0].content[config_key]["lr-changed"] = 1.0
        assert all("lr-changed" not in m.content[config_key] for m in msgs[1:])
    assert len({id(m.content) for m in msgs}) == len(msgs)


def test_requests_with_a_bad_config_value_fail_as_before_and_no_target_builds_nothing():
    strategy = _Strategy()
    context = requests.RunContext()
    with task_identity():
        assert requests.train_requests(strategy, 1, _record(_model()), ConfigRecord(), {}, context) == []
        with pytest.raises(TypeError):
            requests.train_requests(strategy, 1, _record(_model()), {"bad": object()}, {1001: 1}, context)


def test_evaluate_requests_hold_what_they_held():
    strategy = _Strategy()
    arrays = _record(_model())
    context = requests.RunContext(run_config={"seed": 1})
    targets = {1001: 1, 1002: None}
    with task_identity():
        msgs = requests.evaluate_requests(strategy, 3, arrays, None, targets, context)
    for m, client in zip(msgs, targets.values()):
        base = requests.request_config(strategy, 3, None, arrays)
        want = {**base, keys.PARTITION_ID: client} if client is not None else base
        assert m.metadata.message_type == MessageType.EVALUATE and m.metadata.group_id == "eval-3"
        assert list(m.content.keys()) == [keys.ARRAYS, keys.CONFIG]
        assert dict(m.content[keys.CONFIG].items()) == want and m.content[keys.ARRAYS] is arrays
