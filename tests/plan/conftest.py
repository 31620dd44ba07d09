"""The declaration tests run an operator's kernel now and then with the operators' harness (``tests/operators/harness.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operators"))  # harness
