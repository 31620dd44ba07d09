"""barrierflow.execution.runner: how many key-group range tasks an epoch gets from its planned input (connectors.source.planned_bytes)."""

from __future__ import annotations

from barrierflow.connectors.source import planned_bytes
from barrierflow.core.settings import INPUT_BYTES_PER_PARTITION
from barrierflow.execution.runner import epoch_parallelism

MIB = 1024 * 1024


def test_planned_bytes_sums_the_file_ranges_of_every_file_source() -> None:
    offsets = {
        "readings": {"file": "b.jsonl", "line": 9, "files": [["a.jsonl", 0, None, 300], ["b.jsonl", 0, 9, 200]]},
        "other": {"file": None, "line": 0, "files": []},
        "table": {"from_version": 1, "version": 3},  # a Delta source: nothing to count
    }
    assert planned_bytes(offsets) == 500
    assert planned_bytes({}) == 0


def test_epoch_parallelism_grows_with_input_and_never_drops_below_the_pipelines() -> None:
    assert INPUT_BYTES_PER_PARTITION == 32 * MIB
    assert epoch_parallelism(2, 0) == 2
    assert epoch_parallelism(2, 64 * MIB) == 2
    assert epoch_parallelism(2, 64 * MIB + 1) == 3
    assert epoch_parallelism(2, 281 * MIB) == 9  # the 16M-key bulk load of the big-state benchmark
    assert epoch_parallelism(12, 281 * MIB) == 12
