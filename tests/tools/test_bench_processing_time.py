"""The benchmark's engine processing time: the union of epoch intervals, never overlap twice."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from engine_side import processing_seconds  # noqa: E402

_T0 = datetime(2026, 11, 22, tzinfo=timezone.utc)


def _epoch(start_s: float, end_s: float) -> dict[str, Any]:
    """A COMPLETED record as ``checkpoints --json`` prints it: recorded at its end, after its duration."""
    recorded = (_T0 + timedelta(seconds=end_s)).isoformat().replace("+00:00", "Z")
    return {"recorded_at": recorded, "duration_ms": round((end_s - start_s) * 1000)}


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([(0, 2), (2, 3), (3.5, 4)], 3.5),  # one after the other: the sum (gaps excluded)
        ([(0, 2), (1, 3), (2.5, 4)], 4.0),  # each overlapping the next: counted once
        ([(0, 5), (1, 2)], 5.0),  # one inside another
        ([(1, 3), (0, 2)], 3.0),  # order of records does not matter
        ([], 0.0),
    ],
)
def test_processing_seconds_is_the_union_of_epoch_intervals(intervals: list[tuple[float, float]], expected: float) -> None:
    assert processing_seconds([_epoch(a, b) for a, b in intervals]) == pytest.approx(expected, abs=1e-3)
