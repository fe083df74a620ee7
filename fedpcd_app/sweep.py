"""``python -m fedpcd_app.sweep``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.analysis.sweep`."""

import sys

from fedpcd_app.analysis.sweep import main

if __name__ == "__main__":
    sys.exit(main())
