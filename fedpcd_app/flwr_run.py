"""``python -m fedpcd_app.flwr_run``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.runtime.flwr_run`."""

import sys

from fedpcd_app.runtime.flwr_run import main

if __name__ == "__main__":
    sys.exit(main())
