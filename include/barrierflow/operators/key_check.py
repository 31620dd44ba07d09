"""Keys computed upstream of a keyed operator, checked just before it, as sources check the keys they read.

A key column a keyed operator takes unchanged from a source is checked there (``Pipeline.source_keys``); one computed on the way
(``Pipeline.computed_keys``) is checked here: a null or empty key is a ``null_key`` / ``empty_key`` dead letter (its source, file
and line from ``_seq``, its user columns as JSON), never a NULL group.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.columns import SEQ, file_position, seq_parts, user_columns
from barrierflow.core.dead_letters import DEAD_LETTER_COLUMNS, DeadLetterReason, dead_letter_rows, key_problem, row_json

__all__ = ["split_computed_keys"]


def split_computed_keys(
    rows: pa.Table,
    operator_id: str,
    keys: Sequence[tuple[str, str]],
    source_ids: Sequence[str],
    source_files: Mapping[int, Sequence[str]],
) -> tuple[pa.Table, pa.Table]:
    """``rows`` whose computed ``keys`` ``(column, computed by)`` are neither null nor empty, and the others' dead letters.
    ``source_ids`` and ``source_files`` (source index -> the epoch's files) name where a dead row came from; a key column the rows
    lack is left to the operator's own error."""
    problems = np.full(rows.num_rows, None, dtype=object)
    bad = np.zeros(rows.num_rows, dtype=bool)
    for column, computed_by in keys:
        if column not in rows.column_names:
            continue
        values = rows[column]
        note = f" (computed by {computed_by})"
        checks = [(pc.is_null(values), key_problem(DeadLetterReason.NULL_KEY, column, operator_id, note))]
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            empty = pc.fill_null(pc.equal(values, ""), False)
            checks.append((empty, key_problem(DeadLetterReason.EMPTY_KEY, column, operator_id, note)))
        for failed, text in checks:  # a row's first problem
            hit = failed.to_numpy(zero_copy_only=False) & ~bad
            problems[hit] = text
            bad |= hit
    if not bad.any():
        return rows, pa.schema(DEAD_LETTER_COLUMNS).empty_table()
    dead = rows.filter(pa.array(bad))
    if SEQ in dead.column_names:
        source_index, position, line = seq_parts(dead[SEQ])
        by_position = {file_position(i, f): name for i, files in source_files.items() for f, name in enumerate(files)}
        source: list[str | None] = [source_ids[int(i)] if int(i) < len(source_ids) else None for i in source_index]
        source_file = [by_position.get(int(p)) for p in position]
        lines: list[int | None] = [int(v) for v in line]
    else:
        source = source_file = [None] * dead.num_rows
        lines = [None] * dead.num_rows
    raws = row_json(dead.select(user_columns(dead.column_names)))
    table = dead_letter_rows("", source_file, lines, raws, list(problems[bad]))  # its source: one per row, set here
    sources = pa.array(source, pa.string())
    return rows.filter(pa.array(~bad)), table.set_column(0, pa.schema(DEAD_LETTER_COLUMNS).field("source"), sources)
