"""The operations' tests run epochs with the checkpoint protocol's stub engine (``tests/checkpointing/stub_engine.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpointing"))  # stub_engine
