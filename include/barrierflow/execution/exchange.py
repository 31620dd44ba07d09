"""How rows cross from one stage's tasks to the next: partitioned by key-group range, as Arrow files.

Where Flink sends a keyed stream's records over the network, a task here writes, for each edge to a later stage, one Arrow IPC
file per receiving task into the attempt's exchange directory (inside its staging directory: deleted with it on abort, or once the
epoch's tables are staged).

Task ``t`` of ``n`` owns key groups ``ceil(t * G / n)`` to ``floor(((t + 1) * G - 1) / n)`` of ``G``, and key group ``g`` belongs
to task ``g * n // G``, as Flink's ``KeyGroupRangeAssignment``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.keys import key_groups
from barrierflow.operators.base import Exchange
from barrierflow.plan.planner import Edge
from barrierflow.state.spec import KeyGroups
from barrierflow.storage.objects import arrow_filesystem, is_local, join_uri

__all__ = ["partition", "write_exchange", "read_exchange", "key_group_ranges", "owner_of"]


def key_group_ranges(tasks: int, total: int) -> list[KeyGroups]:
    """The key groups of each of ``tasks`` tasks: contiguous ranges covering ``[0, total)`` (a task may hold none)."""
    return [KeyGroups(-(-t * total // tasks), ((t + 1) * total - 1) // tasks, total) for t in range(tasks)]


def owner_of(groups: np.ndarray, tasks: int, total: int) -> np.ndarray:
    """The task owning each key group (the inverse of :func:`key_group_ranges`)."""
    return (groups.astype(np.int64) * tasks) // total


def partition(rows: pa.Table, edge: Edge, total: int, tasks: int) -> dict[int, pa.Table]:
    """``rows`` split by receiving task: by key group (``KEYED``, carrying :data:`KEY_GROUP`), all to task 0 or to every task."""
    if edge.exchange is Exchange.KEYED:
        if KEY_GROUP not in rows.column_names:
            rows = rows.append_column(KEY_GROUP, key_groups(rows.select(list(edge.key)), total))
        owners = owner_of(rows[KEY_GROUP].to_numpy(), tasks, total)
        order = np.argsort(owners, kind="stable")
        rows, bounds = rows.take(pa.array(order)), np.searchsorted(owners[order], np.arange(tasks + 1))
        return {t: rows.slice(int(bounds[t]), int(bounds[t + 1] - bounds[t])) for t in range(tasks)}
    if edge.exchange is Exchange.BROADCAST:
        return {t: rows for t in range(tasks)}
    return {0: rows}  # GLOBAL (and FORWARD across a stage boundary: one task)


def write_exchange(directory: str, edge: Edge, sender: int, receiver: int, rows: pa.Table) -> str:
    """One exchange file: ``rows`` of ``edge`` from task ``sender`` to task ``receiver``; its URI."""
    uri = join_uri(directory, f"{edge.name}/{sender}-{receiver}.arrow")
    fs, path = arrow_filesystem(uri)
    if is_local(uri):  # an object store has no directories
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    options = ipc.IpcWriteOptions(compression=None if is_local(uri) else "lz4")  # a local file: in the page cache
    with fs.open_output_stream(path) as sink, ipc.new_file(sink, rows.schema, options=options) as writer:
        writer.write_table(rows)
    return uri


def read_exchange(uris: tuple[str, ...] | list[str], schema: pa.Schema, edge: Edge) -> pa.Table:
    """The rows of ``edge`` sent to this task, in sender order (a ``KEYED`` edge's carry :data:`KEY_GROUP`)."""
    parts = []
    for uri in uris:
        fs, path = arrow_filesystem(uri)
        with fs.open_input_file(path) as source:
            parts.append(ipc.open_file(source).read_all())
    if not parts:
        fields = list(schema) + ([pa.field(KEY_GROUP, pa.int32())] if edge.exchange is Exchange.KEYED else [])
        return pa.schema(fields).empty_table()
    return pa.concat_tables(parts)
