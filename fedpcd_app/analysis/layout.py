"""The names of a sweep's files and labels, shared by the sweep (which writes them) and the
report (which reads them). A module of constants only: the report of one finished run
(:mod:`fedpcd_app.analysis.run_report`, run at the end of every run) reads these without
importing the sweep's machinery (its engine arguments import torch and flwr)."""

import re

RUN_FILE = "run.json"  # a run's labels in a sweep: method, variant, setting, seed, overrides, gpus
MANIFEST = "sweep.json"  # the sweep's own record at its output folder's top
NO_GRID = "base"  # the variant label of a method entry without a grid


def safe(label: str) -> str:
    """A folder (or file) name from a label: keep letters, digits and ``._=,+-``; map the rest to ``_``."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", label)

# (summary key, column title, higher is better, shown as a percentage)
METRICS: tuple[tuple[str, str, bool, bool], ...] = (
    ("mean_acc", "ā", True, True),
    ("std_acc", "σ_c", False, True),
    ("worst10_acc", "W₁₀", True, True),
    ("best10_acc", "B₁₀", True, True),
    ("jain", "Jain", True, False),
    ("central_acc", "central", True, True),
)
METRIC_INFO = {key: (title, high, percent) for key, title, high, percent in METRICS}
