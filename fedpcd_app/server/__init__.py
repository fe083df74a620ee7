"""The ServerApp's job: one run's round loop and what it stands on.

:mod:`~fedpcd_app.server.server_app` (the ServerApp body), :mod:`~.config` (validation, once),
:mod:`~.membership` (node ↔ partition), :mod:`~.sampler`, :mod:`~.exchange`, :mod:`~.evaluation`,
:mod:`~.metrics`, :mod:`~.divergence`, :mod:`~.secagg`, :mod:`~.node_data`, :mod:`~.checkpoint`,
:mod:`~.results`, :mod:`~.gpus` (the GPUs a run records) and :mod:`~.tracking`. Imports
nothing of :mod:`fedpcd_app.runtime` or :mod:`fedpcd_app.analysis` (tests/test_architecture.py):
a grid tells the server what it is by its attributes (``is_simulation``, ``nodes_fixed``), not
by its class.
"""
