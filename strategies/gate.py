"""The one gate: every reply, training and evaluation alike, passes here before any method or any
of Flower's helpers sees it, and whatever a reply list holds, nothing here raises.

A reply is kept when it answers this round's request to its node (its group id, and the request's
message id where the grid gave one), is the node's first of the round, speaks for the client the
server assigned (:func:`fedcore.replies.round_drops`, :func:`fedcore.replies.identity_problem`),
and every number it sends is finite and within its documented range:

* **records** — the method reads the model (``arrays``, or Flower's ``arrayrecord_key``), the
  ``metrics`` MetricRecord and the model-shaped records it declared (:attr:`Method.reads`, e.g.
  SCAFFOLD's Δc_i). **Any other record a reply carries is ignored** (a second MetricRecord, an
  extra ArrayRecord, a ConfigRecord): it reaches neither the method nor Flower's metric
  aggregation, and does not cost the reply;
* **metrics** — every value finite (the ones no method reads too: they would be reported);
  ``num-examples`` a count within the client's bound; the metrics the method reads present and in
  range: its losses (:func:`fedcore.replies.check_loss_values`: ≥ 0, and within a band around the
  round's and the trusted median), ``num-steps`` (a whole number in [1, the steps the request
  asked], or against the round's median where the request did not say), its declared values (each
  in its closed range), Flower's ``weighted_by_key`` (> 0);
* **the model** — the arrays of θ_t's spec, bytes that hold what their header says, an update
  norm within the size bounds (:func:`fedcore.replies.norm_bounds`).

What is kept is read into :class:`Reply` objects (metadata, and content reduced to what is read,
aliases such as Flower's ``train_loss`` read under the project's names): the original Messages are
never modified. :func:`check_train` returns the kept replies (sorted by client, so that no result
depends on arrival order), the dropped ones with their reasons and the update-norm report;
:func:`read_round` turns kept replies into the method's :class:`~strategies.base.Round`.
:func:`check_evaluate` is the same gate for evaluation replies: the scores, the unscored clients
with their reasons, and the kept replies over which a foreign app's own metrics are aggregated.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MetricRecord

from fedcore import flat, keys
from fedcore.replies import (
    NEAR_BOUND,
    NEAR_BOUND_WARN_ROUNDS,
    Dropped,
    ReplyLimits,
    ReplyTrust,
    check_eval_reply,
    check_loss_values,
    check_num_steps,
    identity_problem,
    metrics_problem,
    new_claims,
    node_id,
    reply_client,
    round_drops,
    steps_asked,
    steps_outliers,
    validate_train_replies,
)
from strategies.base import Reads, Round, metric_column

log = logging.getLogger("fedpcd")


@dataclasses.dataclass
class Reply:
    """One reply as the gate reads it (a Message's duck type for :mod:`fedcore.replies`): its
    ``metadata``, its ``content`` reduced to the records read (``arrays``, ``metrics`` as a dict
    with the aliases read, the method's declared records), the ``error`` of an error reply, and
    ``sent``: the metrics as the client named them (what Flower's metric aggregation reads)."""

    metadata: Any
    content: dict[str, Any]
    error: Any = None
    sent: dict[str, Any] = dataclasses.field(default_factory=dict)

    def has_error(self) -> bool:
        return self.error is not None


def client_of(reply: Reply | Message) -> int:
    """The client a kept reply speaks for: its partition id, else its node id."""
    pid = reply.content[keys.METRICS].get(keys.PARTITION_ID)
    return int(pid) if pid is not None else int(reply.metadata.src_node_id)


@dataclasses.dataclass
class Asked:
    """What a round's requests asked, as ``configure_train`` / ``configure_evaluate`` kept them:
    ``expected`` node → the partition id asked (None: the client is known by its node id);
    ``group`` the requests' group id and ``sent`` node → the request's message id (None: not known,
    not compared); ``config`` the values the requests' config carried (the steps asked, for a
    foreign app's train config); ``num_nodes`` the nodes connected when the round was sampled."""

    server_round: int
    expected: dict[int, int | None]
    group: str | None = None
    sent: dict[int, str] | None = None
    config: Mapping[str, Any] | None = None
    num_nodes: int | None = None


@dataclasses.dataclass
class Rules:
    """How the gate reads and bounds a round's replies (the strategy's and the run's).

    ``reads`` the method's declared inputs; ``required`` metrics every reply must carry besides
    (``loss-before`` when the requests asked for it, ``train-loss`` in the app's own runs);
    ``weight_key`` Flower's ``weighted_by_key``; ``record_key`` Flower's ``arrayrecord_key``;
    ``fallbacks`` metric → (Flower's name read when it is missing, why: QFedAvg's
    ``train_loss_key``); ``limits`` and ``trust`` the bounds on the clients' numbers; ``run_config``
    the app's (the steps asked; None in a foreign app); ``warned`` the names warned about once."""

    reads: Reads = dataclasses.field(default_factory=Reads)
    required: tuple[str, ...] = ()
    weight_key: str = keys.NUM_EXAMPLES
    record_key: str = keys.ARRAYS
    fallbacks: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    limits: ReplyLimits = dataclasses.field(default_factory=ReplyLimits)
    trust: ReplyTrust = dataclasses.field(default_factory=ReplyTrust)
    run_config: Mapping[str, Any] | None = None
    warned: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class RoundOutcome:
    """One training round as the strategy made it (``strategy.train_outcome``).

    ``valid`` the replies the method aggregated (sorted by client; under secure aggregation the
    one reply holding the contributors' mean), ``dropped`` the others with their reasons (no reply
    included), ``defence`` the round's defence reports: ``update_norms`` (the gate's median norm and
    largest ratio, max-update-ratio), then the defences' (``update_clip``, ``privacy``) in the order
    they ran. ``arrays`` and ``metrics``: the method's result (None arrays: the model stays);
    ``error``: the exception the aggregation raised (then no result). ``contributors``: under secure
    aggregation, the partitions whose update is inside the aggregate reply. ``metric_replies``: the
    replies whose own metrics Flower's metric aggregation reads (Krum's selection; None: ``valid``)."""

    valid: list[Reply] = dataclasses.field(default_factory=list)
    dropped: list[Dropped] = dataclasses.field(default_factory=list)
    defence: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    arrays: ArrayRecord | None = None
    metrics: MetricRecord | None = None
    error: Exception | None = None
    contributors: list[int] | None = None
    metric_replies: list[Reply] | None = None

    @property
    def replied(self) -> list[int]:
        """The clients whose update the aggregate holds, sorted."""
        if self.contributors is not None:
            return sorted(self.contributors) if self.valid else []
        return sorted(client_of(r) for r in self.valid)

    @property
    def client_replies(self) -> list[Reply]:
        """The clients' own valid replies (none under secure aggregation: only their mean)."""
        return self.valid if self.contributors is None else []


@dataclasses.dataclass
class EvaluationOutcome:
    """What the gate made of one evaluation's replies: ``scores`` client → {accuracy, loss,
    num-test}; ``val`` client → (val-accuracy, val-loss) of the scored clients that sent them;
    ``unscored`` client → why its reply was not used (:func:`fedcore.replies.check_eval_reply`);
    ``metrics`` the test-size-weighted means (None when no client was scored); ``kept`` the scored
    replies (a foreign app's own metrics are aggregated over these and no other)."""

    scores: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    val: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    unscored: dict[int, str] = dataclasses.field(default_factory=dict)
    metrics: MetricRecord | None = None
    kept: list[Reply] = dataclasses.field(default_factory=list)


def log_dropped(server_round: int, dropped: Iterable[Dropped]) -> None:
    for d in dropped:
        log.warning("round %d: dropped reply of client %s: %s", server_round,
                    d.partition if d.partition is not None else d.node, d.reason)


# -- reading ---------------------------------------------------------------------------------------
def read_reply(msg: Message, record_key: str, records: Iterable[str], aliases: Mapping[str, str],
               fallbacks: Mapping[str, tuple[str, str]], kind: str, warned: set[str]) -> Reply | None:
    """A Message as a :class:`Reply`: the model (under ``record_key``, else ``arrays``), the
    ``metrics`` MetricRecord as a dict with ``aliases`` and ``fallbacks`` read (one warning per name
    and run), the declared ``records``; nothing else of the content. None when the message cannot
    be read at all (the caller drops it with that reason)."""
    if msg.has_error():
        return Reply(msg.metadata, {}, error=msg.error)
    content = msg.content
    out: dict[str, Any] = {}
    model = content[record_key] if record_key in content else content[keys.ARRAYS] if keys.ARRAYS in content else None
    if model is not None:
        out[keys.ARRAYS] = model
    for name in records:
        if name in content:
            out[name] = content[name]
    sent: dict[str, Any] = {}
    record = content[keys.METRICS] if keys.METRICS in content else None
    if isinstance(record, MetricRecord):
        sent = dict(record.items())
        metrics = dict(sent)
        for alias, key in aliases.items():  # Flower's quickstart names (train_loss, eval_acc, ...)
            _read_name(metrics, key, alias, f"send '{key}' (fedcore.keys; docs/library.md, 'What a ClientApp must "
                                            "send (the reply contract)')", kind, warned, msg)
        for key, (source, why) in fallbacks.items():
            _read_name(metrics, key, source, why, kind, warned, msg)
        out[keys.METRICS] = metrics
    return Reply(msg.metadata, out, sent=sent)


def _read_name(metrics: dict[str, Any], key: str, source: str, why: str, kind: str, warned: set[str],
               msg: Message) -> None:
    """``key`` read from ``source`` when the reply has only the latter; warned once per name and run."""
    if source in metrics and key not in metrics:
        metrics[key] = metrics[source]
        if f"{source}->{key}" not in warned:
            warned.add(f"{source}->{key}")
            log.warning("%s reply metric '%s' (node %s) is read as '%s': %s", kind, source, msg.metadata.src_node_id,
                        key, why)


def _read_all(replies: Iterable[Message], rules: Rules, kind: str) -> tuple[list[Reply], list[Dropped]]:
    """Every message read (:func:`read_reply`); one that cannot be read is dropped with why."""
    out, dropped = [], []
    aliases = keys.TRAIN_ALIASES if kind == "train" else keys.EVALUATE_ALIASES
    fallbacks = rules.fallbacks if kind == "train" else {}
    records = rules.reads.records if kind == "train" else ()
    for msg in replies:
        try:
            out.append(read_reply(msg, rules.record_key, records, aliases, fallbacks, kind, rules.warned))
        except Exception as exc:  # noqa: BLE001 - whatever a reply holds, it can only drop itself
            node = node_id(msg)
            dropped.append(Dropped(None, -1 if node is None else node,
                                   f"reply could not be read ({type(exc).__name__}: {exc})".splitlines()[0]))
    return out, dropped


# -- training --------------------------------------------------------------------------------------
def check_train(replies: Iterable[Message], asked: Asked, rules: Rules, current: ArrayRecord,
                spec: flat.FlatSpec) -> tuple[list[Reply], list[Dropped], dict[str, Any]]:
    """(the kept replies sorted by client, the dropped ones with their reasons, the update-norm
    report) of a round's train replies (see the module docstring). A node asked and not heard from
    is dropped as ``no reply (timeout or lost)``."""
    replies = list(replies)
    read, dropped = _read_all(replies, rules, "train")
    required = (*rules.reads.metrics, *rules.required,
                *((rules.weight_key,) if rules.weight_key != keys.NUM_EXAMPLES else ()))
    norms: dict[str, Any] = {}
    valid, bad = validate_train_replies(
        read, asked.expected, spec, required, rules.reads.records, limits=rules.limits, theta=current,
        check=rules.reads.value_problem if rules.reads.values else None, stats=norms, trust=rules.trust,
        group=asked.group, sent=asked.sent)
    dropped += bad
    out = _number_drops(valid, asked, rules)
    dropped += [Dropped(client_of(valid[i]), int(valid[i].metadata.src_node_id), why) for i, why in sorted(out.items())]
    valid = [r for i, r in enumerate(valid) if i not in out]
    _count_near_bound(asked.server_round, norms, rules.trust)
    valid.sort(key=client_of)
    answered = {node_id(r) for r in replies}
    dropped += [Dropped(pid, node, "no reply (timeout or lost)")
                for node, pid in asked.expected.items() if node not in answered]
    log_dropped(asked.server_round, dropped)
    return valid, dropped, ({"update_norms": norms} if norms else {})


def _number_drops(replies: list[Reply], asked: Asked, rules: Rules) -> dict[int, str]:
    """:func:`number_problems`, whose own failure drops the replies, never the round."""
    try:
        return number_problems(replies, asked, rules)
    except Exception as exc:  # noqa: BLE001 - a reply's numbers can drop the replies, never the round
        why = f"reply numbers could not be checked ({type(exc).__name__}: {exc})".splitlines()[0]
        return dict.fromkeys(range(len(replies)), why)


def number_problems(replies: list[Reply], asked: Asked, rules: Rules) -> dict[int, str]:
    """{index: reason} of the well-formed replies whose numbers the method reads are out of their
    range: each of its losses (:func:`fedcore.replies.check_loss_values`), ``num-steps`` when it
    reads it (against the steps asked: the run config's, else the requests' config, else the
    round's median: :func:`fedcore.replies.steps_outliers`), Flower's ``weighted_by_key`` (> 0)."""
    out: dict[int, str] = {}
    metrics = [r.content[keys.METRICS] for r in replies]
    for key in rules.reads.losses:
        bad, _ = check_loss_values([m.get(key) for m in metrics], key, rules.trust)
        for i, why in bad.items():
            out.setdefault(i, why)
        rules.trust.observe_losses(key, [float(m[key]) for i, m in enumerate(metrics) if i not in bad])
    if rules.reads.num_steps:
        asked_steps = rules.run_config if rules.run_config else asked.config
        unknown = []
        for i, m in enumerate(metrics):
            bound = steps_asked(asked_steps, m[keys.NUM_EXAMPLES])
            why = check_num_steps(m.get(keys.NUM_STEPS), bound)
            if why is not None:
                out.setdefault(i, why)
            elif bound is None:
                unknown.append(i)
        far = steps_outliers([float(metrics[i][keys.NUM_STEPS]) for i in unknown],
                             [float(metrics[i][keys.NUM_EXAMPLES]) for i in unknown])
        for j, why in far.items():
            out.setdefault(unknown[j], why)
    if rules.weight_key != keys.NUM_EXAMPLES:
        for i, m in enumerate(metrics):
            if not m[rules.weight_key] > 0:
                out.setdefault(i, f"metric '{rules.weight_key}' = {m[rules.weight_key]!r} is not > 0 (it weights the "
                                  "reply: weighted_by_key)")
    return out


def _count_near_bound(server_round: int, norms: dict, trust: ReplyTrust) -> None:
    """Rounds whose accepted updates came near the size bound: counted in the run's one counter,
    ``trust.near_bound_rounds`` (checkpointed with the trust; ``near_bound_rounds`` in the round's
    ``update_norms``), and warned once, in the round they reach :data:`NEAR_BOUND_WARN_ROUNDS`:
    logged, and the same line in ``update_norms["warning"]`` (summary.json ``warnings``)."""
    if norms.get("near_bound"):
        trust.near_bound_rounds += 1
        n = trust.near_bound_rounds
        if n == NEAR_BOUND_WARN_ROUNDS:
            text = (f"round {server_round}: in {n} rounds accepted updates were within {1 / NEAR_BOUND:g}x of the size "
                    f"bound (max-update-ratio; latest round: {norms['near_bound']} update(s)): updates under the "
                    "bound may be poisoning the model (update_norms in rounds.jsonl)")
            log.warning("%s", text)
            norms["warning"] = text
    if norms:
        norms["near_bound_rounds"] = trust.near_bound_rounds


def read_round(replies: list[Reply], asked: Asked, rules: Rules, current: ArrayRecord, spec: flat.FlatSpec, *,
               dtype: torch.dtype, lr: float, step_scale: float) -> Round:
    """The kept replies as the method's :class:`~strategies.base.Round` (no check: the gate's, or a
    secure aggregate built from checked contributors)."""
    metrics = [r.content[keys.METRICS] for r in replies]
    n = metric_column(metrics, keys.NUM_EXAMPLES)
    weights = n if rules.weight_key == keys.NUM_EXAMPLES else metric_column(metrics, rules.weight_key)
    return Round(
        number=asked.server_round, lr=lr, step_scale=step_scale,
        clients=[client_of(r) for r in replies], num_examples=n, weights=weights,
        values={key: metric_column(metrics, key, math.nan) for key in rules.reads.metrics},
        records={name: [r.content[name] for r in replies] for name in rules.reads.records},
        models=[r.content[keys.ARRAYS] for r in replies], current=current, spec=spec, dtype=dtype,
        num_nodes=asked.num_nodes)


# -- evaluation ------------------------------------------------------------------------------------
def check_evaluate(replies: Iterable[Message], asked: Asked, rules: Rules) -> EvaluationOutcome:
    """Each evaluation reply's scores (a bad one leaves its client unscored, with the reason), and
    their test-size-weighted means. As for training: a reply of another evaluation or to another
    message, a node's replies after its first, and a client known by node id claiming another
    identity than the server recorded are left out with their reasons (a client whose first reply
    was scored stays scored); every number a reply sends finite and in range
    (:func:`fedcore.replies.check_eval_reply`), or the reply is not used at all."""
    replies = list(replies)
    read, failed = _read_all(replies, rules, "evaluate")
    identities = rules.trust.identities
    read, stale = round_drops(read, asked.expected, identities, asked.group, asked.sent)
    out = EvaluationOutcome()
    for d in [*failed, *stale]:
        log.warning("evaluation reply of client %s dropped: %s", d.partition, d.reason)
    contested = new_claims(read, asked.expected, identities)
    for reply in read:
        try:
            client, reason = _evaluated_client(reply, asked.expected, identities, contested, asked.group is not None)
            if reason is None and client in out.scores:
                reason = f"second evaluation reply for client {client}"
            if reason is None:
                if keys.METRICS not in reply.content and not reply.has_error():
                    reason = "missing MetricRecord 'metrics'"
                else:
                    score, reason = check_eval_reply(reply, rules.limits.max_count(client, "test"),
                                                     rules.limits.source(client, "test"))
        except Exception as exc:  # noqa: BLE001 - whatever a reply holds, it can only leave itself out
            client, reason = node_id(reply) or -1, f"reply could not be read ({type(exc).__name__})"
        if reason is not None:  # the client stays unscored, with its reason
            log.warning("evaluation reply of client %s dropped: %s", client, reason)
            out.unscored.setdefault(client, reason)
            continue
        out.scores[client] = score
        out.kept.append(reply)
        metrics = reply.content[keys.METRICS]
        if keys.VAL_ACC in metrics:  # check_eval_reply checked both
            out.val[client] = (float(metrics[keys.VAL_ACC]), float(metrics[keys.VAL_LOSS]))
    for d in [*failed, *stale]:  # a client whose one reply of this evaluation was scored stays scored
        if d.partition is not None and d.partition not in out.scores:
            out.unscored.setdefault(d.partition, d.reason)
    if out.scores:
        n = np.array([s["num-test"] for s in out.scores.values()])
        out.metrics = MetricRecord({
            "accuracy": float(np.dot(n, [s["accuracy"] for s in out.scores.values()]) / n.sum()),
            "loss": float(np.dot(n, [s["loss"] for s in out.scores.values()]) / n.sum()),
            "num-scored": len(out.scores),
        })
    return out


def _evaluated_client(reply: Reply, expected: dict[int, int | None], identities: dict[int, int],
                      contested: dict[int, int], asked_known: bool = True) -> tuple[int, str | None]:
    """(the client an evaluation reply scores, why it cannot): the partition the request named,
    else the client the server recorded for the node, else the one the reply reports (when no
    other node holds it), else the node."""
    node = int(reply.metadata.src_node_id)
    want = expected.get(node)
    if want is not None:
        return want, None
    if node not in expected and asked_known:
        return reply_client(reply, expected, identities), "reply from a node that was not asked this evaluation"
    if reply.has_error() or (node in identities and reply_client(reply, {}, {}) == node):
        return identities.get(node, node), None  # no claim: the recorded client (an error: its reason follows)
    claim = reply_client(reply, {}, {})
    reason = identity_problem(node, claim, identities, contested)
    return (identities.get(node, claim) if reason is not None else claim), reason


# -- what Flower's metric aggregation reads -----------------------------------------------------------
def client_metrics(replies: list[Reply], fn: Callable, weight_key: str, what: str) -> MetricRecord | None:
    """Flower's aggregate of the clients' own metrics, ``fn(contents, weight_key)`` (its
    ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``; by default the weight-key-weighted
    mean of every metric), over the kept ``replies`` alone, each as a RecordDict holding the one
    MetricRecord the client sent (checked finite). None without replies or when ``fn`` fails (one
    warning; the round stands); a value ``fn`` returns that is not finite is left out with a warning."""
    from flwr.app import RecordDict

    replies = [r for r in replies if weight_key in r.sent]
    if not replies:
        return None
    contents = [RecordDict({keys.METRICS: MetricRecord(r.sent)}) for r in replies]
    try:
        out = fn(contents, weight_key)
    except Exception as exc:  # noqa: BLE001 - a metrics function cannot fail the round
        log.warning("%s: the clients' metrics were not aggregated (%s(..., %r) raised %s: %s)", what,
                    getattr(fn, "__name__", fn), weight_key, type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "")
        return None
    return finite_metrics(out, what) if out is not None else None


# The ranges of the evaluation metrics the gate knows (Flower's quickstart names and the project's):
# an aggregate outside its key's range is not returned.
RANGES = {**{name: (0.0, 1.0) for name, key in keys.EVALUATE_ALIASES.items() if key == keys.EVAL_ACC},
          keys.EVAL_ACC: (0.0, 1.0), keys.VAL_ACC: (0.0, 1.0),
          **{name: (0.0, math.inf) for name, key in keys.EVALUATE_ALIASES.items() if key == keys.EVAL_LOSS},
          keys.EVAL_LOSS: (0.0, math.inf), keys.VAL_LOSS: (0.0, math.inf)}


def finite_metrics(record: MetricRecord, what: str) -> MetricRecord:
    """``record`` without the values that are not finite or lie outside their key's range
    (:data:`RANGES`), each left out with a warning."""
    bad = [k for k, v in record.items() if metrics_problem({k: v}) is not None
           or (k in RANGES and not isinstance(v, list) and not RANGES[k][0] <= v <= RANGES[k][1])]
    for key in bad:
        log.warning("%s: metric '%s' = %r is not finite or outside its range: left out", what, key, record[key])
    return record if not bad else MetricRecord({k: v for k, v in record.items() if k not in bad})
