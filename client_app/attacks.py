"""Hostile clients: attacks as a ClientApp train mod (the same in simulation and on SuperNodes).

:func:`attack_mod` wraps this app's train handler (``client_app.client_app``; a foreign
ClientApp adds it to its own ``@app.train(mods=[...])``). It reads the attack from the run config
of the node's ``Context`` (parsed once per run: :mod:`client_app.run_config`) and the request's
partition; for a partition that is not attacked, ``attack = "none"``, or a run config without the
attack keys (another app's), it passes the request through untouched. With θ_t the
received global model, θ_i the honest client's reply, Δ = θ_i − θ_t its update and
s = ``attack-scale``:

* ``sign-flip`` — sends θ_t − s·Δ (the update reversed and scaled);
* ``scale`` — sends θ_t + s·Δ (the update boosted);
* ``gaussian`` — sends θ_i + ε, ε ~ N(0, σ² I), σ = ``attack-noise`` (seeded by the
  seed, the partition and the round);
* ``label-flip`` — trains on permuted labels y ↦ C − 1 − y (C classes). The mod cannot
  reach the data, so it writes the permutation into the request's config record
  (``attack-label-map``) and :func:`client_app.client_app.train_reply` trains on
  ``label_map[y]`` (its documented hook);
* ``free-rider`` — sends θ_t back unchanged with its real example count (the handler runs,
  so every metric is what an honest client would report);
* ``loss-lie`` — reports its losses s times larger than they are: ``loss-before`` (the
  metric q-FFL, AFL, FedFV and FedLF weight by) and, under FedeRage, the β it returns (an
  estimate of a loss quantile, so in loss units too). The model is left honest;
* ``scale-down`` — sign-flip with s < 1 (required): θ_t − s·Δ, a short reversed update (a
  normalising method such as FedPCD's turns it into a full-strength constraint);
* ``huge`` — sends θ_i + 10³⁰ on every coordinate (finite in float32, so only a bound on
  the update norm catches it);
* ``count-lie`` — reports ``num-examples`` = 10³⁰⁸ (a finite float64); the model is honest;
* ``eval-lie`` — answers federated evaluation with accuracy 5.0 and loss −3
  (:func:`attack_eval_mod`, on the ClientApp's evaluate handler); trains honestly;
* ``replay`` — trains honestly in the first round it is asked, then sends that first model
  again (with its first reply's metrics' shape, this round's honest metrics) every later
  round: kept in the node's ``context.state`` per partition, so it survives across rounds
  wherever the node's state does (the local engine, a SuperNode);
* ``crash`` — the train handler raises (the node answers with an error reply): the fault
  the server reports (:mod:`fedpcd_app.server.faults`);
* ``straggler`` — answers honestly after ``attack-delay`` seconds (a slow device): with a
  ``round-timeout`` shorter than the delay its replies are dropped as "no reply".

Everything else in the reply (metric names, example count, method records) is unchanged,
so the server cannot tell an attacked reply by its shape.

Which partitions attack (:func:`attacked_partitions`): ``attack-clients`` lists them
("0,3,7"), or ``attack-fraction`` f draws round(f·N) of the N partitions (at least one)
with a generator seeded by ``seed`` alone — every method run under one seed has the same
attackers. ``attack = "none"`` with partitions given attacks nobody but still marks them,
so that a no-attack baseline reports its metrics over the same honest clients.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from client_app.run_config import read_run_config
from fedcore import flat, keys
from fedcore.config import ConfigError, RunConfig
from fedcore.internals import message_with_metadata
from fedcore.params import MethodParams, hyper
from fedcore.seeding import numpy_rng, torch_generator

ATTACKS = ("none", "sign-flip", "scale", "gaussian", "label-flip", "free-rider", "loss-lie", "scale-down", "huge",
           "count-lie", "eval-lie", "replay", "crash", "straggler")
HUGE = 1e30  # huge: added to every coordinate
COUNT_LIE = 1e308  # count-lie: the reported num-examples
EVAL_LIE = (5.0, -3.0)  # eval-lie: the reported (accuracy, loss)
REPLAY_STATE = "attack-replay"  # replay: the node's context.state record of a partition's first model


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """The attack keys of the run config (declared once; pyproject.toml holds the same)."""

    prefix = "attack"
    kind: str = hyper("none", key="attack", choices=ATTACKS, doc="what the attacked clients do (docs/hostile.md)")
    clients: str = hyper("", doc="'0,3,7': the attacked partition ids")
    fraction: float = hyper(0.0, low=0.0, high=1.0, doc="or this fraction of the clients, drawn with the seed")
    scale: float = hyper(10.0, low=0.0, low_open=True, doc="s of sign-flip, scale and loss-lie")
    noise: float = hyper(1.0, low=0.0, low_open=True, doc="σ of gaussian")
    delay: float = hyper(5.0, low=0.0, high=3600.0, doc="seconds a straggler waits before it answers")

    def check(self) -> None:
        if self.clients and self.fraction:
            raise ConfigError(f"run-config keys 'attack-clients' = {self.clients!r} and 'attack-fraction' = "
                              f"{self.fraction} both choose the attackers: set one of them")
        _client_list(self.clients)
        if self.kind == "scale-down" and not self.scale < 1.0:
            raise ConfigError(f"run-config key 'attack' = 'scale-down' is a sign-flip shorter than the honest update: "
                              f"set attack-scale < 1 (e.g. 0.01), not {self.scale}")
        if self.kind != "none" and not self.clients and not self.fraction:
            raise ConfigError(f"run-config key 'attack' = {self.kind!r} attacks nobody: set attack-clients "
                              "(e.g. \"0,3\") or attack-fraction (e.g. 0.2)")


def _client_list(text: str) -> list[int]:
    try:
        out = sorted({int(t) for t in text.replace(" ", "").split(",") if t})
    except ValueError:
        out = [-1]
    if any(p < 0 for p in out):
        raise ConfigError(f"run-config key 'attack-clients' = {text!r} must list partition ids >= 0 separated "
                          "by commas, e.g. \"0,3,7\"")
    return out


@functools.lru_cache(maxsize=16)
def _attacked(clients: str, fraction: float, num_clients: int, seed: int) -> tuple[int, ...]:
    if clients:
        out = _client_list(clients)
        if out[-1] >= num_clients:
            raise ConfigError(f"run-config key 'attack-clients' = {clients!r} names partition {out[-1]}, but "
                              f"num-clients = {num_clients}: use ids 0..{num_clients - 1}")
        return tuple(out)
    if not fraction:
        return ()
    k = max(1, int(round(fraction * num_clients)))
    return tuple(sorted(int(p) for p in numpy_rng(seed, "attack-clients").choice(num_clients, k, replace=False)))


def attacked_partitions(raw: Mapping[str, Any]) -> list[int]:
    """The attacked (or, with ``attack = "none"``, marked) partition ids of a flat run config."""
    p = Params.from_run_config(raw)
    return list(_attacked(p.clients, p.fraction, int(raw["num-clients"]), int(raw["seed"])))


def flipped_labels(num_classes: int) -> list[int]:
    """label-flip's permutation y ↦ C − 1 − y."""
    return list(range(num_classes - 1, -1, -1))


