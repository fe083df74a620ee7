"""Running the app. The local engine, a Flower ``Grid`` on this machine:
:mod:`~fedpcd_app.runtime.grid` (the Grid and ``run_local``), :mod:`~fedpcd_app.runtime.pool`
(its worker processes) and :mod:`~fedpcd_app.runtime.node` (one message on one node, as a
SuperNode runs it); the Flower internals they set are in :mod:`fedcore.internals`. Beside it
:mod:`~fedpcd_app.runtime.simulate` (``python -m fedpcd_app.simulate``),
:mod:`~fedpcd_app.runtime.placement` (a run's GPUs) and :mod:`~fedpcd_app.runtime.flwr_run`
(Ray / ``flwr run`` wiring). Stands on :mod:`fedpcd_app.server`; imports nothing of
:mod:`fedpcd_app.analysis`.
"""
