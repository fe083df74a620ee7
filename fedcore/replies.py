"""Reply validation: a bad reply from one client is dropped and reported, never a crash.

Flower's own FedAvg raises on inconsistent replies and takes the ServerApp down with it;
every strategy here filters its replies through :func:`validate_train_replies` first
(the one gate, :mod:`strategies.gate`), so a method only sees well-formed ones.

Well-formed is not enough: every number a client sends is checked against what the server
knows (:class:`ReplyLimits`), and a reply that fails is dropped with its reason:

* **counts** — ``num-examples`` must be a finite whole number in [1, the client's bound]:
  its training size known to the server (``train_sizes``: the app's partitions, or with
  ``client-data = "node"`` the node's first QUERY report capped at ``max-num-examples``),
  else ``max-num-examples`` (default :data:`DEFAULT_MAX_NUM_EXAMPLES`, for a foreign app's
  clients whose sizes the server never learns). Every method and wrapper that weights by
  count (FedAvg's p_i, the update clip, central DP, Flower's robust rules, secure
  aggregation's clear metrics) only sees counts that passed, so Σ n_i is finite and > 0 in
  float64;
* **sizes** — the update norm ‖θ_t − θ_i‖, computed in float64 in the pass that checks the
  arrays, must be finite and at most ``max-update-ratio`` × the round's median norm (default
  :data:`DEFAULT_MAX_UPDATE_RATIO`; 0 = off). The ratio rule needs a median to trust: with
  fewer than :data:`MIN_REPLIES_FOR_RATIO` valid replies (the median of two is their mean,
  which a huge one drags along) or a median of 0 (free riders) it is skipped and only the
  finiteness check holds;
* **method values** — the values a method declares it reads, each in its range (``check``:
  FedeRage's β in its box; :class:`strategies.base.Reads`);
* **scores** — :func:`check_eval_reply`: accuracy in [0, 1], loss finite and ≥ 0, ``num-test``
  a count bounded like ``num-examples`` (by the test size the server knows).

Before any of these, **one reply per node per round, this round's only, from the client the
server assigned** (:func:`round_drops`, :func:`identity_problem`; training and evaluation alike,
for every strategy and any grid; docs/hostile.md, "One reply per node per round"):

* **this round's** — a reply whose ``group_id`` is not the round's (train requests carry
  ``str(round)``, evaluate requests ``f"eval-{round}"``) is dropped; where the request's message id
  is known (a grid that assigns ids: Flower's, the local engine), a reply whose
  ``reply_to_message_id`` is not the id of the request this round sent to its node is dropped too.
  A reply built outside Flower's runtime carries no group id and its request no message id: then
  the check that has nothing to compare is skipped;
* **once** — a node that answers a round more than once counts once: its **first** reply of the
  round (in the order the grid delivered them) is the one validated, every later one is dropped
  ("second reply from node N"), whatever either holds; a copy can neither add weight nor replace
  the first. Two nodes speaking for one client: the second is dropped;
* **the server assigns identity** — a client asked by partition id is that partition (a reply
  naming another is dropped). A client known by its node id only (Flower's own sampling, every
  foreign app) is the ``partition-id`` its node reported in its first valid reply, else its node
  id, recorded in :attr:`ReplyTrust.identities` (checkpointed): a later reply claiming another
  client, or a claim that another node holds (or that two new nodes make in one round), is
  dropped. A client served by a new node (a restarted SuperNode of a foreign app) is therefore
  refused until the run restarts; the app's own runs ask by partition id and never meet this.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from fedcore import keys
from fedcore.config import APP
from fedcore.flat import FlatSpec, _npy_header, array_view, record_views, spec_layout

# num-examples bound for a client whose training size the server does not know (a foreign
# app's clients): above any single client of the benchmarks here (the largest whole training
# set, FEMNIST's, is ~0.7 M examples) and 10⁶× below what zeroes a float32 FedAvg; raise it
# (max-num-examples) for cross-silo clients holding more.
DEFAULT_MAX_NUM_EXAMPLES = APP["max-num-examples"].default
# max-update-ratio: honest digits MLP/CNN rounds stay below 5× the round's median update norm
# (docs/results/robustness_digits.md, "Issue 23: the numbers a client sends", its paragraph "Honest
# update norms"); 100 leaves a wide margin and
# leaves the ×10 scale/sign-flip attacks of the robustness table to the methods.
DEFAULT_MAX_UPDATE_RATIO = APP["max-update-ratio"].default
MIN_REPLIES_FOR_RATIO = 3
# The size bounds against what the server trusts (docs/hostile.md, "Bounds a majority cannot
# move"), measured on honest digits runs (scripts/measure_update_norms.py): an honest update
# stays within [0.41, 3.1] x the trusted scale (the median of the last TRUST_WINDOW rounds'
# accepted medians) and below 0.12 x the model's own norm.
TRUST_WINDOW = 10
LOWER_RATIO = 20.0  # an update shorter than 1/20 of the trusted scale is dropped (scale-down x0.01)
MODEL_RATIO = 100.0  # an update longer than 100 x the model itself is dropped, in every round
NEAR_BOUND = 0.25  # an accepted update above 1/4 of the upper bound is "near the bound" (warned)
NEAR_BOUND_WARN_ROUNDS = 3  # ... warned once it happened in this many rounds
# Loss values a method weights by (loss-before, train-loss): finite, >= 0 and at most
# max(LOSS_RATIO x the reference, LOSS_FLOOR): the reference the smaller of the round's median
# and the trusted median of earlier rounds; LOSS_FLOOR (a cross-entropy of 20 is e^-20 on the
# right class) keeps honest spreads of small losses.
LOSS_RATIO = 20.0
LOSS_FLOOR = 20.0
# ... and at least the reference / LOSS_RATIO_LOW: measured on honest digits runs (FedLF and q-FFL,
# Dirichlet α 0.3 and 0.1, 100 rounds; /tmp-free: scripts/measure_update_norms.py --losses) the
# smallest loss-before was 1/46 of its round's median and 1/37 of the trusted one; a client that
# reports 0 (or any loss 1000x below the others) moves a loss-weighted method's direction with a
# number no honest client of those runs came within 20x of.
LOSS_RATIO_LOW = 1000.0


@dataclasses.dataclass
class Dropped:
    partition: int | None
    node: int
    reason: str

    def as_dict(self) -> dict:
        return {"partition": self.partition, "node": self.node, "reason": self.reason}


@dataclasses.dataclass
class ReplyLimits:
    """What the server knows about its clients' numbers (see the module docstring).

    ``train_sizes`` / ``test_sizes`` map a client (partition id) to its split's size as the
    server knows it; a client missing there is bounded by ``max_num_examples``."""

    max_num_examples: int = DEFAULT_MAX_NUM_EXAMPLES
    max_update_ratio: float = DEFAULT_MAX_UPDATE_RATIO
    train_sizes: Mapping[int, int] | None = None
    test_sizes: Mapping[int, int] | None = None

    def max_count(self, client: int | None, split: str = "train") -> int:
        sizes = self.train_sizes if split == "train" else self.test_sizes
        if client is not None and sizes is not None:
            size = sizes.get(int(client))
            if size is not None:
                return int(size)
        return int(self.max_num_examples)

    def source(self, client: int | None, split: str = "train") -> str:
        sizes = self.train_sizes if split == "train" else self.test_sizes
        if client is not None and sizes is not None and sizes.get(int(client)) is not None:
            return f"its {split} size known to the server"
        return "max-num-examples"


def _check_arrays(record, spec: FlatSpec, what: str, theta: Mapping[str, np.ndarray] | None = None
                  ) -> tuple[str | None, float]:
    """(reason or None, ‖record − theta‖ in float64, NaN without ``theta``).

    An array whose bytes start with the ``.npy`` header its spec's shape and dtype give and hold
    exactly that many bytes (what every honest reply sends) is viewed at once; any other goes
    through :func:`payload_error`, whose reasons are the same either way. The norm is the same
    float64 arithmetic array by array (θ_i cast to float64, minus θ_t, its dot with itself),
    written into one scratch vector per reply."""
    from flwr.app import ArrayRecord

    if not isinstance(record, ArrayRecord):
        return f"{what}: not an ArrayRecord", math.nan
    got = tuple(record.keys())
    if got != spec.keys:
        missing = sorted(set(spec.keys) - set(got))
        extra = sorted(set(got) - set(spec.keys))
        if missing or extra:
            return f"{what}: missing arrays {missing[:3]} extra arrays {extra[:3]}", math.nan
        return f"{what}: arrays in a different order", math.nan
    layout = spec_layout(spec)
    scratch = np.empty(layout.largest) if theta is not None else None
    sq = 0.0
    for key, arr, shape, dtype, npdt, count, header, nbytes in zip(
            spec.keys, record.values(), spec.shapes, spec.dtypes, layout.dtypes, layout.counts, layout.headers,
            layout.nbytes):
        if tuple(arr.shape) != shape:
            return f"{what}: array '{key}' has shape {tuple(arr.shape)}, expected {shape}", math.nan
        if str(arr.dtype) != dtype:
            return f"{what}: array '{key}' has dtype {arr.dtype}, expected {dtype}", math.nan
        data = arr.data
        if header is not None and type(data) is bytes and len(data) == nbytes and data.startswith(header):
            view = np.frombuffer(data, dtype=npdt, count=count, offset=len(header))  # what array_view gives
        else:
            try:
                reason = payload_error(arr, shape, dtype)
                view = array_view(arr).reshape(-1) if reason is None else None
            except Exception as exc:  # noqa: BLE001 - undecodable bytes are a bad reply
                reason = f"cannot be decoded ({type(exc).__name__})"
            if reason is not None:
                return f"{what}: array '{key}' {reason}", math.nan
        if theta is not None and view.size:
            diff = scratch[: view.size]
            diff[...] = view  # θ_i in float64 (exact), then minus θ_t: the float64 difference
            np.subtract(diff, theta[key], out=diff)
            part = float(np.dot(diff, diff))
            # a NaN or an Inf in the array makes the sum NaN or Inf: the array's own pass over
            # its values only then (same reasons, same norms as the check before the sum)
            if not math.isfinite(part) and not np.isfinite(view).all():
                return f"{what}: array '{key}' holds NaN or Inf", math.nan
            sq += part
        elif view.size and not np.isfinite(view).all():
            return f"{what}: array '{key}' holds NaN or Inf", math.nan
    return None, (math.sqrt(sq) if theta is not None else math.nan)


@functools.lru_cache(maxsize=256)
def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, worked out once per dtype (numpy formats it anew on every call)."""
    return str(dtype)


