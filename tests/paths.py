"""The checkout's root, computed once: tests and the bench find files from it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository's root folder (where ``pyproject.toml`` is)."""
