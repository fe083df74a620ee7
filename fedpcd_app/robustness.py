"""``python -m fedpcd_app.robustness``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.analysis.robustness`."""

import sys

from fedcore import extras

extras.require("analysis", "python -m fedpcd_app.robustness", exit=__name__ == "__main__")

from fedpcd_app.analysis.robustness import main  # noqa: E402 - after the check: it imports the extra's packages

if __name__ == "__main__":
    sys.exit(main())
