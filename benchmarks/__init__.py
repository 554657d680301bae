"""Measured comparisons of alpineagents, run with ``python -m benchmarks``.

The package puts this checkout's ``operator/`` first on ``sys.path``, so the benchmarks
measure the code next to them, not an installed copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (str(REPO / "operator"), str(REPO)):
    if _path not in sys.path[:2]:
        sys.path.insert(0, _path)
