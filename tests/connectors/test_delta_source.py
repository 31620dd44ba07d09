"""DeltaSource.splits and DeltaSource.read on small delta-rs tables (no Spark): the rows each version appended, in commit order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from barrierflow.connectors.delta_source import DeltaSource
from barrierflow.connectors.source import Split
from barrierflow.core.columns import SEQ, seq_parts
from barrierflow.core.errors import BlockedInputError, SourceError


def _read(src: DeltaSource, splits: list[Split], keys: dict[str, str] | None = None) -> tuple[pa.Table, pa.Table]:
    parts = [src.read(s, keys or {}) for s in splits]
    return pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts])


def _positions(records: pa.Table) -> list[tuple[int, int, int]]:
    sources, files, lines = seq_parts(records[SEQ])
    return list(zip(sources.tolist(), (files & ((1 << 20) - 1)).tolist(), lines.tolist()))


@pytest.fixture
def table(tmp_path: Path) -> str:
    uri = str(tmp_path / "orders")
    write_deltalake(uri, pa.table({"id": ["a", "b"], "amount": pa.array([1, 2], pa.int32())}))
    write_deltalake(uri, pa.table({"id": ["c"], "amount": pa.array([3], pa.int32())}), mode="append")
    return uri


def _added_paths(uri: str, version: int) -> list[str]:
    """The data files ``version`` added, by path (independent of the source: the log's add actions, diffed)."""

    def paths(v: int) -> set[str]:
        return set(pa.table(DeltaTable(uri, version=v).get_add_actions(flatten=True))["path"].to_pylist()) if v >= 0 else set()

    return sorted(paths(version) - paths(version - 1))


def test_the_versions_after_the_last_barrier_are_read_in_commit_order(table: str) -> None:
    src = DeltaSource("orders", table)
    end = src.plan(None, None)
    assert end == {"version": 1, "from_version": -1}
    assert src.record_schema() == pa.schema([pa.field("id", pa.string()), pa.field("amount", pa.int32())])
    (split,) = src.splits(end, 2, None)
    files = _added_paths(table, 0) + _added_paths(table, 1)
    assert [(f.name, f.file_index) for f in split.files] == [(p, i) for i, p in enumerate(files)]
    records, dead = src.read(split, {})
    assert records.schema == src.record_schema().append(pa.field(SEQ, pa.int64()))
    by_file = {p: pq.read_table(str(Path(table) / p))["id"].to_pylist() for p in files}
    assert records["id"].to_pylist() == [v for p in files for v in by_file[p]]
    assert _positions(records) == [(2, i, row) for i, p in enumerate(files) for row in range(1, len(by_file[p]) + 1)]
    assert dead.num_rows == 0
    # The next epoch: nothing new, then only what was appended since.
    assert src.splits(src.plan(end, None), 2, None) == []
    write_deltalake(table, pa.table({"id": ["d", "e"], "amount": pa.array([4, 5], pa.int32())}), mode="append")
    later = src.plan(end, None)
    records, _ = _read(src, src.splits(later, 0, None))
    assert records["id"].to_pylist() == ["d", "e"]
    assert _positions(records) == [(0, 0, 1), (0, 0, 2)]


def test_splits_pack_the_added_files_by_size(table: str) -> None:
    src = DeltaSource("orders", table)
    for _ in range(3):
        write_deltalake(table, pa.table({"id": ["x"], "amount": pa.array([9], pa.int32())}), mode="append")
    end = src.plan(None, None)
    one = src.splits(end, 0, None)
    many = src.splits(end, 0, 1)  # every file larger than a split: one each
    assert len(one) == 1 and len(many) == len(one[0].files) == 5
    assert [f for s in many for f in s.files] == list(one[0].files)
    assert _read(src, many)[0].equals(_read(src, one)[0])


def test_added_columns_are_read_null_in_earlier_rows(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": ["a"], "n": pa.array([1], pa.int32())}))
    write_deltalake(
        uri, pa.table({"id": ["b"], "n": pa.array([2], pa.int32()), "note": ["hi"]}), mode="append", schema_mode="merge"
    )
    src = DeltaSource("t", uri)
    assert src.record_schema().names == ["id", "n", "note"]
    records, _ = _read(src, src.splits(src.plan(None, None), 0, None))
    assert records.drop_columns([SEQ]).to_pylist() == [{"id": "a", "n": 1, "note": None}, {"id": "b", "n": 2, "note": "hi"}]


def test_null_or_empty_keys_are_dead_letters_with_their_row(table: str) -> None:
    write_deltalake(table, pa.table({"id": [None, "", "f"], "amount": pa.array([7, 8, None], pa.int32())}), mode="append")
    src = DeltaSource("orders", table)
    end = src.plan(None, None)
    records, dead = _read(src, src.splits(end, 0, None), {"id": "dedup", "other": "elsewhere"})
    assert records["id"].to_pylist() == ["a", "b", "c", "f"]
    last = _added_paths(table, 2)
    assert dead.to_pylist() == [
        {"source": "orders", "source_file": last[0], "line": 1, "raw": '{"amount":7}', "reason": "null_key",
         "detail": "key id of operator dedup is missing or null"},
        {"source": "orders", "source_file": last[0], "line": 2, "raw": '{"id":"","amount":8}', "reason": "empty_key",
         "detail": "key id of operator dedup is empty"},
    ]  # fmt: skip


def test_partition_values_come_from_the_add_actions(tmp_path: Path) -> None:
    uri = str(tmp_path / "p")
    write_deltalake(uri, pa.table({"n": [1, 2, 3], "day": ["d 1", "d/2", "d 1"]}), partition_by=["day"])
    src = DeltaSource("p", uri)
    records, _ = _read(src, src.splits(src.plan(None, None), 0, None))
    assert sorted(zip(records["day"].to_pylist(), records["n"].to_pylist())) == [("d 1", 1), ("d 1", 3), ("d/2", 2)]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda uri: write_deltalake(uri, pa.table({"id": ["z"], "amount": pa.array([1], pa.int32())}), mode="overwrite"),
         "version 2 of .* removed 2 file\\(s\\); a Delta source must be append-only"),
        (lambda uri: write_deltalake(uri, pa.table({"id": [1], "amount": pa.array([1], pa.int32())}), mode="overwrite", schema_mode="overwrite"),
         "version 2 of .* changed the table's schema incompatibly: column id is int64, not string"),
    ],
)  # fmt: skip
def test_removes_and_incompatible_schema_changes_are_refused(table: str, change: Any, match: str) -> None:
    src = DeltaSource("orders", table)
    first = src.plan(None, None)
    change(table)
    with pytest.raises(BlockedInputError, match=match):
        src.splits(src.plan(first, None), 0, None)


def test_a_vacuumed_data_file_blocks_naming_it(table: str) -> None:
    src = DeltaSource("orders", table)
    (split,) = src.splits(src.plan(None, None), 0, None)
    (Path(table) / split.files[0].name).unlink()
    with pytest.raises(BlockedInputError, match=f"data file {split.files[0].name} recorded in the barrier is gone"):
        src.read(split, {})


def test_a_data_file_that_does_not_read_as_the_schema_fails(table: str) -> None:
    src = DeltaSource("orders", table)
    (split,) = src.splits(src.plan(None, None), 0, None)
    path = Path(table) / split.files[0].name
    pq.write_table(pa.table({"id": [1.5]}), path)
    split = Split(
        0,
        tuple(
            f if f.name != split.files[0].name else type(f)(f.name, f.uri, path.stat().st_size, f.file_index) for f in split.files
        ),
        parts=split.parts,
    )
    with pytest.raises(SourceError, match="does not read as the table's schema: column id is double, not string"):
        src.read(split, {})
