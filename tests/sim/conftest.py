"""Simulator tests need no database: make the repository and the test double importable.

pytest runs with ``--import-mode=importlib`` (no ``sys.path`` changes), and the editable install
may predate the packages, so both directories are put on the path here.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (str(HERE.parents[1]), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)
