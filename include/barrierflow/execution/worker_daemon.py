"""PySpark's Python worker daemon, with barrierflow's task runner and the libraries it uses imported and frozen before it forks.

An executor forks its Python workers from one daemon (``spark.python.daemon.module``: :func:`.spark.worker_conf`, on a ``local``
master, where the driver's barrierflow is installed). Without it each worker imported them (~0.6 s), and PySpark's full
``gc.collect()`` after each task walked their ~80,000 objects (~40 ms); frozen (``gc.freeze()``), they are skipped, and a young
collection replaces the full one. A pipeline's own modules are imported from its task's path."""

from __future__ import annotations

import functools
import gc
import importlib
import sys
import types

# PySpark puts its zips (pyspark, py4j) first on a worker's path: sources only, compiled anew by every daemon (~0.6 s). Where they
# ship in pip's PySpark (one release, py4j pinned), the installed packages, with their cached bytecode, go first.
if __name__ == "__main__":  # the daemon's process; an import elsewhere leaves the path alone
    sys.path.sort(key=lambda entry: "/pyspark/python/lib/" in entry and entry.endswith(".zip"))
import pyspark.daemon  # noqa: E402 - after the path above

__all__ = ["PRELOADED", "preload"]

# PySpark's worker and barrierflow's task runner, which imports what tasks use of pyarrow, numpy, pandas and deltalake.
PRELOADED = ("pyspark.worker", "barrierflow.execution.task")


def preload() -> None:
    """Import :data:`PRELOADED`, then move every object made so far out of the collector's way."""
    for name in PRELOADED:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()
    pyspark.daemon.gc = types.SimpleNamespace(collect=functools.partial(gc.collect, 1))  # type: ignore[assignment]


if __name__ == "__main__":
    preload()
    pyspark.daemon.manager()
