"""Reading finished runs: :mod:`~fedpcd_app.analysis.sweep` (many runs from a preset; its run
processes: :mod:`~fedpcd_app.analysis.runner`),
:mod:`~fedpcd_app.analysis.report`, :mod:`~fedpcd_app.analysis.figures`,
:mod:`~fedpcd_app.analysis.robustness` and :mod:`~fedpcd_app.analysis.run_report` (one run's
report and figures, which the ServerApp starts as a process of its own, never imports).
"""
