"""Run the app's round loop on an in-process grid that calls the real ClientApp."""

from __future__ import annotations

from fedpcd_app.server.results import read_rounds, read_summary


def run_in_process(overrides: dict):
    """(final global ArrayRecord, rounds.jsonl records, summary.json) of one run."""
    from client_app.client_app import app as client_app
    from fedcore.config import load_config
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import ClientAppGrid, task_identity

    cfg = load_config(overrides)
    with task_identity():
        exp = Experiment(ClientAppGrid(cfg.num_clients, client_app, run_config=cfg), cfg)
        exp.run()
    return exp.state.arrays, read_rounds(exp.writer.dir), read_summary(exp.writer.dir)
