"""A class-data-sharing archive of Spark's classes for the JVMs barrierflow starts (the JDK's AppCDS).

Every Spark JVM loads and verifies the same thousands of classes before its first job. A dynamic archive of them, dumped once per
installation by a throwaway local session (``-XX:ArchiveClassesAtExit``; ``make setup``), is mapped read-only by each JVM
(``-XX:SharedArchiveFile``; README "Run a pipeline from the command line"). A JVM starts as without it (CDS messages silenced)
when it is stale or missing. It is keyed by the JDK, the Spark version and the jars, kept in ``sys.prefix`` or
``$BARRIERFLOW_JVM_ARCHIVE_DIR``; ``BARRIERFLOW_JVM_ARCHIVE=off`` leaves it out.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["archive_path", "java_options", "dump"]

SWITCH_ENV = "BARRIERFLOW_JVM_ARCHIVE"
DIR_ENV = "BARRIERFLOW_JVM_ARCHIVE_DIR"

# Run in a child process: a local session runs the jobs epochs run (Python tasks: the runner's over an RDD or Arrow, the file
# counter's over a few strings) and exits, the driver JVM writing the archive. It prints the JVM's pid for the parent to await.
_DUMP = r"""
import sys
import pyarrow as pa
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.extraJavaOptions", "-XX:ArchiveClassesAtExit=" + sys.argv[1]).getOrCreate())
def task(batches):
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"result": [str(i) for i in batch.column(0).to_pylist()]})
spark.range(2, numPartitions=2).mapInArrow(task, "result string").collect()
spark.createDataFrame([("a",), ("b",)], "uri string").repartition(2).mapInArrow(lambda b: b, "uri string").collect()
spark.sparkContext.parallelize(range(2), 2).mapPartitions(lambda indices: (str(i) for i in indices)).collect()
print("driver JVM pid", spark.sparkContext._jvm.ProcessHandle.current().pid(), flush=True)
spark.stop()
"""


@functools.cache  # stats every jar: once per process, not once per JVM started
def _key() -> str:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    java = shutil.which("java") or "java"
    parts = [pyspark.__version__, os.path.realpath(java), os.environ.get("JAVA_HOME", "")]
    parts += sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path() -> Path:
    """Where this installation's archive is (or would be): its name holds the key of the JDK and Spark's jars."""
    return Path(os.environ.get(DIR_ENV) or sys.prefix) / f"spark-classes-{_key()}.jsa"


def java_options(*, even_if_missing: bool = False) -> str:
    """JVM options that map this installation's archive; empty when it is switched off or (unless ``even_if_missing``) not dumped.

    ``even_if_missing``: for JVMs that may start after a dump in progress ends.
    """
    if os.environ.get(SWITCH_ENV, "").lower() in ("off", "0", "false", "no"):
        return ""
    archive = archive_path()
    if not (even_if_missing or archive.is_file()):
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


def dump(*, timeout_s: float = 300) -> Path | None:
    """Write the archive unless it exists (one writer at a time); returns it, or None if the dump failed.

    A failed dump leaves no file behind: JVMs then start without an archive.
    """
    archive = archive_path()
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent dump finishes first; this one then finds its file
        if archive.exists():
            return archive
        partial = archive.with_name(archive.name + ".partial")  # beside it: the rename below is atomic
        partial.unlink(missing_ok=True)
        # The dumping JVM runs with the options it is given, but never maps an older archive.
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, SWITCH_ENV: "off"}
        run = subprocess.run(
            [sys.executable, "-c", _DUMP, str(partial)], env=env, capture_output=True, text=True, timeout=timeout_s
        )
        # The JVM writes to the same stdout (its CDS messages as it dumps): find the line.
        pids = re.findall(r"^driver JVM pid (\d+)$", run.stdout, re.MULTILINE)
        pid = pids[-1] if run.returncode == 0 and pids else ""
        deadline = time.monotonic() + timeout_s  # the driver JVM writes the archive as it exits, after the Python side has
        while pid.isdigit() and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid.isdigit() and partial.exists() and not Path(f"/proc/{pid}").exists():
            os.replace(partial, archive)
            return archive
        partial.unlink(missing_ok=True)
        print(f"barrierflow: no JVM class archive ({run.stderr[-300:]!r}); JVMs start without one", file=sys.stderr)
        return None


if __name__ == "__main__":
    started = time.monotonic()
    written = dump()
    if written is None:
        sys.exit(1)
    print(f"JVM class archive: {written} ({written.stat().st_size >> 20} MiB, {time.monotonic() - started:.0f} s)")
