"""Finding the table version that holds an epoch's commit."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from barrierflow.delta_commit import committed_version


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
