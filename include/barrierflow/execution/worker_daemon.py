"""PySpark's Python worker daemon, with the libraries barrierflow's tasks use imported and frozen before it forks.

An executor forks its Python workers from one daemon process
(``spark.python.daemon.module``; barrierflow names this module on a
``local[...]`` master: ``barrierflow.execution.spark.worker_conf``). Two costs
followed every worker:

1. Its first task imported PySpark's worker, pyarrow, pandas and deltalake,
   about half a second per worker.
2. After every task a reused worker runs a full ``gc.collect()``, which
   walked the ~80,000 objects those imports made: some 40 ms a task (over a
   third of a ``sensor_stats`` epoch's worker samples, by py-spy).

So this daemon imports those libraries once and calls ``gc.freeze()`` (the
collector skips what was frozen), then runs PySpark's daemon unchanged.
barrierflow's own modules are not preloaded: a worker imports them from the
path its task gives. A library that does not import is left to the worker.
"""

from __future__ import annotations

import gc
import importlib

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


if __name__ == "__main__":
    preload()
    pyspark.daemon.manager()
