"""barrierflow.execution.runtime: how many shuffle partitions an epoch gets from its planned input; when its caches are released."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from barrierflow.connectors.source import planned_bytes
from barrierflow.execution.runtime import INPUT_BYTES_PER_PARTITION, epoch_parallelism

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
    from barrierflow.execution import runtime

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


class _Frame:
    """A cached frame whose unpersist waits for ``gate`` (a busy engine) and may fail."""

    def __init__(self, gate: "threading.Event", fails: bool = False, calls: list["_Frame"] | None = None) -> None:
        self.gate, self.fails, self.unpersisted = gate, fails, False
        self.calls = calls if calls is not None else []  # where unpersist calls are recorded, in the order made

    def unpersist(self) -> None:
        self.calls.append(self)
        assert self.gate.wait(10)
        if self.fails:
            raise RuntimeError("session stopped")
        self.unpersisted = True


def _released(app_id: str, epoch: int, frames: list[_Frame], run_loop: bool = True, then: list[Any] | None = None) -> None:
    """Release ``frames`` as the epoch ``epoch`` of ``app_id`` does; ``then`` gets ``"after"`` once its callback runs."""
    from barrierflow.execution import runtime

    given_back: list[bool] = []
    ctx = SimpleNamespace(
        app_id=app_id, epoch=epoch, keep_state_copies=run_loop, _persisted=list(frames), _cached={1: 1}, _frames={2: 2},
        state=SimpleNamespace(release=lambda: given_back.append(True)), _on_release=[],
    )
    if then is not None:
        # E.g. deleting files the frames were read from: only once every unpersist has been asked for.
        runtime.EpochContext.on_release(ctx, lambda: then.append(("after", [f.unpersisted for f in frames])))  # type: ignore[arg-type]
    runtime.EpochContext.release(ctx)  # type: ignore[arg-type]
    assert ctx._persisted == [] and ctx._cached == {} and ctx._frames == {}
    assert given_back == [True]  # the state tables' snapshots go back to the process


def test_the_run_loop_releases_an_epochs_caches_after_its_vote_and_a_second_attempt_waits_for_them() -> None:
    from barrierflow.execution import runtime

    gate = threading.Event()
    first = [_Frame(gate), _Frame(gate, fails=True)]  # released newest first: the failing one first
    started = time.monotonic()
    _released("p-lineage", 7, first)  # returns while the engine has not answered
    assert time.monotonic() - started < 1 and not any(f.unpersisted for f in first)
    runtime._after_releases("p-lineage", 8)  # another epoch does not wait
    runtime._after_releases("q-lineage", 7)  # nor the same epoch of another pipeline or lineage
    retry = threading.Thread(target=runtime._after_releases, args=("p-lineage", 7))
    retry.start()
    retry.join(0.3)
    assert retry.is_alive()  # the second attempt at epoch 7 waits for the first's unpersists
    gate.set()
    retry.join(10)
    assert not retry.is_alive()
    # A failed unpersist (a lost engine, most likely) is logged; the rest would wait out the client's retries too.
    assert [f.unpersisted for f in first] == [False, False]
    assert ("p-lineage", 7) not in runtime._unpersisting


def test_the_run_loop_ends_once_its_releases_are_done_and_a_task_releases_before_its_vote() -> None:
    from barrierflow.execution import runtime

    gate = threading.Event()
    calls: list[_Frame] = []
    loop = [_Frame(gate, calls=calls) for _ in range(3)]  # in the order cached: each may be built on those before
    then: list[Any] = []
    _released("p-lineage", 3, loop, then=then)
    threading.Timer(0.3, gate.set).start()
    runtime.wait_for_releases()  # what the run loop does before it returns
    assert all(f.unpersisted for f in loop) and runtime._unpersisting == {}
    assert then == [("after", [True, True, True])], "the release's callbacks run after the unpersists"
    # Newest first: Spark plans again every cached frame still built on one it uncaches.
    assert calls == loop[::-1]
    # An Airflow task ends with os._exit, which would drop a pending unpersist: it releases at once.
    task = [_Frame(threading.Event(), fails=False)]
    task[0].gate.set()
    _released("p-lineage", 4, task, run_loop=False)
    assert task[0].unpersisted and runtime._unpersisting == {}
