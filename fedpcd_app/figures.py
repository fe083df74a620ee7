"""``python -m fedpcd_app.figures``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.analysis.figures`."""

import sys

from fedpcd_app.analysis.figures import main

if __name__ == "__main__":
    sys.exit(main())
