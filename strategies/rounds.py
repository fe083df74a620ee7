"""What a strategy gives back: a round's and an evaluation's outcome, returned, never stashed.

:func:`check_round` splits a round's train replies into valid (sorted by client) and dropped
with their reasons — another round's, a node's second, a claim of another client's identity
(:func:`fedcore.replies.round_drops`: one reply per node per round, this round's only, as the
client the server assigned; the round's requests as ``configure_train`` kept them,
:func:`requests_sent`), malformed, out of bounds (:mod:`fedcore.replies`), refused by the method's
``check_reply`` / ``check_valid`` or its number checks (:func:`number_problems`), or missing —
and never crashes. The method's ``aggregate_valid`` then returns an :class:`Aggregated` (the new
model, its metrics, the replies it could not use after all, the wrappers' defence reports),
which :meth:`RoundOutcome.with_step` folds into the round's :class:`RoundOutcome`: what the
app's round loop records and Flower's ``aggregate_train`` returns the arrays and metrics of.
:func:`score_evaluation` does the same for evaluation replies (:class:`EvaluationOutcome`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from fedcore import keys
from fedcore.replies import (
    NEAR_BOUND,
    NEAR_BOUND_WARN_ROUNDS,
    Dropped,
    check_eval_reply,
    check_loss_values,
    check_num_steps,
    identity_problem,
    new_claims,
    reply_client,
    round_drops,
    steps_asked,
    validate_train_replies,
)
from strategies.requests import RunContext
from strategies.updates import client_of

log = logging.getLogger("fedpcd")


@dataclasses.dataclass
class Aggregated:
    """What a method's ``aggregate_valid`` returns: the new model (None: the model stays), its
    metrics, the valid replies it could not use after all with the reason of each (FedPCD's
    non-finite updates), and (wrappers) the defence reports of the transforms it ran."""

    arrays: ArrayRecord | None
    metrics: MetricRecord | None = None
    dropped: list[tuple[Message, str]] = dataclasses.field(default_factory=list)
    defence: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # The replies whose own metrics Flower's aggregate_train aggregates when not all valid ones
    # (Krum, MultiKrum, Bulyan: the selected ones, as Flower's do); None: every valid reply.
    metric_replies: list[Message] | None = None


@dataclasses.dataclass
class RoundOutcome:
    """One training round as the strategy made it (``strategy.train_outcome``).

    ``valid`` the replies the method aggregated (sorted by client; under secure aggregation the
    one reply holding the contributors' mean), ``dropped`` the others with their reasons (no
    reply included), ``defence`` the round's defence reports: ``update_norms`` (the validation's
    median norm and largest ratio, max-update-ratio), then those of the wrappers that transformed
    the valid replies (``update_clip``: :class:`strategies.wrappers.UpdateClip`, ``privacy``:
    :class:`strategies.privacy.CentralDP`), in the order they ran. ``arrays`` and ``metrics``: the
    method's result (None arrays: the model stays); ``error``: the exception the aggregation
    raised (then no result). ``contributors``: under secure aggregation, the partitions whose
    update is inside the aggregate reply."""

    valid: list[Message] = dataclasses.field(default_factory=list)
    dropped: list[Dropped] = dataclasses.field(default_factory=list)
    defence: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    arrays: ArrayRecord | None = None
    metrics: MetricRecord | None = None
    error: Exception | None = None
    contributors: list[int] | None = None
    metric_replies: list[Message] | None = None  # Aggregated.metric_replies

    @property
    def replied(self) -> list[int]:
        """The clients whose update the aggregate holds, sorted."""
        if self.contributors is not None:
            return sorted(self.contributors) if self.valid else []
        return sorted(client_of(r) for r in self.valid)

    @property
    def client_replies(self) -> list[Message]:
        """The clients' own valid replies (none under secure aggregation: only their mean)."""
        return self.valid if self.contributors is None else []

    def with_step(self, server_round: int, step: Aggregated) -> RoundOutcome:
        """This outcome with the method's result: its drops moved from ``valid`` to ``dropped``."""
        gone = {id(reply) for reply, _ in step.dropped}
        late = [Dropped(client_of(reply), int(reply.metadata.src_node_id), why) for reply, why in step.dropped]
        log_dropped(server_round, late)
        return dataclasses.replace(self, valid=[r for r in self.valid if id(r) not in gone],
                                   dropped=[*self.dropped, *late], defence={**self.defence, **step.defence},
                                   arrays=step.arrays, metrics=step.metrics, metric_replies=step.metric_replies)


