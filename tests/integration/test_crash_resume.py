"""Crash and resume with a real ``kill -9``: exactly-once output afterwards.

The protocol's every crash point is covered in milliseconds by
``tests/unit/test_protocol.py`` (a stub engine, faults raised). These cases
end a real ``barrierflow run`` with SIGKILL, its Spark driver included, while
epoch 1 reads its input (nothing voted yet). A run again then checks the
tables against the reference, exactly one Delta commit per table per epoch,
and that no staged file became visible. The kill between two tables' Delta
commits runs on both cluster masters (``test_clusters.py``) and on S3
(``test_object_store.py``).
Kills at random times are ``tests/integration/test_object_store.py``'s (on
S3, behind faults, the executors' JVMs killed too).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from cli_runner import run_sensor_stats
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
)

pytestmark = pytest.mark.slow


# (crash point, crossing), on both stores. The kill between two tables' commits of
# epoch 2 (half of the tables an epoch commits) is
# tests/integration/test_clusters.py's, on local-cluster and a standalone master, and
# tests/integration/test_object_store.py's, on S3 behind faults: a third
# copy here on local[2] would repeat their assertions.
CASES = [
    ("process.after_read", 1),  # the driver dies mid-epoch 1, before any vote
]


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("crash") / "landing"
    write_sensor_files(path, SensorStreamSpec(n_files=4, records_per_file=60, seed=21, late_rate=0.05))
    return path


@pytest.mark.parametrize(("point", "crossing"), CASES, ids=[f"{p}:{n}" for p, n in CASES])
def test_crash_then_resume_is_exactly_once(point: str, crossing: int, landing: Path, warehouse: str, spark_engine: Any) -> None:
    crashed = run_sensor_stats(warehouse, landing, fault=f"{point}:{crossing}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    # The next run may be anywhere: here on the warm engine (the kill -9 took the crashed run's own driver).
    resumed = run_sensor_stats(warehouse, landing, remote=spark_engine.address)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_matches_reference(warehouse, reference_for(landing, 2))
    assert_one_commit_per_table_per_epoch(warehouse, 2)
    assert_nothing_staged_visible(warehouse)
