"""The resident copy of state: used only for the exact snapshot it describes."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pytest

from barrierflow.state import resident
from barrierflow.state.resident import Snapshot

URI = "file:///warehouse/p/state/op/accumulators"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    resident.discard()
    yield
    resident.discard()


def _rows(n: int) -> pa.Table:
    return pa.table({"k": [f"k{i}" for i in range(n)], "v": list(range(n))})


def test_a_promoted_copy_serves_exactly_the_committed_snapshot() -> None:
    live = _rows(3)
    resident.stage(URI, Snapshot("id-1", 4), "attempt-a", live)
    assert resident.lookup(URI, Snapshot("id-1", 4)) is None  # pending until committed
    resident.promote(URI, "attempt-a", 5)
    assert resident.lookup(URI, Snapshot("id-1", 5)) is live
    assert resident.lookup(URI, Snapshot("id-1", 6)) is None
    assert resident.lookup(URI, Snapshot("id-2", 5)) is None  # a table created again
    assert resident.lookup("file:///other", Snapshot("id-1", 5)) is None


@pytest.mark.parametrize(
    "attempt, version",
    [("attempt-b", 5), ("attempt-a", 6), ("attempt-a", 4)],
    ids=["another attempt's files committed", "a commit in between", "stale version"],
)
def test_a_copy_is_dropped_unless_this_attempt_committed_the_next_version(attempt: str, version: int) -> None:
    resident.stage(URI, Snapshot("id-1", 3), "attempt-a", _rows(2))
    resident.promote(URI, "attempt-a", 4)
    resident.stage(URI, Snapshot("id-1", 4), "attempt-a", _rows(3))
    resident.promote(URI, attempt, version)
    for v in (3, 4, 5, 6):
        assert resident.lookup(URI, Snapshot("id-1", v)) is None


def test_maintenance_carries_a_copy_only_from_its_own_snapshot_to_the_next() -> None:
    live = _rows(2)
    resident.stage(URI, Snapshot("id-1", 0), "a", live)
    resident.promote(URI, "a", 1)
    resident.advance(URI, Snapshot("id-1", 1), 2)
    assert resident.lookup(URI, Snapshot("id-1", 2)) is live
    resident.advance(URI, Snapshot("id-1", 2), 4)  # someone committed version 3
    assert resident.lookup(URI, Snapshot("id-1", 4)) is None


def test_copies_are_bounded_by_rows_least_recently_used_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BARRIERFLOW_RESIDENT_STATE_ROWS", "5")
    for i, n in enumerate((2, 2)):
        resident.stage(f"{URI}{i}", Snapshot("id", 0), "a", _rows(n))
        resident.promote(f"{URI}{i}", "a", 1)
    assert resident.lookup(f"{URI}0", Snapshot("id", 1)) is not None  # now most recently used
    resident.stage(f"{URI}2", Snapshot("id", 0), "a", _rows(2))
    resident.promote(f"{URI}2", "a", 1)
    assert resident.lookup(f"{URI}1", Snapshot("id", 1)) is None
    assert resident.lookup(f"{URI}0", Snapshot("id", 1)) is not None
    resident.stage(f"{URI}3", Snapshot("id", 0), "a", _rows(6))  # larger than the bound: never kept
    resident.promote(f"{URI}3", "a", 1)
    assert resident.lookup(f"{URI}3", Snapshot("id", 1)) is None


def test_residency_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BARRIERFLOW_RESIDENT_STATE_ROWS", "0")
    resident.stage(URI, Snapshot("id-1", 0), "a", _rows(1))
    resident.promote(URI, "a", 1)
    assert resident.lookup(URI, Snapshot("id-1", 1)) is None


def test_every_copy_dropped_from_a_kind_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[str] = []
    copies: resident.ResidentCopies[str] = resident.ResidentCopies("TEST_COPIES_ROWS", 4, release=released.append)
    copies.stage(URI, Snapshot("id", 0), "a", "v1", 2)
    copies.promote(URI, "a", 1)
    copies.stage(URI, Snapshot("id", 1), "b", "v2", 2)
    copies.promote(URI, "b", 2)  # v2 replaces v1
    assert released == ["v1"] and copies.lookup(URI, Snapshot("id", 2)) == "v2"
    copies.stage(URI, Snapshot("id", 2), "c", "v3", 2)
    copies.promote(URI, "other-attempt", 3)  # not this attempt's files: both go
    assert sorted(released) == ["v1", "v2", "v3"]
    copies.stage(URI, Snapshot("id", 0), "d", "big", 5)  # over the bound: never kept
    copies.stage("file:///t2", Snapshot("id", 0), "e", "v4", 1)
    copies.discard()
    assert released[-2:] == ["big", "v4"]
