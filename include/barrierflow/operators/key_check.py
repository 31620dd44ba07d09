"""Keys computed upstream of a keyed operator are checked before it consumes them, as sources check the keys they read.

Flink refuses a null key; here a key column that reaches a keyed operator
(deduplicate, ``key_by`` and what follows it, joins) unchanged from a source
is checked by the source (``Pipeline.source_keys``). One computed on the way
(a map, select or flat_map: ``Pipeline.computed_keys``) is checked here,
just before the operator: a row whose key is null, or an empty string, is a
``null_key`` / ``empty_key`` dead letter of the epoch, never a NULL group;
the other rows go on to the operator. Only such inputs pay for the check.

A dead letter names the source, file and line its record came from (decoded
from ``_seq``), its ``raw`` text is the row as JSON (user columns).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.columns import SEQ, file_position, seq_parts, user_columns
from barrierflow.core.dead_letters import DEAD_LETTER_COLUMNS, DeadLetterReason, key_problem, row_json

__all__ = ["split_computed_keys"]


def split_computed_keys(
    rows: pa.Table,
    operator_id: str,
    keys: Sequence[tuple[str, str]],
    source_ids: Sequence[str],
    source_files: Mapping[int, Sequence[str]],
) -> tuple[pa.Table, pa.Table]:
    """``rows`` whose computed ``keys`` ``(column, computed by)`` are neither null nor empty, and the others' dead letters.

    ``source_ids`` and ``source_files`` (source index -> the epoch's file
    names) name where a dead row came from. A key column the rows lack is
    left to the operator, whose own error names it.
    """
    problems: list[str | None] = [None] * rows.num_rows
    bad = np.zeros(rows.num_rows, dtype=bool)
    for column, computed_by in keys:
        if column not in rows.column_names:
            continue
        values = rows[column]
        note = f" (computed by {computed_by})"
        checks = [(pc.is_null(values), key_problem(DeadLetterReason.NULL_KEY, column, operator_id, note))]
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            checks.append(
                (pc.fill_null(pc.equal(values, ""), False), key_problem(DeadLetterReason.EMPTY_KEY, column, operator_id, note))
            )
        for failed, text in checks:
            hit = failed.to_numpy(zero_copy_only=False) & ~bad
            for i in np.flatnonzero(hit):
                problems[i] = text
            bad |= hit
    if not bad.any():
        return rows, pa.schema(DEAD_LETTER_COLUMNS).empty_table()
    dead = rows.filter(pa.array(bad))
    names = user_columns(dead.column_names)
    if SEQ in dead.column_names:
        source_index, position, line = seq_parts(dead[SEQ])
        by_position = {file_position(i, f): name for i, files in source_files.items() for f, name in enumerate(files)}
        source = [source_ids[int(i)] if int(i) < len(source_ids) else None for i in source_index]
        source_file = [by_position.get(int(p)) for p in position]
        lines: list[int | None] = [int(v) for v in line]
    else:
        source, source_file, lines = [None] * dead.num_rows, [None] * dead.num_rows, [None] * dead.num_rows
    texts = [p for p, b in zip(problems, bad) if b]
    reasons = [t.split(": ", 1) for t in texts if t is not None]
    table = pa.table(
        {
            "source": pa.array(source, pa.string()),
            "source_file": pa.array(source_file, pa.string()),
            "line": pa.array(lines, pa.int64()),
            "raw": pa.array(row_json(dead.select(names)), pa.string()),
            "reason": pa.array([r[0] for r in reasons], pa.string()),
            "detail": pa.array([r[1] for r in reasons], pa.string()),
        },
        schema=pa.schema(DEAD_LETTER_COLUMNS),
    )
    return rows.filter(pa.array(~bad)), table
