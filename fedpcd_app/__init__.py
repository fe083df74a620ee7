"""Fairness-aware federated learning on Flower: the app that wires fedcore, strategies and
client_app together.

Three jobs, each a subpackage: :mod:`fedpcd_app.server` (the ServerApp and its round loop),
:mod:`fedpcd_app.runtime` (running it: the local engine, Ray / ``flwr run``) and
:mod:`fedpcd_app.analysis` (sweeps, reports, figures). The modules at this top level are the
published entry points only (``fedpcd_app.server_app:app``, ``python -m fedpcd_app.simulate |
sweep | report | figures | robustness | flwr_run``), each a thin shim. This file defines
nothing: importing the package loads none of them.
"""
