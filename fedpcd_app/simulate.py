"""In-process entry point: the same ServerApp/ClientApp through Flower's simulation.

    python -m fedpcd_app.simulate --run-config "method='fedpcd' num-server-rounds=20"

``--run-config`` takes flwr's syntax (``key=value`` pairs, strings in inner quotes, or a
TOML file). One supernode per client partition (``num-clients``). Tests, sweeps and
benchmarks call :func:`simulate`. Prints the output folder on the last line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client_app.data import DataError
from fedcore.config import ConfigError
from fedpcd_app.config import load_setup


def simulate(
    overrides: Mapping[str, Any] | str | None = None,
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    verbose: bool = False,
) -> Path:
    """Run one experiment in this process; returns its output folder."""
    setup = load_setup(overrides)  # every key checked, strategy built: before Ray starts
    cfg = setup.cfg
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.simulation import run_simulation

    from client_app.client_app import app as client_app
    from fedpcd_app.server_app import make_server_app

    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation(
        server_app=make_server_app(setup),
        client_app=client_app,
        num_supernodes=cfg.num_clients,
        backend_config={
            "client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus},
            "init_args": {"logging_level": "ERROR", "log_to_driver": True},
        },
        verbose_logging=verbose,
    )
    out = Path(cfg.output_dir).resolve()
    if not (out / "summary.json").is_file():
        raise RuntimeError(f"the run did not finish: no summary.json in {out} (see the log above)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default="", help="flwr-style overrides or a TOML file")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per simulated client")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="GPU share per simulated client")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = simulate(args.run_config, num_cpus=args.num_cpus, num_gpus=args.num_gpus, verbose=args.verbose)
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
