"""barrierflow's Python tasks run in workers forked from barrierflow.execution.worker_daemon, with its modules loaded and frozen,
PySpark and py4j imported from their installed packages (not PySpark's source-only zips), and a young garbage collection after
each task.

On the suite's shared engine (a Spark Connect server started as ``barrierflow
engine`` starts one); the standalone cluster's executors are checked in
``test_clusters.py``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa

from barrierflow.execution.worker_daemon import PRELOADED


def test_python_workers_fork_from_the_preloading_daemon(spark: Any) -> None:
    # Nested: pickled by value (the engine's workers cannot import this test module).
    def _probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import gc
        import sys

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "daemon": sys.modules["__main__"].__spec__.name,
                    "frozen": gc.get_freeze_count(),
                    "missing": ",".join(m for m in PRELOADED if m not in sys.modules),
                    "pyspark": sys.modules["pyspark"].__file__ + " " + sys.modules["py4j"].__file__,
                    # What the daemon runs after each task: a young collection, not PySpark's full one.
                    "after_task": repr(sys.modules["pyspark.daemon"].gc.collect),
                }
            ]
        )

    rows = (
        spark.range(4, numPartitions=2)
        .mapInArrow(_probe, "daemon string, frozen long, missing string, pyspark string, after_task string")
        .collect()
    )
    assert len(rows) == 2
    for row in rows:
        assert row["daemon"] == "barrierflow.execution.worker_daemon"
        assert row["frozen"] > 10_000, "the daemon froze what its imports made before forking"
        assert row["missing"] == "", f"not preloaded: {row['missing']}"
        assert ".zip" not in row["pyspark"], f"PySpark, py4j imported from {row['pyspark']}"
        assert row["after_task"] == "functools.partial(<built-in function collect>, 1)", row["after_task"]
