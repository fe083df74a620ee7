"""Honest update norms, per reply: what the trusted update scale of fedcore.replies is set from.

Runs a short honest simulation in-process (the real ClientApp, no Ray) and prints, per
round, the median ‖Δ_i‖, the spread max/median and median/min, ‖Δ_i‖/‖θ_t‖, and the
round's median over the trusted scale (the median of earlier rounds' medians), i.e. the
numbers docs/hostile.md argues the bounds from. Usage:

    python scripts/measure_update_norms.py "model='mlp'" "num-server-rounds=20"
"""

from __future__ import annotations

import json
import sys
import tempfile

import numpy as np

import fedcore.replies as replies
from client_app.client_app import app as client_app
from fedcore.config import load_config
from fedcore.overrides import compose, values
from fedpcd_app.server.server_app import Experiment
from tests.fakegrid import ClientAppGrid, task_identity


def main(argv: list[str]) -> None:
    rows: list[dict] = []
    original = replies.check_train_reply

    def spy(msg, spec, *args, theta=None, norm_out=None, **kwargs):
        out: list = [] if norm_out is None else norm_out
        pid, reason = original(msg, spec, *args, theta=theta, norm_out=out, **kwargs)
        if reason is None and theta is not None and out:
            m = msg.content["metrics"]
            model = float(np.sqrt(sum(float(np.dot(v, v)) for v in theta.values())))
            rows.append({"norm": out[-1], "steps": float(m.get("num-steps", 1)), "model": model})
        return pid, reason

    replies.check_train_reply = spy
    overrides = values(compose(*argv))
    with tempfile.TemporaryDirectory() as out, task_identity():
        cfg = load_config({"num-server-rounds": 10, "eval-every": 0, "checkpoint-every": 0, **overrides,
                           "output-dir": out})
        exp = Experiment(ClientAppGrid(cfg.num_clients, client_app, run_config=cfg), cfg)
        per_round: list[list[dict]] = []
        orig_round = exp.train_round

        def train_round(state, server_round):
            rows.clear()
            out = orig_round(state, server_round)
            per_round.append(list(rows))
            return out

        exp.train_round = train_round
        exp.run()
    medians: list[float] = []
    worst = {"max/med": 0.0, "med/min": 0.0, "min/trusted": np.inf, "max/trusted": 0.0, "norm/model max": 0.0,
             "norm/model min": np.inf}
    for t, rs in enumerate(per_round, 1):
        n = np.array([r["norm"] for r in rs])
        if not len(n):
            continue
        med = float(np.median(n))
        trusted = float(np.median(medians)) if medians else float("nan")
        row = {"round": t, "median": med, "max/med": n.max() / med, "med/min": med / n.min(),
               "min/trusted": n.min() / trusted, "max/trusted": n.max() / trusted,
               "norm/model": [float(n.min() / rs[0]["model"]), float(n.max() / rs[0]["model"])]}
        for k in ("max/med", "med/min"):
            worst[k] = max(worst[k], row[k])
        if medians:
            worst["min/trusted"] = min(worst["min/trusted"], row["min/trusted"])
            worst["max/trusted"] = max(worst["max/trusted"], row["max/trusted"])
        worst["norm/model max"] = max(worst["norm/model max"], row["norm/model"][1])
        worst["norm/model min"] = min(worst["norm/model min"], row["norm/model"][0])
        medians = (medians + [med])[-10:]
        print(json.dumps(row, default=float))
    print("WORST", json.dumps(worst, default=float))


if __name__ == "__main__":
    main(sys.argv[1:])