@dataclasses.dataclass
class EvaluationOutcome:
    """What ``strategy.evaluate_outcome`` made of one evaluation's replies: ``scores`` client →
    {accuracy, loss, num-test}; ``val`` client → (val-accuracy, val-loss) of the scored clients
    that sent them; ``unscored`` client → why its reply was not used
    (:func:`fedcore.replies.check_eval_reply`); ``metrics`` the test-size-weighted means (None
    when no client was scored): what Flower's ``aggregate_evaluate`` returns."""

    scores: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    val: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    unscored: dict[int, str] = dataclasses.field(default_factory=dict)
    metrics: MetricRecord | None = None


def log_dropped(server_round: int, dropped: Iterable[Dropped]) -> None:
    for d in dropped:
        log.warning("round %d: dropped reply of client %s: %s", server_round,
                    d.partition if d.partition is not None else d.node, d.reason)


# -- train replies ------------------------------------------------------------------------------
def check_round(strategy, server_round: int, replies: Iterable[Message], context: RunContext) -> RoundOutcome:
    """The round's replies split into valid (sorted by client) and dropped with reasons (a
    malformed reply and a missing one alike, logged; never a crash); ``strategy`` gives what
    the requests asked (``expected``, θ_t) and the method's checks."""
    replies = list(replies)
    read_aliases(replies, keys.TRAIN_ALIASES, "train", context.warned)
    _read_flower_names(strategy, replies, context.warned)
    valid, dropped, norms = _validate(strategy, server_round, replies, context)
    bad = _number_drops(strategy, server_round, valid, context)
    dropped += [Dropped(client_of(valid[i]), int(valid[i].metadata.src_node_id), why) for i, why in sorted(bad.items())]
    valid = [r for i, r in enumerate(valid) if i not in bad]
    _count_near_bound(server_round, norms, context)
    # Replies arrive in whatever order the nodes finish: sort by client so that float
    # sums (and so every result) do not depend on arrival order.
    valid.sort(key=client_of)
    answered = {int(r.metadata.src_node_id) for r in replies}
    dropped += [Dropped(pid, node, "no reply (timeout or lost)")
                for node, pid in strategy.expected.items() if node not in answered]
    log_dropped(server_round, dropped)
    # update_norms: the round's median update norm and largest norm / median (max-update-ratio)
    return RoundOutcome(valid, dropped, {"update_norms": norms} if norms else {})


def _validate(strategy, server_round: int, replies: list[Message],
              context: RunContext) -> tuple[list, list[Dropped], dict]:
    """:func:`fedcore.replies.validate_train_replies` with what the strategy asked for: (valid,
    dropped, the update-norm statistics)."""
    # The app's own runs record every round's train loss (rounds.jsonl): its replies keep carrying
    # it. Flower's own loop asks only what the method reads (the FedAvg family: num-examples).
    app = (keys.TRAIN_LOSS,) if context.run_config is not None else ()
    required = (*strategy.required_metrics, *((keys.LOSS_BEFORE,) if strategy.want_loss_before else ()), *app,
                *getattr(strategy, "weight_metrics", ()))
    norms: dict = {}
    group, sent = requests_sent(getattr(strategy, "sent_train", None), server_round, str(server_round))
    valid, dropped = validate_train_replies(
        replies, strategy.expected, strategy.spec, required, strategy.required_records, limits=context.limits,
        theta=strategy.current_arrays, check=strategy.check_reply, stats=norms, trust=context.trust,
        group=group, sent=sent)
    return valid, dropped, norms


def requests_sent(sent: tuple[int, list[Message]] | None, server_round: int, group: str
                  ) -> tuple[str | None, dict[int, str] | None]:
    """(the round's group id, node → the id of the request sent to it) when ``sent`` (what
    ``configure_train``/``configure_evaluate`` kept: (round, requests)) is this round's; else
    (None, None): the requests are unknown (a caller that set ``expected`` by hand) and the
    replies' round is not checked. A request's id is known once a grid pushed it (empty before)."""
    if sent is None or sent[0] != server_round:
        return None, None
    return group, {int(m.metadata.dst_node_id): m.metadata.message_id for m in sent[1] if m.metadata.message_id}


