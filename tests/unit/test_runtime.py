"""barrierflow.runtime: how many shuffle partitions an epoch gets from its planned input."""

from __future__ import annotations

from barrierflow.runtime import INPUT_BYTES_PER_PARTITION, epoch_parallelism
from barrierflow.sources.base import planned_bytes

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


class _Conf:
    def __init__(self) -> None:
        self.values: list[str] = []

    def set(self, key: str, value: str) -> None:
        assert key == "spark.sql.shuffle.partitions"
        self.values.append(value)


class _Session:
    def __init__(self) -> None:
        self.conf = _Conf()


def test_overlapping_epochs_share_the_session_at_the_largest_parallelism() -> None:
    from barrierflow import runtime

    spark, other = _Session(), _Session()
    runtime._set_shuffle_partitions(spark, 9, computing=True)  # a bulk epoch computes
    runtime._set_shuffle_partitions(spark, 2, computing=True)  # the next, small one starts reading
    runtime._set_shuffle_partitions(other, 3, computing=True)  # another pipeline's session
    assert spark.conf.values == ["9", "9"] and other.conf.values == ["3"]
    runtime._set_shuffle_partitions(spark, 9, computing=False)  # the bulk epoch is done computing
    assert spark.conf.values[-1] == "2"
    runtime._set_shuffle_partitions(spark, 2, computing=False)
    runtime._set_shuffle_partitions(other, 3, computing=False)
    assert runtime._computing == {}
