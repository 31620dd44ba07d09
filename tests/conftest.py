"""Shared fixtures: one real Spark session (local[*]) for the whole test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the reference implementation package

os.environ.setdefault("BARRIERFLOW_DRIVER_MEMORY", "2g")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from barrierflow.spark import get_spark

    session = get_spark("local[2]")
    yield session
    session.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the longest test (the browser session, minutes) first, so with
    pytest-xdist it runs beside the rest instead of alone at the end."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("browser") else 1)