@dataclasses.dataclass(frozen=True)
class _RunAttack:
    cfg: RunConfig
    params: Params
    attacked: tuple[int, ...]


_last: _RunAttack | None = None  # the latest run's (its RunConfig is one object for the whole run)


def _run_attack(msg: Message, context: Context) -> _RunAttack | None:
    """The run's attack (its settings and attacked partitions, worked out once per run), or None
    where the node's run config has no attack keys (another app's ClientApp and run config)."""
    global _last
    if "attack" not in context.run_config:
        return None
    cfg = read_run_config(context, msg)
    run = _last
    if run is None or run.cfg is not cfg:
        p = Params.from_run_config(cfg.params)
        run = _last = _RunAttack(cfg, p, _attacked(p.clients, p.fraction, cfg.num_clients, cfg.seed))
    return run


def _attack_of(msg: Message, context: Context) -> tuple[_RunAttack, Any] | None:
    """(the run's attack, the partition) where this train request's partition attacks; None where
    :func:`attack_mod` passes the request through."""
    run = _run_attack(msg, context)
    if run is None or run.params.kind in ("none", "eval-lie"):
        return None
    config = msg.content[keys.CONFIG]
    # the partition the request is for (a routed simulation node serves several; see
    # client_app.client_app.served_partition); a node with its own data: its own partition
    if run.cfg.client_data != "node" and keys.PARTITION_ID in config:
        pid = config[keys.PARTITION_ID]
    else:
        pid = context.node_config.get(keys.PARTITION_ID, config.get(keys.PARTITION_ID))
    if pid is None or int(pid) not in run.attacked:
        return None
    return run, pid