def payload_error(arr, shape: tuple[int, ...], dtype: str) -> str | None:
    """Why the bytes of a Flower ``Array`` do not hold the ``shape``/``dtype`` array its
    metadata promises (None when they do). Flower never checks that ``Array.data`` agrees
    with ``Array.shape``/``Array.dtype``: here the ``.npy`` header must name the same shape
    and dtype, and the byte length must be exactly header + size × itemsize,
    before any arithmetic reads the array."""
    data = arr.data
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return f"holds {type(data).__name__}, not bytes"
    got_shape, fortran, got_dtype, offset = _npy_header(data)
    if tuple(got_shape) != tuple(shape):
        return f"bytes hold shape {tuple(got_shape)}, its metadata says {tuple(shape)}"
    if _dtype_name(got_dtype) != dtype or got_dtype.hasobject:
        return f"bytes hold dtype {got_dtype}, its metadata says {dtype}"
    want = offset + math.prod(int(n) for n in shape) * got_dtype.itemsize
    if len(data) != want:
        return f"holds {len(data)} bytes, its shape {tuple(shape)} and dtype {dtype} need {want}"
    return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metrics_problem(metrics: Mapping) -> str | None:
    """Why a reply's metrics hold a number that is not finite (None when every one is): every
    value a client sends is checked, the ones no method reads too (Flower's metric aggregation
    would report a NaN ``f1`` as the round's). A MetricRecord holds numbers and lists of numbers."""
    for key, value in metrics.items():
        if isinstance(value, list):
            if not all(_is_number(v) for v in value):
                return f"metric '{key}' holds a value that is not a finite number"
        elif not _is_number(value):
            return f"metric '{key}' is not a finite number ({value!r})"
    return None


