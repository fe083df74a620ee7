"""``python -m fedpcd_app.simulate``: the command under its published name (README, run_configs,
outside scripts). The code is :mod:`fedpcd_app.runtime.simulate`."""

import os
import sys

from fedcore import extras

extras.require("server", "python -m fedpcd_app.simulate", exit=__name__ == "__main__")

from fedpcd_app.runtime.simulate import main  # noqa: E402 - after the check: it imports the extra's packages

if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the results are written and every worker stopped: skip the interpreter's teardown
