"""Running the app: :mod:`~fedpcd_app.runtime.engine` (the local engine, a Flower ``Grid`` on
this machine), :mod:`~fedpcd_app.runtime.simulate` (``python -m fedpcd_app.simulate``),
:mod:`~fedpcd_app.runtime.placement` (a run's GPUs) and :mod:`~fedpcd_app.runtime.flwr_run`
(Ray / ``flwr run`` wiring). Stands on
:mod:`fedpcd_app.server`; imports nothing of :mod:`fedpcd_app.analysis`.
"""
