"""Committing an epoch to a Delta table: finding the version that holds it, and fencing stale commits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from barrierflow.core.errors import FencedError
from barrierflow.storage import delta as delta_commit
from barrierflow.storage.commits import Fence, StagedFile, TableCommit, TableKind
from barrierflow.storage.delta import (
    borrow_snapshot,
    commit_epoch_table,
    committed_version,
    give_back,
    latest_snapshot,
    live_paths,
    open_table,
    raise_fence,
    schema_json_of,
)
from barrierflow.storage.staging import write_parquet


def test_committed_version_of_old_and_new_epochs(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    app = "pipe-l1"
    # Version v holds epoch v + 1; a maintenance commit (no epoch) sits at version 40.
    for epoch in range(1, 41):
        props = CommitProperties(
            custom_metadata={"barrierflow.app_id": app, "barrierflow.epoch": epoch},
            app_transactions=[Transaction(app, epoch)],
        )
        write_deltalake(uri, pa.table({"x": [epoch]}), mode="append", commit_properties=props)
    write_deltalake(uri, pa.table({"x": [0]}), mode="append")
    # Far back in the history (beyond the first windows it reads) and the latest.
    assert committed_version(uri, app, 1) == 0
    assert committed_version(uri, app, 7) == 6
    assert committed_version(uri, app, 40) == 39
    assert committed_version(uri, app, 41) is None
    assert committed_version(uri, "other-app", 1) is None
    assert committed_version(str(tmp_path / "missing"), app, 1) is None


def test_a_lent_snapshot_is_one_callers_and_comes_back_up_to_date(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    with latest_snapshot(uri) as missing:
        assert missing is None
    write_deltalake(uri, pa.table({"x": [1]}))
    with latest_snapshot(uri) as first:
        with latest_snapshot(uri) as second:  # a concurrent caller never shares the first's object
            assert first is not None and second is not None and first is not second
    write_deltalake(uri, pa.table({"x": [2]}), mode="append")  # another writer
    with latest_snapshot(uri) as again:
        assert again in (first, second) and again is not None
        assert again.version() == 1 and len(again.file_uris()) == 2
    with pytest.raises(RuntimeError):
        with latest_snapshot(uri) as failed:
            raise RuntimeError("a commit went wrong")
    with latest_snapshot(uri) as fresh:
        assert fresh is not failed and fresh is not None and fresh.version() == 1
    # An epoch's state reads borrow it for the whole epoch and give it back; the next borrower gets it up to date.
    held = borrow_snapshot(uri)
    with latest_snapshot(uri) as meanwhile:
        assert meanwhile is not held
    write_deltalake(uri, pa.table({"x": [3]}), mode="append")
    assert held is not None and held.version() == 1
    give_back(uri, held)
    after = borrow_snapshot(uri)
    assert after is held and after.version() == 2


# -- fencing: every epoch commit carries (lineage sequence, epoch); a table refuses lower tokens ----------------

_SCHEMA = pa.schema([("x", pa.int64())])


def _epoch_commit(uri: str, lineage: str, epoch: int, seq: int) -> int:
    files = write_parquet(uri, f"_staging/{lineage}/{epoch}", pa.table({"x": [epoch]}, schema=_SCHEMA))
    commit = TableCommit("t", uri, TableKind.SINK, schema_json_of(_SCHEMA), (), tuple(files))
    return commit_epoch_table(commit, f"pipe:{lineage}", epoch, f"attempt-{epoch}", Fence("pipe", seq, epoch))


def test_fencing_tokens_order_by_lineage_then_epoch() -> None:
    assert Fence("pipe", 1, 0).version > Fence("pipe", 0, 2**32 - 1).version
    assert (
        Fence.from_version("pipe", Fence("pipe", 3, 17).version) == Fence("pipe", 3, 17)
        and str(Fence("pipe", 3, 17)) == "(lineage 3, epoch 17)"
    )
    with pytest.raises(ValueError, match="out of range"):
        Fence("pipe", 0, 2**32)


def test_a_zombie_of_the_old_lineage_is_refused_after_a_restore_raised_the_token(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    assert _epoch_commit(uri, "old", 1, seq=0) == 0
    assert _epoch_commit(uri, "old", 2, seq=0) == 1
    raise_fence(uri, Fence("pipe", 1, 1))  # restore to epoch 1 into lineage 1
    raise_fence(uri, Fence("pipe", 1, 1))  # idempotent: no second commit
    assert open_table(uri).version() == 2  # type: ignore[union-attr]
    with pytest.raises(
        FencedError, match=r"holds fencing token \(lineage 1, epoch 1\), above this commit's \(lineage 0, epoch 3\)"
    ):
        _epoch_commit(uri, "old", 3, seq=0)
    assert open_table(uri).version() == 2  # type: ignore[union-attr]
    assert _epoch_commit(uri, "old", 2, seq=0) == 1  # rolling a committed epoch forward still answers
    assert _epoch_commit(uri, "new", 2, seq=1) == 3  # the new lineage goes on


def test_a_restore_landing_between_a_zombies_check_and_its_commit_still_fences_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    _epoch_commit(uri, "old", 1, seq=0)
    raised: list[bool] = []

    def restore_now(point: str) -> None:
        if point == "commit.before_delta_commit" and not raised:
            raised.append(True)
            raise_fence(uri, Fence("pipe", 1, 1))  # after the zombie's step 1, before its commit

    monkeypatch.setattr(delta_commit.faults, "maybe_fail", restore_now)
    with pytest.raises(FencedError, match="a restore or a newer epoch has committed there since"):
        _epoch_commit(uri, "old", 2, seq=0)
    assert raised and open_table(uri).version() == 1  # type: ignore[union-attr]
    assert open_table(uri).transaction_version("pipe:old") == 1  # type: ignore[union-attr]


def test_a_table_from_an_earlier_release_gets_the_new_nullable_column(tmp_path: Path) -> None:
    """``dead_letter`` gained ``detail``: an append alone would keep the table's old schema and hide it."""
    uri = str(tmp_path / "t")
    assert _epoch_commit(uri, "l1", 1, 1) == 0
    wider = pa.schema([("x", pa.int64()), ("detail", pa.string())])
    files = write_parquet(uri, "_staging/l1/2", pa.table({"x": [2], "detail": ["why"]}, schema=wider))
    commit = TableCommit("t", uri, TableKind.SINK, schema_json_of(wider), (), tuple(files))
    version = commit_epoch_table(commit, "pipe:l1", 2, "attempt-2", Fence("pipe", 1, 2))
    table = open_table(uri)
    assert table is not None and version == table.version() == 2  # the column's own commit, then the epoch's
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["x"]) == [
        {"x": 1, "detail": None},
        {"x": 2, "detail": "why"},
    ]
    assert committed_version(uri, "pipe:l1", 2) == 2


