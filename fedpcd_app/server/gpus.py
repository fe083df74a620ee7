"""The GPUs a run's process can use, as physical ids (what ``summary.json`` records as ``gpus``).

A run's GPUs are chosen before its process initialises CUDA, through ``CUDA_VISIBLE_DEVICES``
(a sweep's run processes, ``simulate --gpus``: :mod:`fedpcd_app.runtime.placement`); inside the
run ``cuda`` is the first of them, where ``server-device='auto'`` puts the server's maths and the
evaluation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV = "CUDA_VISIBLE_DEVICES"


def cuda_count() -> int:
    """GPUs torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def env_ids(value: str) -> list[str]:
    """``CUDA_VISIBLE_DEVICES``'s entries (ids or UUIDs); CUDA stops at the first invalid one,
    so ``-1`` (or an empty value) means none."""
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part or part.startswith("-"):
            break
        out.append(part)
    return out


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The physical ids of the GPUs this process can use: the entries of its
    ``CUDA_VISIBLE_DEVICES`` (as many as torch sees) when set, else ``"0".."n-1"``; ``[]``
    without CUDA."""
    environ = os.environ if environ is None else environ
    count = cuda_count()
    if ENV in environ:
        return env_ids(environ[ENV])[:count]
    return [str(i) for i in range(count)]
