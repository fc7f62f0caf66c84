"""Simulator tests need no database: make the repository importable however pytest is started."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the editable install may predate the packages (empty mapping)
    sys.path.insert(0, ROOT)
