"""Run an operator's kernel on Arrow tables, without Spark: in one task, or split across tasks by key group.

A kernel contract test builds the operator's node, gives it input tables
and the state it starts from, and checks its output, staged state changes
and emitted rows against what the operator's semantics say. ``run_both``
also runs the kernel as a large epoch does, its inputs routed to several
tasks by key-group range (each task reading only its key groups' state),
and asserts the two placements give the same result: the same output rows,
the same state changes and the same emitted rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from barrierflow.core.arrow import after_changes, conform, rows_with_keys
from barrierflow.core.columns import EPOCH, KEY_GROUP, UPDATED_AT
from barrierflow.core.keys import key_groups as compute_key_groups
from barrierflow.execution.exchange import key_group_ranges, owner_of
from barrierflow.operators.base import Exchange, Node
from barrierflow.state.files import unexpired
from barrierflow.state.spec import KeyGroups, StateSpec

__all__ = ["KernelRun", "run_kernel", "run_both", "live_state", "canonical", "node_specs", "upstream"]


def upstream(name: str = "input") -> Node:
    """A stand-in for the node an operator under test consumes (its graph link; the kernel never reads it)."""
    return Node(operator_id=name, parent=None)


class _StateTable:
    """A state table held in memory: the live rows of the task's key groups, and the changes staged."""

    def __init__(self, spec: StateSpec, live: pa.Table, groups: KeyGroups, processing_time_ms: int) -> None:
        self.spec = spec
        schema = spec.arrow_schema()
        live = unexpired(conform(live, schema), spec.ttl_ms, processing_time_ms)
        mask = np.isin(live[KEY_GROUP].to_numpy(zero_copy_only=False), list(groups)) if live.num_rows else np.zeros(0, bool)
        self.live = live.filter(pa.array(mask))
        self.changes: pa.Table | None = None

    def live_rows(self, keys: pa.Table) -> pa.Table:
        return rows_with_keys(self.live, keys, [c for c in self.spec.key_columns if c in keys.column_names])

    def every_live_row(self) -> pa.Table:
        return self.live

    def stage(self, changes: pa.Table) -> None:
        assert self.changes is None, f"{self.spec.table_name} staged twice"
        self.changes = changes


