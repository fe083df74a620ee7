"""``python -m fedpcd_app.flwr_run``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.runtime.flwr_run`."""

import sys

from fedcore import extras

extras.require("sim", "python -m fedpcd_app.flwr_run", exit=__name__ == "__main__")

from fedpcd_app.runtime.flwr_run import main  # noqa: E402 - after the check: it imports the extra's packages

if __name__ == "__main__":
    sys.exit(main())