def node_id(msg) -> int | None:
    """The node a reply comes from, as the int Flower's metadata holds (None when its metadata says
    something else: a str, None, a bool, an unreadable field)."""
    try:
        node = msg.metadata.src_node_id
    except Exception:  # noqa: BLE001 - unreadable metadata names no node
        return None
    return node if isinstance(node, int) and not isinstance(node, bool) else None


def check_count(value, bound: int, key: str = keys.NUM_EXAMPLES, source: str = "max-num-examples") -> str | None:
    """Why ``value`` is not a count in [1, ``bound``] (None when it is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"metric '{key}' is not a finite number ({value!r})"
    if not float(value).is_integer():
        return f"metric '{key}' = {value!r} is not a whole number"
    if value < 1:
        return f"metric '{key}' = {value:g} (must be >= 1)"
    if value > bound:
        return f"metric '{key}' = {value:g} exceeds {bound}, {source}"
    return None


def check_train_reply(
    msg, spec: FlatSpec, required_metrics: Iterable[str] = (), required_records: Iterable[str] = (),
    partition_required: bool = True, *, max_count: int | None = None, count_source: str = "max-num-examples",
    theta: Mapping[str, np.ndarray] | None = None, check: Callable[[dict], str | None] | None = None,
    norm_out: list | None = None,
) -> tuple[int | None, str | None]:
    """(partition id or None, reason to drop or None) for one train reply. Without
    ``partition_required`` (a foreign app's clients, keyed by node id) partition-id may be absent.
    ``max_count`` bounds num-examples (default :data:`DEFAULT_MAX_NUM_EXAMPLES`); with ``theta``
    (θ_t per array, flat float64) the update norm ‖θ_t − θ_i‖ is appended to ``norm_out``;
    ``check(metrics)`` is the method's own check of its metrics."""
    if msg.has_error():
        return None, f"error reply: {msg.error.reason}"
    content = msg.content
    metrics = content[keys.METRICS] if keys.METRICS in content else None
    if not isinstance(metrics, Mapping):
        return None, "missing MetricRecord 'metrics'"
    metrics = dict(metrics.items())  # read as a plain dict: the record's own lookups cost ~10x more
    pid = metrics.get(keys.PARTITION_ID)
    pid = int(pid) if _is_number(pid) and float(pid).is_integer() else None
    for key in (*keys.REQUIRED_TRAIN_METRICS, *required_metrics):  # read: present, one finite number each
        if key not in metrics:
            if key == keys.PARTITION_ID and not partition_required:
                continue
            return pid, f"missing metric '{key}'"
        if not _is_number(metrics[key]):
            return pid, f"metric '{key}' is not a finite number ({metrics[key]!r})"
    reason = metrics_problem(metrics)  # the others: every value finite
    if reason:
        return pid, reason
    bound = DEFAULT_MAX_NUM_EXAMPLES if max_count is None else max_count
    reason = check_count(metrics[keys.NUM_EXAMPLES], bound, source=count_source)
    if reason:
        return pid, reason
    if check is not None:
        reason = check(dict(metrics))
        if reason:
            return pid, reason
    if keys.ARRAYS not in content:
        return pid, "missing ArrayRecord 'arrays'"
    reason, norm = _check_arrays(content[keys.ARRAYS], spec, "model", theta)
    if reason:
        return pid, reason
    if theta is not None and not math.isfinite(norm):
        return pid, "update norm ‖θ_t − θ_i‖ is not finite in float64"
    for name in required_records:
        if name not in content:
            return pid, f"missing ArrayRecord '{name}'"
        reason, _ = _check_arrays(content[name], spec, name)
        if reason:
            return pid, reason
    if norm_out is not None:
        norm_out.append(norm)
    return pid, None


def theta_views(arrays, spec: FlatSpec) -> dict[str, np.ndarray]:
    """θ_t per array as flat float64 (what the update norms are measured from): slices of one
    float64 vector, each the array's values cast to float64."""
    layout = spec_layout(spec)
    views = record_views(arrays, layout)
    if len(views) != len(spec.keys) or [v.size for v in views] != list(layout.counts):
        return {key: v.astype(np.float64) for key, v in zip(spec.keys, views)}  # θ_t is not the spec's model
    buf = np.empty(layout.dim)
    out = {}
    for key, v, start in zip(spec.keys, views, layout.starts):
        out[key] = part = buf[start : start + v.size]
        part[...] = v
    return out


def median(values: Iterable[float]) -> float:
    """``float(np.median(values))`` of the values as floats; NaN when any is NaN or there is none
    (without numpy's warnings for these, for infinities or an overflowing mean)."""
    vals = [float(v) for v in values]
    if not vals:
        return math.nan
    with np.errstate(all="ignore"):
        return float(np.median(vals))


@dataclasses.dataclass
class ReplyTrust:
    """What the server trusts about its clients' numbers, from earlier rounds' *accepted*
    replies only (docs/hostile.md, "Bounds a majority cannot move"): ``norms`` the median
    accepted update norm of each of the last :data:`TRUST_WINDOW` rounds, ``losses`` the same
    per loss metric a method reads, ``near_bound_rounds`` the rounds in which an accepted
    update sat near the upper bound, ``identities`` node → the client a node known by its node
    id speaks for (recorded at its first valid reply; see the module docstring). Checkpointed
    (:meth:`as_dict`), so a resumed run keeps its bounds."""

    norms: list[float] = dataclasses.field(default_factory=list)
    losses: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    near_bound_rounds: int = 0
    identities: dict[int, int] = dataclasses.field(default_factory=dict)  # node → the client it speaks for

    def scale(self) -> float | None:
        """The trusted update norm: the median of the window's accepted medians (None before any)."""
        good = [v for v in self.norms if v > 0 and math.isfinite(v)]
        return median(good) if good else None

    def loss_scale(self, key: str) -> float | None:
        good = [v for v in self.losses.get(key, ()) if v >= 0 and math.isfinite(v)]
        return median(good) if good else None

    def observe_norms(self, accepted: list[float]) -> None:
        if accepted:
            self.norms = [*self.norms, median(accepted)][-TRUST_WINDOW:]

    def observe_losses(self, key: str, accepted: list[float]) -> None:
        if accepted:
            self.losses[key] = [*self.losses.get(key, []), median(accepted)][-TRUST_WINDOW:]

    def as_dict(self) -> dict:
        return {"norms": list(self.norms), "losses": {k: list(v) for k, v in self.losses.items()},
                "near_bound_rounds": int(self.near_bound_rounds),
                "identities": [[int(n), int(c)] for n, c in sorted(self.identities.items())]}

    @classmethod
    def from_dict(cls, raw) -> ReplyTrust:
        """Rebuilt from :meth:`as_dict` (a checkpoint); anything else is refused in one line."""
        try:
            trust = cls([float(v) for v in raw["norms"]],
                        {str(k): [float(v) for v in vs] for k, vs in dict(raw["losses"]).items()},
                        int(raw["near_bound_rounds"]),
                        {int(n): int(c) for n, c in raw.get("identities", ())})
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint's reply trust is unreadable ({type(exc).__name__}: {exc})") from None
        if not all(math.isfinite(v) and v >= 0 for v in [*trust.norms, *(x for v in trust.losses.values() for x in v)]):
            raise ValueError("checkpoint's reply trust holds a negative or non-finite value")
        return trust


def norm_bounds(norms: list[float], ratio: float, trust: ReplyTrust | None, model_norm: float
                ) -> tuple[dict[int, str], dict]:
    """{index: reason} of the norms out of bounds, and the round's report (see the module
    docstring, "sizes"): upper ``ratio`` × the reference (the trusted scale, else the round's
    median), lower the trusted scale / :data:`LOWER_RATIO`, and never above
    :data:`MODEL_RATIO` × ‖θ_t‖. ``ratio`` 0 turns every size rule off."""
    out: dict[int, str] = {}
    med = median(norms) if norms else math.nan
    report: dict = {"median": med, "max_ratio": (max(norms) / med) if norms and med > 0 else math.nan}
    if ratio <= 0 or not norms:
        return out, report
    scale = trust.scale() if trust is not None else None
    if scale is not None:
        ref, what = scale, "the trusted scale"
    elif len(norms) >= MIN_REPLIES_FOR_RATIO and med > 0:
        ref, what = med, "the round's median"
    else:
        ref, what = None, ""
    upper = ratio * ref if ref is not None else math.inf
    if model_norm > 0:
        upper = min(upper, MODEL_RATIO * model_norm)
    lower = scale / LOWER_RATIO if scale is not None else 0.0
    for i, n in enumerate(norms):
        if n > upper:
            if ref is not None and n > ratio * ref:
                out[i] = (f"update norm {n:.3g} is {n / ref:.3g} x {what} {ref:.3g} "
                          f"(max-update-ratio = {ratio:g})")
            else:
                out[i] = f"update norm {n:.3g} is {n / model_norm:.3g} x the model's own norm (at most {MODEL_RATIO:g})"
        elif n < lower:
            out[i] = (f"update norm {n:.3g} is 1/{scale / max(n, 1e-300):.3g} of the trusted scale {scale:.3g} "
                      f"(at least 1/{LOWER_RATIO:g} of it)")
    kept = [n for i, n in enumerate(norms) if i not in out]
    near = sum(1 for n in kept if math.isfinite(upper) and n > NEAR_BOUND * upper)
    report.update(reference=ref if ref is not None else math.nan, trusted=scale is not None,
                  upper=upper if math.isfinite(upper) else None, lower=lower, near_bound=near)
    return out, report


def check_loss_values(values: list, key: str, trust: ReplyTrust | None) -> tuple[dict[int, str], float | None]:
    """{index: reason} of the loss values a method weights by that are unusable: not finite,
    negative, above max(:data:`LOSS_RATIO` × the reference, :data:`LOSS_FLOOR`) or below the
    reference / :data:`LOSS_RATIO_LOW`, the reference being the smaller of the round's median and
    the trusted (earlier rounds') one; and the reference used."""
    out: dict[int, str] = {}
    ok = []
    for i, v in enumerate(values):
        if not _is_number(v):
            out[i] = f"metric '{key}' is not a finite number ({v!r})"
        elif v < 0:
            out[i] = f"metric '{key}' = {v:g} is negative (a loss is >= 0)"
        else:
            ok.append(float(v))
    if not ok:
        return out, None
    ref = median(ok)
    trusted = trust.loss_scale(key) if trust is not None else None
    if trusted is not None:
        ref = min(ref, trusted)
    bound = max(LOSS_RATIO * ref, LOSS_FLOOR)
    low = ref / LOSS_RATIO_LOW
    for i, v in enumerate(values):
        if i not in out and v > bound:
            out[i] = (f"metric '{key}' = {v:.3g} exceeds {bound:.3g} (max({LOSS_RATIO:g} x the round's or the "
                      f"trusted median {ref:.3g}, {LOSS_FLOOR:g}))")
        elif i not in out and v < low:
            out[i] = (f"metric '{key}' = {v:.3g} is below {low:.3g} (the round's or the trusted median {ref:.3g} "
                      f"/ {LOSS_RATIO_LOW:g})")
    return out, ref


def check_num_steps(value, bound: int | None) -> str | None:
    """Why ``num-steps`` is not a whole number in [1, ``bound``] (the steps the server asked for)."""
    if not _is_number(value):
        return f"metric '{keys.NUM_STEPS}' is not a finite number ({value!r})"
    if not float(value).is_integer() or value < 1:
        return f"metric '{keys.NUM_STEPS}' = {value!r} is not a whole number >= 1"
    if bound is not None and value > bound:
        return f"metric '{keys.NUM_STEPS}' = {value:g} exceeds the {bound} local steps the server asked for"
    return None


# num-steps when the requests did not say how many steps they asked (a foreign app's train config
# without local-steps / local-epochs): at most STEPS_RATIO x the round's median num-steps, scaled
# by the client's size against the round's median size (an honest client takes ~epochs x n_i/batch
# steps: its steps over the median's are ~ n_i over the median n, plus one batch of rounding).
STEPS_RATIO = 10.0


def steps_outliers(steps: list[float], sizes: list[float]) -> dict[int, str]:
    """{index: reason} of the num-steps values above :data:`STEPS_RATIO` × the round's median ×
    max(1, n_i / the round's median n); nothing with fewer than :data:`MIN_REPLIES_FOR_RATIO`."""
    if len(steps) < MIN_REPLIES_FOR_RATIO:
        return {}
    med_steps, med_n = median(steps), median(sizes)
    out = {}
    for i, (k, n) in enumerate(zip(steps, sizes)):
        bound = STEPS_RATIO * med_steps * max(1.0, n / med_n)
        if k > bound:
            out[i] = (f"metric '{keys.NUM_STEPS}' = {k:g} exceeds {bound:.3g} = {STEPS_RATIO:g} x the round's median "
                      f"num-steps {med_steps:g} x max(1, its num-examples / the median {med_n:g}) (the requests did "
                      "not say how many steps they asked)")
    return out


def steps_asked(asked: Mapping | None, num_examples: float) -> int | None:
    """The local steps a client of ``num_examples`` examples was asked for, from the run config or
    the request's config (``asked``): ``local-steps`` when set, else ``local-epochs`` × ⌈n /
    batch-size⌉ (batch-size 0: one full batch). None when ``asked`` names neither (a foreign app
    whose train config does not say: then :func:`steps_outliers` bounds them against the round)."""
    if not asked or not ({"local-steps", "local-epochs"} & set(asked)):
        return None
    try:
        full = {k: asked[k] for k in ("local-steps", "local-epochs", "batch-size") if k in asked}
        steps = APP["local-steps"].read(full)
        if steps > 0:
            return steps
        epochs = APP["local-epochs"].read(full)
        batch = APP["batch-size"].read(full)
    except (TypeError, ValueError):
        return None
    per_epoch = 1 if batch <= 0 else math.ceil(float(num_examples) / batch)
    return max(1, epochs * per_epoch)


def validate_train_replies(
    replies: Iterable,
    expected: dict[int, int],
    spec: FlatSpec,
    required_metrics: Iterable[str] = (),
    required_records: Iterable[str] = (),
    *,
    limits: ReplyLimits | None = None,
    theta=None,
    check: Callable[[dict], str | None] | None = None,
    stats: dict | None = None,
    trust: ReplyTrust | None = None,
    group: str | None = None,
    sent: Mapping[int, str] | None = None,
) -> tuple[list, list[Dropped]]:
    """Split replies into (valid, dropped). ``expected`` maps node id → partition id sent
    (None: the client is known by its node id). ``limits`` bound the counts and the update
    norms (default :class:`ReplyLimits`); ``theta`` (θ_t, an ArrayRecord) turns on the norm
    checks, against ``trust`` (the scale of earlier rounds, :class:`ReplyTrust`) when given;
    ``check`` is the method's check of a reply's metrics. ``stats`` receives the round's
    ``median`` update norm and ``max_ratio`` (largest norm / median of the valid replies before
    the size rules), the ``reference``, ``upper`` and ``lower`` bounds and ``near_bound`` (accepted
    updates above :data:`NEAR_BOUND` × the upper bound) when the norms were measured. Any
    exception while checking one reply drops that reply, with the exception as its reason.
    ``group`` (the round's group id) and ``sent`` (node → the id of the request sent to it) drop
    the replies that are not this round's answers, a node's copies and the claims of an identity
    that is not the node's (:func:`round_drops`; the module docstring); the identities of
    clients known by node id are kept in ``trust.identities`` (this round's only without ``trust``)."""
    limits = limits if limits is not None else ReplyLimits()
    views = theta_views(theta, spec) if theta is not None else None
    identities = trust.identities if trust is not None else {}
    replies, dropped = round_drops(replies, expected, identities, group, sent)
    contested = new_claims(replies, expected, identities)
    valid, seen, norms = [], set(), []
    for msg in replies:
        pid, reason, norm = _check_one(msg, expected, seen, spec, required_metrics, required_records, limits,
                                       views, check, identities, contested)
        if reason is not None:
            dropped.append(Dropped(pid, int(msg.metadata.src_node_id), reason))
            continue
        seen.add(pid)
        valid.append(msg)
        norms.extend(norm)
    if views is not None and valid:
        out = _size_drops(norms, views, limits, trust, stats)
        dropped += [Dropped(_client(valid[i], expected, identities), int(valid[i].metadata.src_node_id), why)
                    for i, why in sorted(out.items())]
        valid = [msg for i, msg in enumerate(valid) if i not in out]
    for msg in valid:  # the server records who a node known by its id speaks for, at its first valid reply
        node = int(msg.metadata.src_node_id)
        if expected.get(node) is None:
            identities.setdefault(node, _client(msg, expected, identities))
    return valid, dropped


def _claim(msg) -> int | None:
    """The partition id a reply claims (None: none, not a whole number, or an error reply)."""
    try:
        if msg.has_error():
            return None
        metrics = msg.content[keys.METRICS] if keys.METRICS in msg.content else None
        pid = metrics.get(keys.PARTITION_ID) if metrics is not None else None
    except Exception:  # noqa: BLE001 - an unreadable reply claims nothing (it is dropped for being unreadable)
        return None
    return int(pid) if _is_number(pid) and float(pid).is_integer() else None


def reply_client(msg, expected: Mapping[int, int | None], identities: Mapping[int, int]) -> int:
    """Who a reply is reported as: the partition its node was asked for, else the client the
    server recorded for the node, else the partition it claims, else its node id."""
    node = int(msg.metadata.src_node_id)
    for who in (expected.get(node), identities.get(node), _claim(msg)):
        if who is not None:
            return who
    return node


def stale_reason(msg, group: str | None, sent_id: str | None) -> str | None:
    """Why a reply is not an answer to the request this round sent to its node (None when it is):
    its ``group_id`` is not ``group``, or (when the request's id ``sent_id`` is known) its
    ``reply_to_message_id`` is not ``sent_id``. An empty group id (a reply built outside Flower's
    runtime) is not compared."""
    meta = msg.metadata
    if group is not None and meta.group_id and meta.group_id != group:
        return f"reply to group '{meta.group_id}', not this round's '{group}' (a reply of another round)"
    if sent_id and meta.reply_to_message_id != sent_id:
        return (f"answers message '{str(meta.reply_to_message_id)[:16]}', not the request this round sent to "
                f"node {meta.src_node_id}")
    return None


def round_drops(replies: Iterable, expected: Mapping[int, int | None], identities: Mapping[int, int],
                group: str | None = None, sent: Mapping[int, str] | None = None) -> tuple[list, list[Dropped]]:
    """(the replies that answer this round once, the others dropped with their reasons): a reply
    of another round or to another message (:func:`stale_reason`), then every reply of a node that
    sent more than one of this round's: its first counts, the later ones are dropped."""
    kept, dropped = [], []
    for msg in replies:
        node = node_id(msg)
        if node is None:  # every later step keys a reply by its node: one that names none goes here
            dropped.append(Dropped(None, -1, "reply metadata names no node (src_node_id is not an integer)"))
            continue
        try:
            reason = stale_reason(msg, group, (sent or {}).get(node))
        except Exception as exc:  # noqa: BLE001 - whatever a reply holds, it can only drop itself
            reason = f"reply metadata unreadable ({type(exc).__name__})"
        if reason is None:
            kept.append(msg)
        else:
            dropped.append(Dropped(reply_client(msg, expected, identities), node, reason))
    once, first = [], set()
    for msg in kept:
        node = int(msg.metadata.src_node_id)
        if node in first:
            dropped.append(Dropped(reply_client(msg, expected, identities), node,
                                   f"second reply from node {node} this round: its first one counts"))
        else:
            first.add(node)
            once.append(msg)
    return once, dropped


def new_claims(replies: Iterable, expected: Mapping[int, int | None], identities: Mapping[int, int]) -> dict[int, int]:
    """client → how many nodes known by node id and not yet recorded claim it this round."""
    claims: dict[int, set[int]] = {}
    for msg in replies:
        node = int(msg.metadata.src_node_id)
        if node in expected and expected[node] is None and node not in identities:
            claim = _claim(msg)
            claims.setdefault(node if claim is None else claim, set()).add(node)
    return {client: len(nodes) for client, nodes in claims.items()}


def identity_problem(node: int, claim: int, identities: Mapping[int, int], contested: Mapping[int, int]) -> str | None:
    """Why node ``node`` (known by its node id) cannot speak for client ``claim`` (None when it
    can): it recorded another client at its first valid reply, another node holds ``claim``, or
    several new nodes claim it this round."""
    held = identities.get(node)
    if held is not None:
        return None if held == claim else (f"claims client {claim}, but node {node} speaks for client {held} "
                                           "(its first valid reply): an identity does not change")
    owner = next((n for n, c in identities.items() if c == claim and n != node), None)
    if owner is not None:
        return f"claims client {claim}, which node {owner} speaks for"
    if contested.get(claim, 0) > 1:
        return f"{contested[claim]} nodes claim client {claim} this round: none of them is taken"
    return None


def _check_one(msg, expected: Mapping[int, int | None], seen: set, spec: FlatSpec, required_metrics: Iterable[str],
               required_records: Iterable[str], limits: ReplyLimits, views, check,
               identities: Mapping[int, int] | None = None, contested: Mapping[int, int] | None = None
               ) -> tuple[int | None, str | None, list]:
    """(client, why it is dropped or None, [its update norm]) of one reply: well-formed and within
    bounds (:func:`check_train_reply`; any exception drops it), from a node asked this round, for
    the partition that node was asked for (or, known by its node id, the client the server
    recorded for it: :func:`identity_problem`), once."""
    identities = identities if identities is not None else {}
    node = int(msg.metadata.src_node_id)
    want = expected.get(node)
    norm: list = []
    try:
        pid, reason = check_train_reply(
            msg, spec, required_metrics, required_records, want is not None,
            max_count=limits.max_count(want), count_source=limits.source(want), theta=views, check=check,
            norm_out=norm)
    except Exception as exc:  # noqa: BLE001 - whatever a reply holds, it can only drop itself
        return want, f"reply could not be validated ({type(exc).__name__}: {exc})".splitlines()[0], []
    if reason is None:
        if node not in expected:
            reason = "reply from a node that was not asked this round"
        elif want is None:  # clients known by node id only: the server's record decides
            if pid is None and msg.content[keys.METRICS].get(keys.PARTITION_ID) is not None:
                reason = f"metric '{keys.PARTITION_ID}' is not a whole number"
            pid = node if pid is None else pid
            reason = reason or identity_problem(node, pid, identities, contested or {})
            if reason is not None:
                pid = identities.get(node, pid)
        elif pid != want:
            reason = f"partition-id {pid} does not match the partition {want} of this node"
        if reason is None and pid in seen:
            reason = f"second reply for partition {pid}"
    elif want is None and node in identities:
        pid = identities[node]
    return (pid if pid is not None else want), reason, norm


def _size_drops(norms: list[float], views, limits: ReplyLimits, trust: ReplyTrust | None,
                stats: dict | None) -> dict[int, str]:
    """{index: reason} of the valid replies whose update norm breaks the size rules
    (:func:`norm_bounds`); the accepted norms join ``trust``, the round's report ``stats``."""
    model_norm = math.sqrt(sum(float(np.dot(v, v)) for v in views.values()))
    out, report = norm_bounds(norms, limits.max_update_ratio, trust, model_norm)
    if stats is not None:
        stats.update(report)
    if trust is not None and limits.max_update_ratio > 0:
        trust.observe_norms([n for i, n in enumerate(norms) if i not in out])
    return out


def _client(msg, expected: Mapping[int, int | None], identities: Mapping[int, int] | None = None) -> int:
    return reply_client(msg, expected, identities or {})


def check_eval_reply(msg, max_test: int | None = None, count_source: str = "max-num-examples"
                     ) -> tuple[dict[str, float] | None, str | None]:
    """(score, None) of a valid evaluation reply, or (None, reason): accuracy (and
    val-accuracy, when sent) in [0, 1], loss (and val-loss) finite and ≥ 0, num-test (when
    sent) a count in [1, ``max_test``]."""
    if msg.has_error():
        return None, f"error reply: {msg.error.reason}"
    metrics = msg.content.get(keys.METRICS) if keys.METRICS in msg.content else None
    if metrics is None:
        return None, "no metrics"
    reason = metrics_problem(metrics)
    if reason:
        return None, reason
    for acc_key, loss_key, required in ((keys.EVAL_ACC, keys.EVAL_LOSS, True), (keys.VAL_ACC, keys.VAL_LOSS, False)):
        if not required and acc_key not in metrics and loss_key not in metrics:
            continue
        for key in (acc_key, loss_key):
            if key not in metrics:
                return None, f"missing metric '{key}'"
            if not _is_number(metrics[key]):
                return None, f"metric '{key}' is not a finite number ({metrics[key]!r})"
        if not 0.0 <= metrics[acc_key] <= 1.0:
            return None, f"metric '{acc_key}' = {metrics[acc_key]:g} is outside [0, 1]"
        if metrics[loss_key] < 0:
            return None, f"metric '{loss_key}' = {metrics[loss_key]:g} is negative"
    num_test = 1.0
    if keys.NUM_TEST in metrics:
        bound = DEFAULT_MAX_NUM_EXAMPLES if max_test is None else max_test
        reason = check_count(metrics[keys.NUM_TEST], bound, keys.NUM_TEST, count_source)
        if reason:
            return None, reason
        num_test = float(metrics[keys.NUM_TEST])
    return {"accuracy": float(metrics[keys.EVAL_ACC]), "loss": float(metrics[keys.EVAL_LOSS]),
            "num-test": num_test}, None