def passes_through(msg: Message, context: Context) -> bool:
    """Whether :func:`attack_mod` hands this train request to the handler unchanged and returns
    its reply unchanged (no attack on its partition)."""
    return _attack_of(msg, context) is None


def attack_mod(msg: Message, context: Context, call_next) -> Message:
    """ClientApp train mod: the run's attack on an attacked partition, else a pass-through."""
    attack = _attack_of(msg, context)
    if attack is None:
        return call_next(msg, context)
    run, pid = attack
    p, cfg = run.params, run.cfg
    config = msg.content[keys.CONFIG]
    if p.kind == "crash":
        raise RuntimeError(f"attack 'crash': partition {pid} raises in its train handler")
    if p.kind == "straggler":
        import time

        time.sleep(p.delay)
        return call_next(msg, context)
    if p.kind == "label-flip":
        from client_app import local_data
        from client_app.data import load_federated_data
        from client_app.models import input_spec

        # the model's classes: the run config's with nodes' own data
        num_classes = input_spec(cfg)[1] if local_data.is_node_mode(cfg) else load_federated_data(cfg).num_classes
        content = RecordDict(dict(msg.content.items()))
        content[keys.CONFIG] = ConfigRecord({**dict(config), keys.ATTACK_LABEL_MAP: flipped_labels(num_classes)})
        return call_next(message_with_metadata(content, msg.metadata), context)
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    if p.kind == "loss-lie":
        metrics = reply.content[keys.METRICS]
        for key in (keys.LOSS_BEFORE, keys.FEDERAGE_BETA):
            if key in metrics:
                metrics[key] = p.scale * float(metrics[key])
        return reply
    if p.kind == "count-lie":
        reply.content[keys.METRICS][keys.NUM_EXAMPLES] = COUNT_LIE
        return reply
    if p.kind == "replay":
        first = f"{REPLAY_STATE}-{int(pid)}"
        if first not in context.state:  # its first round: the honest model, kept
            context.state[first] = ArrayRecord(dict(reply.content[keys.ARRAYS].items()))
        reply.content[keys.ARRAYS] = context.state[first]
        return reply
    theta = flat.record_to_flat(msg.content[keys.ARRAYS], dtype=torch.float64)
    local = flat.record_to_flat(reply.content[keys.ARRAYS], dtype=torch.float64)
    if p.kind in ("sign-flip", "scale-down"):
        sent = theta - p.scale * (local - theta)
    elif p.kind == "huge":
        sent = local + HUGE
    elif p.kind == "scale":
        sent = theta + p.scale * (local - theta)
    elif p.kind == "gaussian":
        gen = torch_generator(cfg.seed, "attack-gaussian", int(pid), int(config[keys.SERVER_ROUND]))
        sent = local + p.noise * torch.randn(local.shape, generator=gen, dtype=torch.float64)
    else:  # free-rider
        sent = theta
    reply.content[keys.ARRAYS] = flat.flat_to_record(sent, flat.spec_of(reply.content[keys.ARRAYS]))
    return reply


def attack_eval_mod(msg: Message, context: Context, call_next) -> Message:
    """ClientApp evaluate mod: ``eval-lie`` on an attacked partition reports accuracy 5.0 and
    loss −3 (and the same for the validation split, when scored); else a pass-through."""
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    run = _run_attack(msg, context)
    if run is None or run.params.kind != "eval-lie":
        return reply
    config = msg.content[keys.CONFIG] if keys.CONFIG in msg.content else {}
    pid = context.node_config.get(keys.PARTITION_ID, config.get(keys.PARTITION_ID))
    if pid is None or int(pid) not in run.attacked:
        return reply
    metrics = reply.content[keys.METRICS]
    for acc_key, loss_key in ((keys.EVAL_ACC, keys.EVAL_LOSS), (keys.VAL_ACC, keys.VAL_LOSS)):
        if acc_key in metrics:
            metrics[acc_key], metrics[loss_key] = EVAL_LIE
    return reply
