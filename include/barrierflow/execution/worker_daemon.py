"""PySpark's Python worker daemon, with the libraries barrierflow's tasks use imported and frozen before it forks.

An executor forks its Python workers from one daemon process (``spark.python.daemon.module``:
:func:`barrierflow.execution.spark.worker_conf` on a ``local[...]`` master). Without this one, each worker's first task imported
those libraries (~0.5 s), and the full ``gc.collect()`` after every task walked their ~80,000 objects (~40 ms a task); frozen
(``gc.freeze()``), they are skipped; the full collection after each task still took 20-40 ms, a young one takes none (Python's
thresholds still run full ones). barrierflow's own modules are not preloaded: a worker imports them from its task's path.
"""

from __future__ import annotations

import functools
import gc
import importlib
import types

import pyspark.daemon

__all__ = ["PRELOADED", "preload"]

# What barrierflow's Python tasks import from other packages.
PRELOADED = ("pyspark.worker", "pyarrow", "pyarrow.compute", "pyarrow.json", "pyarrow.parquet", "numpy", "pandas", "deltalake")


def preload() -> None:
    """Import :data:`PRELOADED` (each that can be), then move every object made so far out of the collector's way."""
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the worker imports it with its task, as without this daemon
    gc.collect()
    gc.freeze()
    pyspark.daemon.gc = types.SimpleNamespace(collect=functools.partial(gc.collect, 1))  # type: ignore[assignment]


if __name__ == "__main__":
    preload()
    pyspark.daemon.manager()