def _number_drops(strategy, server_round: int, valid: list[Message], context: RunContext) -> dict[int, str]:
    """:func:`number_problems`, whose own failure drops the replies, never the round."""
    try:
        return number_problems(strategy, server_round, valid, context)
    except Exception as exc:  # noqa: BLE001 - a reply's numbers can drop the replies, never the round
        why = f"reply numbers could not be checked ({type(exc).__name__}: {exc})".splitlines()[0]
        return dict.fromkeys(range(len(valid)), why)


def number_problems(strategy, server_round: int, replies: list[Message], context: RunContext) -> dict[int, str]:
    """{index: reason} of the replies whose numbers the method reads are out of bounds: each of
    its ``loss_metrics`` (:func:`fedcore.replies.check_loss_values`: finite, ≥ 0, bounded against
    the round's and the trusted median), ``num-steps`` when it ``reads_num_steps`` (a whole number
    in [1, the steps the run config asked for]), then its ``check_valid``."""
    out: dict[int, str] = {}
    metrics = [r.content[keys.METRICS] for r in replies]
    for key in strategy.loss_metrics:
        bad, _ = check_loss_values([m.get(key) for m in metrics], key, context.trust)
        for i, why in bad.items():
            out.setdefault(i, why)
        context.trust.observe_losses(key, [float(m[key]) for i, m in enumerate(metrics) if i not in bad])
    if strategy.reads_num_steps:
        for i, m in enumerate(metrics):
            why = check_num_steps(m.get(keys.NUM_STEPS), steps_asked(context.run_config, m[keys.NUM_EXAMPLES]))
            if why is not None:
                out.setdefault(i, why)
    keep = [i for i in range(len(replies)) if i not in out]
    for j, why in strategy.check_valid(server_round, [replies[i] for i in keep]).items():
        out.setdefault(keep[j], why)
    return out


def _count_near_bound(server_round: int, norms: dict, context: RunContext) -> None:
    """Rounds whose accepted updates came near the size bound: counted in the run's one counter,
    ``context.trust.near_bound_rounds`` (checkpointed with the trust; ``near_bound_rounds`` in the
    round's ``update_norms``), and warned once, in the round they reach
    :data:`NEAR_BOUND_WARN_ROUNDS`: logged, and the same line in ``update_norms["warning"]`` (the
    app's summary.json ``warnings`` takes it from there)."""
    if norms.get("near_bound"):
        context.trust.near_bound_rounds += 1
        n = context.trust.near_bound_rounds
        if n == NEAR_BOUND_WARN_ROUNDS:
            text = (f"round {server_round}: in {n} rounds accepted updates were within {1 / NEAR_BOUND:g}x of the size "
                    f"bound (max-update-ratio; latest round: {norms['near_bound']} update(s)): updates under the "
                    "bound may be poisoning the model (update_norms in rounds.jsonl)")
            log.warning("%s", text)
            norms["warning"] = text
    if norms:
        norms["near_bound_rounds"] = context.trust.near_bound_rounds


def _read_flower_names(strategy, replies: list[Message], warned: set[str]) -> None:
    """Flower's record and metric names the strategy was built with: a reply's model under
    ``arrayrecord_key`` is read as ``arrays``; a metric the method reads under Flower's name
    (``strategy.metric_fallbacks``: q-FFL's ``loss-before`` from Flower's ``train_loss_key``) is
    read under its own when the reply lacks it, with one warning per name and run."""
    record = getattr(strategy, "arrayrecord_key", keys.ARRAYS)
    fallbacks = getattr(strategy, "metric_fallbacks", {})
    if record == keys.ARRAYS and not fallbacks:  # nothing to read under another name
        return
    for reply in replies:
        if reply.has_error():
            continue
        content = reply.content
        if record != keys.ARRAYS and keys.ARRAYS not in content and isinstance(content.get(record), ArrayRecord):
            content[keys.ARRAYS] = content[record]
        metrics = content.get(keys.METRICS) if keys.METRICS in content else None
        if not isinstance(metrics, MetricRecord):
            continue
        for key, (source, why) in fallbacks.items():
            if key not in metrics and source in metrics:
                metrics[key] = metrics[source]
                if f"{source}->{key}" not in warned:
                    warned.add(f"{source}->{key}")
                    log.warning("train reply metric '%s' (node %s) is read as '%s': %s", source,
                                reply.metadata.src_node_id, key, why)


