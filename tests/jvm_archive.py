"""A class-data-sharing archive of Spark's classes for the JVMs the suite starts (the JDK's AppCDS).

Every Spark JVM a test starts (CLI drivers, spark-submit, engines, standalone
daemons) loads and verifies the same thousands of classes from Spark's jars,
on a machine whose two cores the suite keeps busy. A dynamic archive of them,
dumped once by a throwaway local session (``-XX:ArchiveClassesAtExit``), is
mapped read-only by each JVM (``-XX:SharedArchiveFile``). Measured on this
machine: a local session's start and first job 7-10 s against 14-17 s;
``test_cli.py`` plus ``test_engine_loss.py`` 223 s against 254 s.

The JVM checks the archive itself: one whose class path differs (the launcher
JVM of ``spark-submit``) or that is stale (other jars, another JDK) is not
used, and the JVM starts as it would without it; its CDS warnings are
silenced. The archive is keyed by the JDK, the Spark version and the jars, and
kept beside the virtualenv (``sys.prefix``). The first pytest process dumps
it in the background (about a minute) while the tests start; a JVM started
before it exists, or after a failed dump, just runs without it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["java_options"]

# Driven in a child process: a local session doing what epochs do (JSON and Parquet I/O, an
# aggregate, a window, a join, a cached frame, an Arrow UDF), then an orderly exit, at which the
# driver JVM writes the archive. It prints the JVM's pid, which the parent waits for.
_DUMP = r"""
import sys
from pyspark.sql import SparkSession, Window, functions as F
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.extraJavaOptions", "-XX:ArchiveClassesAtExit=" + sys.argv[1]).getOrCreate())
work = sys.argv[2]
df = spark.createDataFrame([(i % 7, float(i), str(i)) for i in range(2000)], "k int, v double, s string").persist()
df.write.json(work + "/j")
j = spark.read.schema("k int, v double, s string").json(work + "/j")
def same(batches):
    yield from batches
j.mapInArrow(same, j.schema).repartition(2, "k").write.parquet(work + "/p")
p = spark.read.parquet(work + "/p")
p.groupBy("k").agg(F.sum("v"), F.count("*"), F.max("s")).join(df.select("k").distinct(), "k").collect()
p.withColumn("r", F.row_number().over(Window.partitionBy("k").orderBy("v"))).where("r = 1").toArrow()
print(spark.sparkContext._jvm.ProcessHandle.current().pid(), flush=True)
spark.stop()
"""


def _key() -> str:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    java = shutil.which("java") or "java"
    parts = [pyspark.__version__, os.path.realpath(java), os.environ.get("JAVA_HOME", "")]
    parts += sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _dump(archive: Path, env: dict[str, str]) -> None:
    partial = archive.with_name(archive.name + ".partial")  # beside it: the rename below is atomic
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="barrierflow-cds-") as work:
        run = subprocess.run(
            [sys.executable, "-c", _DUMP, str(partial), work], env=env, capture_output=True, text=True, timeout=300
        )
        pid = run.stdout.strip().splitlines()[-1] if run.returncode == 0 and run.stdout.strip() else ""
        # The driver JVM writes the archive as it exits, after the Python side has.
        deadline = time.monotonic() + 180
        while pid.isdigit() and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if partial.exists() and not Path(f"/proc/{pid}").exists():
            os.replace(partial, archive)
        else:
            partial.unlink(missing_ok=True)
            print(f"barrierflow tests: no JVM class archive ({run.stderr[-300:]!r}); JVMs start without one", file=sys.stderr)


def java_options(base_options: str) -> str:
    """``base_options`` plus the archive's; starts dumping it in the background if this installation has none.

    The JVMs started before the dump ends run without it (a missing
    archive is ignored), so the suite never waits for it.
    """
    archive = Path(sys.prefix) / f"spark-classes-{_key()}.jsa"
    if not archive.exists():
        log = open(archive.with_suffix(".log"), "ab")  # noqa: SIM115 - the child's, for as long as it runs
        env = {**os.environ, "JAVA_TOOL_OPTIONS": base_options, "PYSPARK_PYTHON": sys.executable}
        subprocess.Popen(
            [sys.executable, __file__, str(archive)], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()
    return f"{base_options} -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


if __name__ == "__main__":
    target = Path(sys.argv[1])
    with open(target.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one dump, whichever pytest process started first
        except BlockingIOError:
            sys.exit(0)
        if not target.exists():
            _dump(target, dict(os.environ))
