"""PySpark's Python worker daemon, with the libraries barrierflow's tasks use imported and frozen before it forks.

An executor forks its Python workers from one daemon process
(``spark.python.daemon.module``, PySpark's own ``pyspark.daemon`` by
default; barrierflow's sessions and engines on a ``local[...]`` master name
this module, see ``barrierflow.execution.spark.worker_conf``). Two costs followed
every worker:

1. Its first task imported PySpark's worker, pyarrow, pandas and deltalake
   (unpickling the task's functions), about half a second per worker.
2. After every task a reused worker runs a full ``gc.collect()``
   (``pyspark/daemon.py``), which walked every object those imports made,
   about 80,000: some 40 ms a task. A ``sensor_stats`` epoch runs dozens of
   Python tasks; py-spy found over a third of its workers' samples in that call.

So this daemon imports those libraries once and then calls ``gc.freeze()``:
the forked workers start with them loaded, and the collector skips what was
frozen (objects that tasks make are collected as before; barrierflow's own
modules add about 6,000, 1 ms a collection). Then it runs PySpark's daemon
unchanged. barrierflow's own modules are not preloaded: a worker imports
them from the path its task gives, as it would without this daemon. A
library that does not import is left to the worker too.
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
