"""Make ``barrierflow`` importable from the source tree when it is not installed."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

__all__: list[str] = []

# tests/reference/conftest.py -> <repo>/include
_INCLUDE = pathlib.Path(__file__).resolve().parents[2] / "include"
if importlib.util.find_spec("barrierflow") is None and str(_INCLUDE) not in sys.path:
    sys.path.insert(0, str(_INCLUDE))
