"""Committing an epoch to a Delta table: finding the version that holds it, and fencing stale commits."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from barrierflow import delta_commit
from barrierflow.checkpoint import Fence, TableCommit, TableKind
from barrierflow.delta_commit import (
    commit_epoch_table,
    committed_version,
    latest_snapshot,
    open_table,
    raise_fence,
    schema_json_of,
)
from barrierflow.errors import FencedError
from barrierflow.staging import write_parquet


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


# -- fencing: every epoch commit carries (lineage sequence, epoch); a table refuses lower tokens ----------------

_SCHEMA = pa.schema([("x", pa.int64())])


def _epoch_commit(uri: str, lineage: str, epoch: int, seq: int) -> int:
    files = write_parquet(uri, f"_staging/{lineage}/{epoch}", pa.table({"x": [epoch]}, schema=_SCHEMA))
    commit = TableCommit("t", uri, TableKind.SINK, schema_json_of(_SCHEMA), (), tuple(files))
    return commit_epoch_table(commit, f"pipe:{lineage}", epoch, f"attempt-{epoch}", Fence("pipe", seq, epoch))


def test_fencing_tokens_order_by_lineage_then_epoch() -> None:
    assert Fence("pipe", 1, 0).version > Fence("pipe", 0, 2**32 - 1).version
    assert Fence.from_version("pipe", Fence("pipe", 3, 17).version) == Fence("pipe", 3, 17) and str(Fence("pipe", 3, 17)) == "(lineage 3, epoch 17)"
    with pytest.raises(ValueError, match="out of range"):
        Fence("pipe", 0, 2**32)


def test_a_zombie_of_the_old_lineage_is_refused_after_a_restore_raised_the_token(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    assert _epoch_commit(uri, "old", 1, seq=0) == 0
    assert _epoch_commit(uri, "old", 2, seq=0) == 1
    raise_fence(uri, Fence("pipe", 1, 1))  # restore to epoch 1 into lineage 1
    raise_fence(uri, Fence("pipe", 1, 1))  # idempotent: no second commit
    assert open_table(uri).version() == 2  # type: ignore[union-attr]
    with pytest.raises(FencedError, match=r"holds fencing token \(lineage 1, epoch 1\), above this commit's \(lineage 0, epoch 3\)"):
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
        {"x": 1, "detail": None}, {"x": 2, "detail": "why"}
    ]
    assert committed_version(uri, "pipe:l1", 2) == 2
