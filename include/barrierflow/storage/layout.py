"""Where a pipeline keeps everything inside the warehouse.

```
<warehouse>/<pipeline>/_pipeline.json              key groups, created_at
<warehouse>/<pipeline>/_stopped.json               present while stopped with a savepoint
<warehouse>/<pipeline>/_restoring.json             a restore's intent until it completes
<warehouse>/<pipeline>/_held.json                   present while a reprocessing holds the schedule
<warehouse>/<pipeline>/_lineages/<seq>.json        lineage history
<warehouse>/<pipeline>/_checkpoints                checkpoint log (Delta)
<warehouse>/<pipeline>/_checkpoints/_epochs/<lineage>/<epoch>/barrier.json
<warehouse>/<pipeline>/_checkpoints/_epochs/<lineage>/<epoch>/manifest.json
<warehouse>/<pipeline>/state/<operator>/<state>    keyed state (Delta)
<warehouse>/<pipeline>/sinks/<name>                exactly-once outputs (Delta)
<warehouse>/<pipeline>/dead_letter                 malformed input (Delta)
<table>/_staging/<lineage>/<epoch>/<attempt>/...   pre-committed files, invisible
<warehouse>/_savepoints/<pipeline>/<name>/         self-contained savepoints
```
Staged files sit inside their table's directory because a Delta add action must point into the table; names starting with ``_``
are never read by Delta readers, so nothing staged is visible until a commit adds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from barrierflow.storage.objects import join_uri, list_dir, normalize_uri

__all__ = ["PipelineLayout", "STAGING_DIR", "COMPACTED_DIR", "RESTORED_DIR", "DATA_DIRS"]

STAGING_DIR = "_staging"
COMPACTED_DIR = "_compacted"  # staged files of a compaction: under an epoch's staging directory, or here for maintenance's
RESTORED_DIR = "_restored"  # files a restore writes
# The directories of a table that barrierflow writes data files into. Their names start with '_', so Delta readers never list
# them, and neither does delta-rs's vacuum: maintenance sweeps them itself.
DATA_DIRS = (STAGING_DIR, COMPACTED_DIR, RESTORED_DIR)


class _Under:
    """A location in the pipeline's directory, as an attribute of :class:`PipelineLayout`."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, layout: "PipelineLayout", owner: type) -> str:
        return join_uri(layout.root, *self.parts)


@dataclass(frozen=True)
class PipelineLayout:
    warehouse: str
    pipeline: str

    pipeline_meta = _Under("_pipeline.json")
    lineages = _Under("_lineages")
    checkpoint_log = _Under("_checkpoints")
    lease = _Under("_lease")
    stopped = _Under("_stopped.json")
    restoring = _Under("_restoring.json")
    # Why the pipeline cannot go on (a :class:`~barrierflow.core.errors.BlockedInputError`), until an epoch completes.
    blocked = _Under("_blocked.json")
    held = _Under("_held.json")
    dead_letter = _Under("dead_letter")

    @classmethod
    def of(cls, warehouse: str, pipeline: str) -> "PipelineLayout":
        return cls(normalize_uri(warehouse), pipeline)

    @property
    def root(self) -> str:
        return join_uri(self.warehouse, self.pipeline)

    @property
    def savepoints(self) -> str:
        """Outside the pipeline's directory: vacuum and table rewrites never reach it."""
        return join_uri(self.warehouse, "_savepoints", self.pipeline)

    def savepoint(self, name: str) -> str:
        return join_uri(self.savepoints, name)

    def epoch_dir(self, lineage_id: str, epoch: int) -> str:
        return join_uri(self.checkpoint_log, "_epochs", lineage_id, f"{epoch:010d}")

    def barrier(self, lineage_id: str, epoch: int) -> str:
        return join_uri(self.epoch_dir(lineage_id, epoch), "barrier.json")

    def manifest(self, lineage_id: str, epoch: int) -> str:
        return join_uri(self.epoch_dir(lineage_id, epoch), "manifest.json")

    def state_table(self, operator_id: str, state_name: str) -> str:
        return join_uri(self.root, "state", operator_id, state_name)

    def state_tables(self) -> list[tuple[str, str]]:
        """``(operator_id, state_name)`` of every state table in storage, sorted."""
        root = join_uri(self.root, "state")
        return [(op, st) for op in list_dir(root) for st in list_dir(join_uri(root, op))]

    def sink_table(self, name: str) -> str:
        return join_uri(self.root, "sinks", name)

    @staticmethod
    def staging_prefix(lineage_id: str, epoch: int, attempt_id: str) -> str:
        """Table-relative directory of one attempt's staged files."""
        return f"{STAGING_DIR}/{lineage_id}/{epoch:010d}/{attempt_id}"