# -- evaluation replies -----------------------------------------------------------------------
def score_evaluation(expected: dict[int, int | None], replies: Iterable[Message], context: RunContext, *,
                     server_round: int | None = None, sent: tuple[int, list[Message]] | None = None
                     ) -> EvaluationOutcome:
    """Each evaluation reply's scores (a bad one leaves its client unscored, with the reason),
    and their test-size-weighted means. As for training (:func:`fedcore.replies.round_drops`):
    with ``sent`` (what ``configure_evaluate`` kept) of ``server_round``, a reply of another
    evaluation or to another message, a node's replies after its first, and a client known by
    node id claiming another identity than the server recorded are left out with their reasons
    (a client whose first reply was scored stays scored)."""
    replies = list(replies)
    read_aliases(replies, keys.EVALUATE_ALIASES, "evaluate", context.warned)
    group, ids = (requests_sent(sent, server_round, f"eval-{server_round}") if server_round is not None
                  else (None, None))
    identities = context.trust.identities
    replies, stale = round_drops(replies, expected, identities, group, ids)
    out = EvaluationOutcome()
    for d in stale:
        log.warning("evaluation reply of client %s dropped: %s", d.partition, d.reason)
    contested = new_claims(replies, expected, identities)
    for reply in replies:
        client, reason = _evaluated_client(reply, expected, identities, contested, group is not None)
        if reason is None and client in out.scores:
            reason = f"second evaluation reply for client {client}"
        if reason is None:
            score, reason = check_eval_reply(reply, context.limits.max_count(client, "test"),
                                             context.limits.source(client, "test"))
        if reason is not None:  # the client stays unscored, with its reason
            log.warning("evaluation reply of client %s dropped: %s", client, reason)
            out.unscored.setdefault(client, reason)
            continue
        out.scores[client] = score
        metrics = reply.content[keys.METRICS]
        if keys.VAL_ACC in metrics:  # check_eval_reply checked both
            out.val[client] = (float(metrics[keys.VAL_ACC]), float(metrics[keys.VAL_LOSS]))
    for d in stale:  # a client whose one reply of this evaluation was scored stays scored
        if d.partition not in out.scores:
            out.unscored.setdefault(d.partition, d.reason)
    if out.scores:
        n = np.array([s["num-test"] for s in out.scores.values()])
        out.metrics = MetricRecord({
            "accuracy": float(np.dot(n, [s["accuracy"] for s in out.scores.values()]) / n.sum()),
            "loss": float(np.dot(n, [s["loss"] for s in out.scores.values()]) / n.sum()),
            "num-scored": len(out.scores),
        })
    return out


def _evaluated_client(reply: Message, expected: dict[int, int | None], identities: dict[int, int],
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


def read_aliases(replies: list[Message], aliases: dict[str, str], kind: str, warned: set[str]) -> None:
    """Replies that name a metric as Flower's quickstart does (``train_loss``, ``eval_acc``, ...)
    are read under the expected key (:data:`fedcore.keys.TRAIN_ALIASES`), with one warning per
    name (``warned``) naming the key to send, instead of being dropped round after round."""
    for reply in replies:
        if reply.has_error():
            continue
        metrics = reply.content.get(keys.METRICS)
        if not isinstance(metrics, MetricRecord) or aliases.keys().isdisjoint(metrics.keys()):
            continue  # no alias sent (the usual reply): nothing to read
        for alias, key in keys.read_aliases(metrics, aliases):
            if alias not in warned:
                warned.add(alias)
                log.warning("%s reply metric '%s' (node %s) is read as '%s': send '%s' (fedcore.keys; README: "
                            "Using the strategies in your own Flower app)", kind, alias,
                            reply.metadata.src_node_id, key, key)
