"""``python -m fedpcd_app.sweep``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.analysis.sweep`."""

import sys

from fedcore import extras

extras.require("analysis", "python -m fedpcd_app.sweep", exit=__name__ == "__main__")

from fedpcd_app.analysis.sweep import main  # noqa: E402 - after the check: it imports the extra's packages

if __name__ == "__main__":
    sys.exit(main())
