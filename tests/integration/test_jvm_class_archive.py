"""A Spark JVM that barrierflow starts maps the class-data-sharing archive (barrierflow.execution.jvm_archive).

The production path, without the suite's own JVM options: a classic
session's driver JVM, started by ``barrierflow.execution.spark.get_spark``, must have
the archive mapped (listed in its ``/proc/<pid>/maps``, beside the JDK's own archive), i.e. the JVM
accepted it rather than silently starting without it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from barrierflow.execution import jvm_archive

_CHILD = r"""
import sys
from barrierflow.execution.spark import get_spark
spark = get_spark(master="local[1]")
pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
print(sum(1 for line in open(f"/proc/{pid}/maps") if line.rstrip().endswith(sys.argv[1])))
"""


def test_a_classic_session_driver_maps_the_archive() -> None:
    archive = jvm_archive.dump()  # made by `make setup`; waits for a dump in progress
    assert archive is not None and archive.is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_TOOL_OPTIONS", jvm_archive.SWITCH_ENV)}
    env.pop("BARRIERFLOW_SPARK_REMOTE", None)
    run = subprocess.run([sys.executable, "-c", _CHILD, str(archive)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout.strip().splitlines()[-1]) >= 1, f"the driver JVM did not map {archive}"
