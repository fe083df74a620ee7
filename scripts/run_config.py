"""CLI of :mod:`fedcore.overrides` for the shell scripts: compose run-config overrides.

    python scripts/run_config.py compose "method='fedpcd' seed=1" "seed=2" run_configs/x.toml
"""

import sys

from fedcore.overrides import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