def test_a_sink_widening_is_one_commit_of_the_new_schema_the_rewritten_files_and_the_epochs_rows(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    narrow, wide = pa.schema([("x", pa.int32())]), pa.schema([("x", pa.int64())])

    def commit(epoch: int, files: list[StagedFile], schema: pa.Schema, **widening: Any) -> int:
        table = TableCommit("t", uri, TableKind.SINK, schema_json_of(schema), (), tuple(files), **widening)
        return commit_epoch_table(table, "pipe:l1", epoch, f"attempt-{epoch}", Fence("pipe", 1, epoch))

    for epoch in (1, 2):
        commit(epoch, write_parquet(uri, f"_staging/l1/{epoch}", pa.table({"x": [epoch]}, schema=narrow)), narrow)
    stored = open_table(uri)
    assert stored is not None and stored.version() == 1
    old_files = tuple(sorted(live_paths(stored)))
    # Epoch 3's staged files: the stored rows cast to the wider type, and its own rows.
    rewritten = write_parquet(uri, "_staging/l1/3", stored.to_pyarrow_table().cast(wide))
    rewritten += write_parquet(uri, "_staging/l1/3", pa.table({"x": [2**40]}, schema=wide))
    widening = {"removes": old_files, "base_version": 1, "table_schema_json": schema_json_of(wide)}

    # A live file the rewrite did not read (committed after it was planned) would be lost: refused.
    with pytest.raises(FencedError, match="1 other live file"):
        commit(3, rewritten, wide, removes=old_files[:1], base_version=1, table_schema_json=schema_json_of(wide))

    assert commit(3, rewritten, wide, **widening) == 2
    assert commit(3, rewritten, wide, **widening) == 2  # a retry (after a crash) commits nothing more
    table = open_table(uri)
    assert table is not None and table.version() == 2
    assert table.to_pyarrow_table().schema == wide and sorted(table.to_pyarrow_table()["x"].to_pylist()) == [1, 2, 2**40]
    assert "typeWidening" not in (table.protocol().writer_features or [])
    actions = [json.loads(line) for line in (tmp_path / "t" / "_delta_log" / f"{2:020d}.json").read_text().splitlines()]
    assert {a["remove"]["path"] for a in actions if "remove" in a} == set(old_files)
    assert {a["add"]["path"] for a in actions if "add" in a} == {f.path for f in rewritten}
    assert ['"long"' in a["metaData"]["schemaString"] for a in actions if "metaData" in a] == [True]
    assert {a["txn"]["appId"]: a["txn"]["version"] for a in actions if "txn" in a}["pipe:l1"] == 3
    # Version 1 still reads as it was: its files and type are untouched.
    assert open_table(uri, 1).to_pyarrow_table().schema == narrow  # type: ignore[union-attr]
