"""barrierflow with executors in separate JVMs: ``local-cluster`` and a standalone cluster.

The executors read the input, merge state and write every staged file
themselves, importing the barrierflow package that the driver ships
(``SparkContext.addPyFile``), never the driver's interpreter path: checked on
a standalone cluster (a master and two workers with work directories of
their own, as in production: ``tests/spark_cluster.py``). On both masters,
with a local and an S3 warehouse: a ``kill -9`` of the driver between two
tables' commits and the resume, against the reference, then a restore of a
savepoint at another parallelism whose replay gives the same tables. (That
results never depend on parallelism, bit for bit, is checked further on a
local master in ``test_sensor_stats.py``.) The Airflow DAG on the standalone
cluster is ``tests/airflow/test_cluster_dag.py``'s. These tests run Spark
SQL's generated code as production does; the rest of the suite runs it
interpreted (``tests/jvm_options.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.demo.pipelines.sensor_stats import sensor_stats
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint
from cli_runner import cli_env, run_sensor_stats, sensor_stats_tables_per_epoch
from jvm_options import with_generated_code
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    last_barrier_params,
    reference_for,
    table_snapshot,
)

# Three JVMs per application on two cores: a few minutes for the driver-kill test under CI's load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

LOCAL_CLUSTER = "local-cluster[2,1,1024]"  # two executors in JVMs of their own, started by the driver


@pytest.fixture(scope="module", autouse=True)
def _generated_code() -> Iterator[None]:
    """Every JVM of this module (drivers, and the executors local-cluster starts) runs Spark SQL as production does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAVA_TOOL_OPTIONS", with_generated_code(os.environ.get("JAVA_TOOL_OPTIONS", "")))
        yield


@pytest.fixture(params=["standalone", LOCAL_CLUSTER])
def master(request: pytest.FixtureRequest) -> str:
    """A Spark master whose executors run in JVMs of their own: the standalone cluster's, or ``local-cluster``."""
    if request.param == "standalone":
        return str(request.getfixturevalue("standalone").master)
    return str(request.param)


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "landing"
    write_sensor_files(path, SensorStreamSpec(n_files=4, records_per_file=80, seed=31, late_rate=0.05, duplicate_rate=0.1))
    return path


_WHERE = """
import json, sys
from barrierflow.execution.spark import get_spark

def where(batches):
    import os, pyarrow as pa
    import barrierflow.storage.staging
    daemon = sys.modules["__main__"].__spec__.name  # the module the worker's daemon ran as
    for _ in batches:
        yield pa.RecordBatch.from_pylist([{"file": barrierflow.storage.staging.__file__, "pid": os.getpid(), "daemon": daemon}])

spark = get_spark(master=sys.argv[1])
rows = spark.range(8).repartition(4).mapInArrow(where, "file string, pid long, daemon string").collect()
print(json.dumps({"rows": [r.asDict() for r in rows]}))
"""


def test_executors_import_the_shipped_package(standalone: Any) -> None:
    master = standalone.master
    done = subprocess.run(
        [sys.executable, "-c", _WHERE, master], env=cli_env(master=master), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])["rows"]
    import barrierflow.storage.staging

    driver_path = str(Path(barrierflow.storage.staging.__file__).resolve())
    assert rows and all(".zip" in r["file"] and r["file"] != driver_path for r in rows), rows
    # Not barrierflow's worker daemon (barrierflow.execution.spark.worker_conf): a cluster's workers import the shipped package.
    assert {r["daemon"] for r in rows} == {"pyspark.daemon"}, rows


def test_driver_kill_then_a_restore_at_another_parallelism_match_the_reference(
    master: str, landing: Path, warehouse: str
) -> None:
    params = {"landing_dir": str(landing), "max_files_per_epoch": 2}
    # 1. Epoch 1 (at the default parallelism, 2), and a savepoint of it.
    first = run_sensor_stats(warehouse, landing, master=master, epochs=1)
    assert first.returncode == 0, first.stderr[-2000:]
    create_savepoint(sensor_stats, warehouse, name="after-1", params=params)
    # 2. The driver dies once half of epoch 2's tables have committed; the next run resumes.
    half = sensor_stats_tables_per_epoch() // 2
    crashed = run_sensor_stats(warehouse, landing, fault=f"commit.after_delta_commit:{half}", master=master)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    resumed = run_sensor_stats(warehouse, landing, master=master)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_matches_reference(warehouse, reference_for(landing, 2))
    assert_one_commit_per_table_per_epoch(warehouse, 2)
    assert_nothing_staged_visible(warehouse)
    straight = table_snapshot(warehouse)
    # 3. The savepoint restored at parallelism 3, its sinks rewound: epoch 2 runs again, on the same tables.
    result = restore(sensor_stats, warehouse, savepoint="after-1", rewind_sinks=True, parallelism=3, params=params)
    assert (result.epoch, result.params) == (1, {"parallelism": 3})
    replayed = run_sensor_stats(warehouse, landing, master=master)
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    assert last_barrier_params(warehouse)["parallelism"] == 3
    assert table_snapshot(warehouse) == straight
