"""The numeric environment the golden numbers were recorded in (tests/golden/environment.json).

A model's bits depend on more than the code: the torch build (CPU or CUDA wheel, its MKL or
OpenBLAS), the CPU's vector unit (MKL picks other kernels on AVX2 and AVX-512, and on AMD and
Intel parts), the thread count (the order of parallel sums) and numpy. Seeded runs on two such
machines agree to about 1e-8 relative, not bit for bit. So ``tests/test_golden.py`` compares the
final model's sha256 only where :func:`fingerprint` equals the recorded one, and elsewhere
compares the metrics and the model's projections within :data:`FOREIGN` tolerances (measured:
the largest differences between the recording machine and another one, below).
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Any

ENVIRONMENT = Path(__file__).with_name("environment.json")

# Same environment: the metrics within 1e-6 and the model bit for bit (test_golden.py).
# Another environment (torch wheel, BLAS, CPU or thread count): these tolerances. Measured on
# the 33 golden runs between two machines (Intel with the recording wheel, AMD EPYC with
# torch 2.14.1+cu130/MKL, AVX2): train loss ≤ 1.1e-7 relative, strategy diagnostics ≤ 1.1e-6
# relative, model projections ≤ 7.6e-6 of the projection vector's norm (FedPW; the adaptive
# server optimisers and FedPW amplify rounding most), accuracies identical. The tolerances
# leave 10x or more room; accuracies may move by a few test examples (a prediction on a
# decision boundary), not more.
FOREIGN = {
    "train_loss_rtol": 1e-5,
    "strategy_rtol": 1e-4,
    "strategy_atol": 1e-5,
    "projection_rel_norm": 1e-4,  # max |Δp_i| / ‖p‖ over the 16 projections
    "client_acc_atol": 0.05,
    "central_acc_atol": 0.005,
}


def _torch_build_setting(config: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=([^,\s]+)", config)
    return m.group(1) if m else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fingerprint() -> dict[str, Any]:
    """What decides a seeded run's bits on this machine."""
    import numpy as np
    import torch

    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([^\s]+)", config)
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        numpy_blas = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - older numpy: no dict mode
        numpy_blas = "unknown"
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,  # the local part names the wheel: +cpu, +cu130, ...
        "torch_cuda": torch.version.cuda,
        "torch_blas": _torch_build_setting(config, "BLAS_INFO"),
        "torch_mkl": mkl.group(1) if mkl else None,
        "numpy": np.__version__,
        "numpy_blas": numpy_blas,
    }


def recorded() -> dict[str, Any]:
    """The recorded environment ({} when none was recorded: hashes are then never compared)."""
    return json.loads(ENVIRONMENT.read_text()) if ENVIRONMENT.is_file() else {}


def differences(here: dict[str, Any], there: dict[str, Any]) -> list[str]:
    """The fingerprint fields that differ (all of them when nothing was recorded)."""
    keys = sorted({*here, *there})
    return [k for k in keys if here.get(k) != there.get(k)]


def save(fp: dict[str, Any]) -> None:
    ENVIRONMENT.write_text(json.dumps(fp, indent=1, sort_keys=True) + "\n")
