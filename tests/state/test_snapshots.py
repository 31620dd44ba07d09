"""barrierflow.state.snapshots: passes over whole state tables, a bounded range of key groups at a time.

Moved from the test of ``latest_rows`` (tests/core/test_latest_rows.py), whose changelogs it builds the same way.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from barrierflow.core.arrow import latest_rows
from barrierflow.core.columns import KEY_GROUP
from barrierflow.state.snapshots import live_row_chunks, stored_batches
from barrierflow.state.spec import StateSpec

SPEC = StateSpec(
    operator_id="totals",
    name="accumulators",
    key_fields=(pa.field("sensor_id", pa.string()), pa.field("window", pa.int64())),
    value_fields=(pa.field("count", pa.int64()),),
)


def changelog(rows: list[tuple[Any, ...]]) -> pa.Table:
    """A state changelog table from (sensor_id, window, count, deleted, epoch) tuples."""
    return pa.Table.from_pylist(
        [
            {"sensor_id": s, "window": w, KEY_GROUP: 0, "count": c, "_updated_at_ms": 1000 * e, "_deleted": d, "_epoch": e}
            for s, w, c, d, e in rows
        ],
        schema=SPEC.arrow_schema(),
    )


def _current(table: pa.Table) -> dict[tuple[Any, ...], tuple[int, int]]:
    return {(r["sensor_id"], r["window"]): (r["count"], r["_epoch"]) for r in table.to_pylist()}


def test_live_row_chunks_of_a_table_equal_its_latest_rows_in_key_group_ranges(tmp_path: Path) -> None:
    """Savepoints, restores and maintenance read whole tables this way, a bounded chunk at a time."""
    rng = random.Random(11)
    uri = str(tmp_path / "state")
    generations = []
    for epoch in range(1, 4):
        rows = {(rng.choice("abcdefgh"), rng.randint(0, 9)): (rng.randint(0, 99), rng.random() < 0.2) for _ in range(40)}
        table = changelog([(s, w, None if d else c, d, epoch) for (s, w), (c, d) in rows.items()])
        # The key group follows from the key, as in the engine.
        groups = pa.array(
            [(ord(s) * 10 + w) % 16 for s, w in zip(table["sensor_id"].to_pylist(), table["window"].to_pylist())], pa.int32()
        )
        table = table.set_column(table.schema.get_field_index(KEY_GROUP), KEY_GROUP, groups).sort_by(KEY_GROUP)
        write_deltalake(uri, table, mode="append")
        generations.append(table)
    expected = latest_rows(pa.concat_tables(generations), SPEC.key_columns)

    chunks = list(live_row_chunks(DeltaTable(uri), SPEC.key_columns, max_rows=15))
    assert len(chunks) > 3 and max(c.num_rows for c in chunks) <= 40
    ranges = [(min(c[KEY_GROUP].to_pylist()), max(c[KEY_GROUP].to_pylist())) for c in chunks]
    assert all(high < low for (_, high), (low, _) in zip(ranges, ranges[1:]))  # ascending, disjoint
    assert _current(pa.concat_tables(chunks)) == _current(expected)
    assert sum(c.num_rows for c in chunks) == expected.num_rows
    whole = list(live_row_chunks(DeltaTable(uri), SPEC.key_columns))
    assert len(whole) == 1 and _current(whole[0]) == _current(expected)
    assert sum(b.num_rows for b in stored_batches(DeltaTable(uri), max_rows=25)) == sum(g.num_rows for g in generations)
