"""barrierflow.core.arrow.latest_rows: current value per key of a changelog."""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.core.arrow import latest_rows
from barrierflow.core.columns import KEY_GROUP
from barrierflow.state.spec import StateSpec

SPEC = StateSpec(
    operator_id="totals",
    name="accumulators",
    key_fields=(pa.field("sensor_id", pa.string()), pa.field("window", pa.int64())),
    value_fields=(pa.field("count", pa.int64()),),
)


@pytest.fixture
def changelog() -> Callable[..., pa.Table]:
    """Build a state changelog table from (sensor_id, window, count, deleted, epoch) tuples."""

    def _make(rows: list[tuple[Any, ...]]) -> pa.Table:
        return pa.Table.from_pylist(
            [
                {
                    "sensor_id": s,
                    "window": w,
                    KEY_GROUP: 0,
                    "count": c,
                    "_updated_at_ms": 1000 * e,
                    "_deleted": d,
                    "_epoch": e,
                }
                for s, w, c, d, e in rows
            ],
            schema=SPEC.arrow_schema(),
        )

    return _make


def _current(table: pa.Table) -> dict[tuple[Any, ...], tuple[int, int]]:
    return {(r["sensor_id"], r["window"]): (r["count"], r["_epoch"]) for r in table.to_pylist()}


def test_latest_epoch_wins_regardless_of_row_order(changelog: Callable[..., pa.Table]) -> None:
    data = changelog(
        [
            ("a", 1, 5, False, 2),
            ("a", 1, 9, False, 4),
            ("a", 1, 1, False, 1),
            ("b", 1, 3, False, 3),
            ("a", 2, 7, False, 1),
        ]
    )
    out = latest_rows(data, SPEC.key_columns)
    assert _current(out) == {("a", 1): (9, 4), ("b", 1): (3, 3), ("a", 2): (7, 1)}
    assert out.num_rows == 3


def test_output_keeps_the_schema(changelog: Callable[..., pa.Table]) -> None:
    out = latest_rows(changelog([("a", 1, 5, False, 2), ("a", 1, 6, False, 3)]), SPEC.key_columns)
    assert out.schema == SPEC.arrow_schema()
    assert "_row" not in out.column_names


def test_tombstone_as_latest_row_drops_the_key(changelog: Callable[..., pa.Table]) -> None:
    data = changelog(
        [
            ("a", 1, 5, False, 1),
            ("a", 1, None, True, 2),
            ("b", 1, 3, False, 1),
        ]
    )
    assert _current(latest_rows(data, SPEC.key_columns)) == {("b", 1): (3, 1)}


def test_key_written_again_after_a_tombstone_is_live(changelog: Callable[..., pa.Table]) -> None:
    data = changelog(
        [
            ("a", 1, 8, False, 3),
            ("a", 1, None, True, 2),
            ("a", 1, 5, False, 1),
        ]
    )
    assert _current(latest_rows(data, SPEC.key_columns)) == {("a", 1): (8, 3)}


def test_old_tombstone_does_not_hide_a_different_key(changelog: Callable[..., pa.Table]) -> None:
    # Same sensor, different window: the composite key tells them apart.
    data = changelog(
        [
            ("a", 1, None, True, 5),
            ("a", 2, 4, False, 1),
        ]
    )
    assert _current(latest_rows(data, SPEC.key_columns)) == {("a", 2): (4, 1)}


def test_all_keys_deleted_gives_an_empty_table(changelog: Callable[..., pa.Table]) -> None:
    out = latest_rows(changelog([("a", 1, 1, False, 1), ("a", 1, None, True, 2)]), SPEC.key_columns)
    assert out.num_rows == 0
    assert out.schema == SPEC.arrow_schema()


def test_empty_input(changelog: Callable[..., pa.Table]) -> None:
    empty = changelog([])
    out = latest_rows(empty, SPEC.key_columns)
    assert out.num_rows == 0
    assert out.schema == SPEC.arrow_schema()


def test_many_epochs_many_keys_against_a_dict_oracle(changelog: Callable[..., pa.Table]) -> None:
    import random

    rng = random.Random(7)
    rows = []
    for epoch in range(1, 30):
        for _ in range(rng.randint(0, 6)):
            key = (rng.choice("abcde"), rng.randint(0, 3))
            deleted = rng.random() < 0.25
            rows.append((*key, None if deleted else rng.randint(0, 100), deleted, epoch))
    # A key is written at most once per epoch.
    unique: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in rows:
        unique[(row[0], row[1], row[4])] = row
    rows = list(unique.values())
    rng.shuffle(rows)
    expected: dict[tuple[Any, ...], tuple[int, int]] = {}
    for s, w, c, d, e in sorted(rows, key=lambda r: r[4]):
        if d:
            expected.pop((s, w), None)
        else:
            expected[(s, w)] = (c, e)
    assert _current(latest_rows(changelog(rows), SPEC.key_columns)) == expected


def test_multi_chunk_input(changelog: Callable[..., pa.Table]) -> None:
    part1 = changelog([("a", 1, 1, False, 1), ("b", 1, 2, False, 1)])
    part2 = changelog([("a", 1, 3, False, 2), ("b", 1, None, True, 2)])
    data = pa.concat_tables([part1, part2])
    assert data.column("sensor_id").num_chunks == 2
    assert _current(latest_rows(data, SPEC.key_columns)) == {("a", 1): (3, 2)}
