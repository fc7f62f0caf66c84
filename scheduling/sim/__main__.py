"""``python -m scheduling.sim``: see :mod:`scheduling.sim.cli`."""

import sys

from scheduling.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
