"""The results contract: ``summary.json``, ``rounds.jsonl`` and ``clients.csv``.

* ``rounds.jsonl`` — one JSON object per round, appended and flushed as the round ends
  (a crash loses nothing already computed): train metrics, dropped replies, the
  strategy's diagnostics and, on evaluation rounds, the fairness metrics.
* ``clients.csv`` — one row per client: partition id, train/test sizes, rounds sampled,
  final accuracy and loss.
* ``summary.json`` — method, seed, rounds, the final fairness metrics (``mean_acc``,
  ``std_acc``, ``worst10_acc``, ``best10_acc``, ``min_acc``, ``jain``), ``central_acc``,
  per-client accuracies and the full resolved config.

Accuracies are fractions in [0, 1].
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from fedcore.config import RunConfig

SUMMARY = "summary.json"
ROUNDS = "rounds.jsonl"
CLIENTS = "clients.csv"


def default_output_dir(cfg: RunConfig) -> Path:
    """``$FEDPCD_OUTPUT_ROOT`` (or ./outputs) / <method>/seed<seed>-<timestamp>."""
    root = Path(os.environ.get("FEDPCD_OUTPUT_ROOT", "outputs")).resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return root / cfg.method / f"seed{cfg.seed}-{stamp}-{os.getpid()}"


def _clean(value: Any) -> Any:
    """JSON-safe: numpy/torch scalars → float/int, non-finite → None."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist"):
        return _clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(_clean(obj), fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class ResultsWriter:
    def __init__(self, cfg: RunConfig, out_dir: Path | None = None) -> None:
        self.dir = Path(out_dir or (cfg.output_dir or default_output_dir(cfg))).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self._rounds = open(self.dir / ROUNDS, "w")

    def round(self, record: dict[str, Any]) -> None:
        self._rounds.write(json.dumps(_clean(record), sort_keys=True) + "\n")
        self._rounds.flush()

    def clients(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.dir / (CLIENTS + ".tmp")
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(_clean(rows))
        os.replace(tmp, self.dir / CLIENTS)

    def summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.dir / SUMMARY, summary)

    def close(self) -> None:
        self._rounds.close()


def read_rounds(folder: str | Path) -> list[dict[str, Any]]:
    with open(Path(folder) / ROUNDS) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_summary(folder: str | Path) -> dict[str, Any]:
    with open(Path(folder) / SUMMARY) as fh:
        return json.load(fh)