@dataclass
class _Task:
    epoch: int
    processing_time_ms: int
    key_groups: int
    parallelism: int
    first_task: bool
    watermark_prev_us: int | None
    watermark_us: int | None
    live: Mapping[str, pa.Table]
    groups: KeyGroups
    whole: frozenset[str]
    tables: dict[str, _StateTable] = field(default_factory=dict)
    emitted: dict[str, list[pa.Table]] = field(default_factory=dict)
    upserts: dict[str, pa.Table] = field(default_factory=dict)
    observations: list[tuple[str, int | None, int]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def state(self, spec: StateSpec) -> _StateTable:
        if spec.table_name not in self.tables:
            groups = KeyGroups.all(self.key_groups) if spec.table_name in self.whole else self.groups
            live = self.live.get(spec.table_name, spec.arrow_schema().empty_table())
            self.tables[spec.table_name] = _StateTable(spec, live, groups, self.processing_time_ms)
        return self.tables[spec.table_name]

    def emit(self, table: str, rows: pa.Table) -> None:
        self.emitted.setdefault(table, []).append(rows)

    def upsert(self, table: str, rows: pa.Table, key: Sequence[str]) -> None:
        assert table not in self.upserts
        self.upserts[table] = rows

    def observe_event_time(self, assigner_id: str, max_us: int | None, out_of_orderness_us: int) -> None:
        self.observations.append((assigner_id, max_us, out_of_orderness_us))

    def count(self, what: str, n: int) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


@dataclass
class KernelRun:
    """What a kernel did in one epoch."""

    output: pa.Table
    changes: dict[str, pa.Table]  # state table -> staged changes (key columns, key group, values, _deleted)
    emitted: dict[str, pa.Table]  # append table -> rows
    upserts: dict[str, pa.Table]
    observations: list[tuple[str, int | None, int]]
    counts: dict[str, int]


def node_specs(node: Node, inputs: Sequence[pa.Table]) -> dict[str, StateSpec]:
    return {s.table_name: s for s in node.state_specs([t.schema for t in inputs])}


def run_kernel(
    node: Node,
    inputs: Sequence[pa.Table],
    *,
    state: Mapping[str, pa.Table] | None = None,
    epoch: int = 1,
    processing_time_ms: int = 0,
    key_groups: int = 8,
    parallelism: int = 2,
    watermark_prev_us: int | None = None,
    watermark_us: int | None = None,
    whole: Sequence[str] = (),
    groups: KeyGroups | None = None,
) -> KernelRun:
    """The kernel of ``node`` in one task holding ``groups`` (all key groups by default)."""
    groups = groups or KeyGroups.all(key_groups)
    task = _Task(
        epoch, processing_time_ms, key_groups, parallelism, groups.low == 0, watermark_prev_us, watermark_us,
        dict(state or {}), groups, frozenset(whole),
    )  # fmt: skip
    output = node.run(task, list(inputs))
    return KernelRun(
        output=output,
        changes={name: t.changes for name, t in task.tables.items() if t.changes is not None},
        emitted={name: pa.concat_tables(parts) for name, parts in task.emitted.items()},
        upserts=task.upserts,
        observations=task.observations,
        counts=task.counts,
    )


def canonical(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows as a sorted list: order across tasks is not a result (NaN compared as itself)."""
    rows = [{k: "NaN" if isinstance(v, float) and v != v else v for k, v in row.items()} for row in table.to_pylist()]
    return sorted(rows, key=lambda r: repr(sorted(r.items())))


def _split(node: Node, inputs: Sequence[pa.Table], tasks: int, groups: int) -> list[list[pa.Table]]:
    """Each task's inputs, routed as the exchanges of ``node`` route them."""
    per_task: list[list[pa.Table]] = [[] for _ in range(tasks)]
    for rows, exchange, key in zip(inputs, node.exchanges(), node.input_keys()):
        if exchange is Exchange.KEYED:
            kg = compute_key_groups(rows.select(list(key)), groups).to_numpy()
            owners = owner_of(kg, tasks, groups)
            for t in range(tasks):
                per_task[t].append(rows.filter(pa.array(owners == t)))
        elif exchange is Exchange.BROADCAST:
            for t in range(tasks):
                per_task[t].append(rows)
        elif exchange is Exchange.GLOBAL:
            for t in range(tasks):
                per_task[t].append(rows if t == 0 else rows.schema.empty_table())
        else:
            bounds = [rows.num_rows * t // tasks for t in range(tasks + 1)]
            for t in range(tasks):
                per_task[t].append(rows.slice(bounds[t], bounds[t + 1] - bounds[t]))
    return per_task


def run_both(node: Node, inputs: Sequence[pa.Table], *, tasks: int = 3, singleton: bool = False, **kwargs: Any) -> KernelRun:
    """The kernel in one task and split across ``tasks`` tasks by key-group range; asserts both give the same result.

    ``singleton``: the operator runs in the first task only (its inputs all arrive there).
    Returns the one-task run.
    """
    whole = list(kwargs.get("whole", ()))
    key_groups = kwargs.get("key_groups", 8)
    one = run_kernel(node, inputs, **kwargs)
    ranges = key_group_ranges(tasks, key_groups)
    runs = []
    for t, (groups, task_inputs) in enumerate(zip(ranges, _split(node, inputs, len(ranges), key_groups))):
        if singleton and t > 0:
            continue
        runs.append((t, run_kernel(node, task_inputs, groups=groups, **kwargs)))
    assert canonical(pa.concat_tables([r.output for _, r in runs])) == canonical(one.output), "output differs between placements"
    for name in set(one.changes) | {n for _, r in runs for n in r.changes}:
        parts = [r.changes[name] for t, r in runs if name in r.changes and (name not in whole or t == 0)]
        split = pa.concat_tables(parts) if parts else None
        assert (split is None and name not in one.changes) or (
            split is not None and name in one.changes and canonical(split) == canonical(one.changes[name])
        ), f"state changes of {name} differ between placements"
    for name in set(one.emitted) | {n for _, r in runs for n in r.emitted}:
        split_rows = [r.emitted[name] for _, r in runs if name in r.emitted]
        assert canonical(pa.concat_tables(split_rows)) == canonical(one.emitted.get(name, split_rows[0].schema.empty_table())), (
            f"rows of {name} differ between placements"
        )
    return one


def live_state(
    spec: StateSpec, before: pa.Table | None, changes: pa.Table, *, epoch: int, processing_time_ms: int = 0
) -> pa.Table:
    """The live rows of ``spec`` after an epoch's ``changes`` (for a test running several epochs)."""
    schema = spec.arrow_schema()
    rows = changes.append_column(UPDATED_AT, pa.repeat(pa.scalar(processing_time_ms, pa.int64()), changes.num_rows))
    rows = conform(rows.append_column(EPOCH, pa.repeat(pa.scalar(epoch, pa.int64()), changes.num_rows)), schema)
    base = conform(before, schema) if before is not None else schema.empty_table()
    return after_changes(base, rows, spec.key_columns)
