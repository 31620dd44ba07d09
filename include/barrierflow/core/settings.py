"""Every threshold and switch of the engine, each with its meaning, in one place.

Constants are limits of the design (changing one is a code change); a :class:`Setting` comes from the
environment of the process that reads it (a driver, an Airflow task, a Python worker) under its name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from barrierflow.core.errors import ConfigurationError

__all__ = [
    "Setting", "DEFAULT_KEY_GROUPS", "MAX_HELD_STATE_ELEMENTS", "MAX_BROADCAST_RECORDS",
    "SINGLE_TASK_INPUT_BYTES", "SINGLE_TASK_STATE_ROWS", "SPLIT_BYTES", "MIN_SPLIT_BYTES", "INPUT_BYTES_PER_PARTITION",
    "UPSERT_WHOLE_REWRITE_ROWS", "COMPACTION_MAX_FILES", "WORKER_STATE_CACHE_MB", "HOST_CACHE_MIN_ROWS",
    "HEAP_STATE_ROWS", "DEFAULT_WARM_UP_EPOCHS", "LEASE_WAIT_ENV", "DEFAULT_LEASE_WAIT_S",
]  # fmt: skip


@dataclass(frozen=True)
class Setting:
    """A whole-number setting read from the environment: ``BARRIERFLOW_<name>``, else ``default``."""

    env: str
    default: int
    meaning: str
    minimum: int = 0

    def value(self) -> int:
        raw = os.environ.get(self.env)
        if raw is None or not raw.strip():
            return self.default
        try:
            number = int(raw)
        except ValueError:
            number = self.minimum - 1
        if number < self.minimum:
            raise ConfigurationError(f"{self.env}={raw!r}: expected a whole number of at least {self.minimum} ({self.meaning})")
        return number


# -- the pipeline ---------------------------------------------------------
# Key groups (Flink's max parallelism) of a pipeline that declares none; fixed when it is created.
DEFAULT_KEY_GROUPS = 128
# Operator list state and broadcast state are held whole by every task that reads them (Flink keeps them
# on each task's heap): a state of more elements fails the epoch, naming it.
MAX_HELD_STATE_ELEMENTS = 1_000_000
MAX_BROADCAST_RECORDS = 100_000  # a broadcast stream is for low volume: more records in one epoch fail it

# Waiting this long for a running epoch's lease is enough for any epoch on a healthy cluster; a
# process job and the Airflow steps read BARRIERFLOW_LEASE_WAIT_SECONDS (seconds, a decimal) instead when set.
LEASE_WAIT_ENV = "BARRIERFLOW_LEASE_WAIT_SECONDS"
DEFAULT_LEASE_WAIT_S = 600.0

# -- where an epoch runs (a size decision, never a semantic one) ----------
# An epoch reading at most this many bytes of input, whose state tables hold at most SINGLE_TASK_STATE_ROWS
# rows, runs its whole pipeline in one task; a larger one in parallel tasks, split at the key exchanges.
SINGLE_TASK_INPUT_BYTES = Setting(
    "BARRIERFLOW_SINGLE_TASK_INPUT_BYTES", 2 * 2**20, "input bytes up to which an epoch runs its whole pipeline in one task"
)
SINGLE_TASK_STATE_ROWS = Setting(
    "BARRIERFLOW_SINGLE_TASK_STATE_ROWS", 2_000_000, "state rows up to which an epoch may run its whole pipeline in one task"
)
# A parallel epoch reads its input in splits of about total / parallelism bytes, between these bounds.
SPLIT_BYTES = 16 * 1024 * 1024
MIN_SPLIT_BYTES = 1024 * 1024
# A parallel epoch has a key-group range task per this many bytes of input when that is more than
# the pipeline's parallelism: a bulk load run at the parallelism of steady epochs would hold too much per task.
INPUT_BYTES_PER_PARTITION = 32 * 1024 * 1024
DEFAULT_WARM_UP_EPOCHS = 4  # throwaway epochs a new warm engine on a local master runs before serving (barrierflow.tools.warmup)

# -- state and sinks ---------------------------------------------------------
# An upsert sink up to this many rows is rewritten whole each epoch; a larger one rewrites the files that hold a changed key.
UPSERT_WHOLE_REWRITE_ROWS = 100_000
# More files than this and a state table is compacted in the epoch that notices, whatever its row counts.
COMPACTION_MAX_FILES = 32
WORKER_STATE_CACHE_MB = Setting(
    "BARRIERFLOW_WORKER_STATE_CACHE_MB",
    2048,
    "memory per Python worker (and disk per host) caching the rows of state files read (0: off)",
)
# Reads of at least this many rows are also kept for the host's other Python workers (memory-mapped).
HOST_CACHE_MIN_ROWS = 100_000
HEAP_STATE_ROWS = Setting(
    "BARRIERFLOW_RESIDENT_STATE_ROWS",
    5_000_000,
    "live rows of a state table the heap backend keeps resident on its host between epochs (0: never)",
)
