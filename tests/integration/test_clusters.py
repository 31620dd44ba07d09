"""barrierflow with executors in separate JVMs: a standalone cluster.

The executors read the input, merge state and write every staged file
themselves, importing the barrierflow package that the driver ships
(``SparkContext.addPyFile``), never the driver's interpreter path: checked on
a standalone cluster (a master and two workers with work directories of
their own, as in production). A ``kill -9`` of the driver between two
tables' commits runs on it, with a local and an S3 warehouse; restores at
another parallelism are checked in ``test_savepoint_restore.py``.
``local-cluster`` masters ship the package the same way and are what
``make bench`` runs the big-state benchmark on; they are not run here a
second time. (That results never depend on parallelism, bit for bit, is
checked on a local master in ``test_sensor_stats.py``.) These tests run
Spark SQL's generated code as production does; the rest of the suite runs it
interpreted (``tests/jvm_options.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from barrierflow.datagen import SensorStreamSpec, write_sensor_files
from cli_runner import cli_env, run_sensor_stats, sensor_stats_tables_per_epoch
from jvm_options import with_generated_code
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
)

# Three JVMs per application on two cores: a few minutes for the driver-kill test under CI's load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module", autouse=True)
def _generated_code() -> Iterator[None]:
    """Every JVM of this module (daemons, drivers, executors) runs Spark SQL as production does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAVA_TOOL_OPTIONS", with_generated_code(os.environ.get("JAVA_TOOL_OPTIONS", "")))
        yield


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[str]:
    """A standalone master and two one-core workers from the wheel's ``spark-class``, on 127.0.0.1.

    The workers' environment reaches the test S3 endpoint, as a deployment's
    nodes are configured for its object store.
    """
    import pyspark

    from s3_server import aws_env

    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    work = tmp_path_factory.mktemp("standalone")
    port, ui = _free_port(), _free_port()
    env = {**os.environ, **aws_env(s3_server.endpoint), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(Path(pyspark.__file__).parent)}
    procs = [
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=open(work / "master.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
        )
    ]
    master = f"spark://127.0.0.1:{port}"
    for n in range(2):
        procs.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1", "--cores", "1",
                 "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(work / f"worker-{n}")],
                env=env, stdout=open(work / f"worker-{n}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
            )
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as response:
                    if json.load(response).get("aliveworkers") == 2:
                        break
            except (OSError, ValueError):  # not listening yet, or an empty body while the UI starts (seen in CI)
                pass
            if time.monotonic() > deadline:
                logs = "\n".join((work / f).read_text()[-1500:] for f in ("master.log", "worker-0.log", "worker-1.log"))
                pytest.fail(f"the standalone cluster did not register two workers in 120 s:\n{logs}")
            time.sleep(1)
        yield master
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "landing"
    write_sensor_files(path, SensorStreamSpec(n_files=4, records_per_file=80, seed=31, late_rate=0.05, duplicate_rate=0.1))
    return path


_WHERE = """
import json, sys
from barrierflow.spark import get_spark

def where(batches):
    import os, pyarrow as pa
    import barrierflow.staging
    daemon = sys.modules["__main__"].__spec__.name  # the module the worker's daemon ran as
    for _ in batches:
        yield pa.RecordBatch.from_pylist([{"file": barrierflow.staging.__file__, "pid": os.getpid(), "daemon": daemon}])

spark = get_spark(master=sys.argv[1])
rows = spark.range(8).repartition(4).mapInArrow(where, "file string, pid long, daemon string").collect()
print(json.dumps({"rows": [r.asDict() for r in rows]}))
"""


def test_executors_import_the_shipped_package(standalone: str) -> None:
    master = standalone
    done = subprocess.run([sys.executable, "-c", _WHERE, master], env=cli_env(master=master), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])["rows"]
    import barrierflow.staging

    driver_path = str(Path(barrierflow.staging.__file__).resolve())
    assert rows and all(".zip" in r["file"] and r["file"] != driver_path for r in rows), rows
    # Not barrierflow's worker daemon (barrierflow.spark.worker_conf): a cluster's workers import the shipped package.
    assert {r["daemon"] for r in rows} == {"pyspark.daemon"}, rows


def test_driver_kill_between_commits_then_resume_match_the_reference(standalone: str, landing: Path, warehouse: str) -> None:
    master = standalone
    # The driver dies between epoch 2's second and third table commit; the next run resumes.
    crashed = run_sensor_stats(warehouse, landing, fault=f"commit.after_delta_commit:{sensor_stats_tables_per_epoch() + 2}", master=master)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    resumed = run_sensor_stats(warehouse, landing, master=master)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_matches_reference(warehouse, reference_for(landing, 2))
    assert_one_commit_per_table_per_epoch(warehouse, 2)
    assert_nothing_staged_visible(warehouse)
