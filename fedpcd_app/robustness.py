"""``python -m fedpcd_app.robustness``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.analysis.robustness`."""

import sys

from fedpcd_app.analysis.robustness import main

if __name__ == "__main__":
    sys.exit(main())
