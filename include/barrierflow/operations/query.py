"""SQL over a pipeline's tables as of a completed epoch (a consistent cut), on delta-rs (DataFusion).

Tables: every sink by its name, ``dead_letter``, ``checkpoints`` (the log), and per state
``<operator_id>__<state>`` (the current value per key) and ``<operator_id>__<state>__changelog``."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import date, datetime, timedelta, timezone
from datetime import time as dtime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.core.errors import CheckpointError, QueryError
from barrierflow.state.spec import KEY_GROUP
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import exists

__all__ = ["run_query", "table_uri", "format_rows", "to_jsonable"]


def table_uri(layout: PipelineLayout, name: str) -> str:
    """Where the table named ``name`` in the checkpoint's cut lives."""
    if name == "dead_letter":
        return layout.dead_letter
    if "__" in name:
        operator_id, state = name.split("__", 1)
        return layout.state_table(operator_id, state)
    return layout.sink_table(name)


def _state_view(name: str, table: DeltaTable) -> str:
    columns = [f.name for f in table.schema().fields]
    quoted = ", ".join(f'"{c}"' for c in columns if c not in ("_deleted", "_updated_at_ms"))
    partition = ", ".join(f'"{k}"' for k in columns[: columns.index(KEY_GROUP)])
    return (
        f'"{name}" AS (SELECT {quoted} FROM (SELECT *, row_number() OVER (PARTITION BY {partition} '
        f'ORDER BY "_epoch" DESC) AS "__rn" FROM "{name}__changelog") AS t WHERE "__rn" = 1 AND NOT "_deleted")'
    )


def run_query(warehouse: str, pipeline: str, sql: str, as_of_epoch: int | None = None) -> pa.Table:
    layout = PipelineLayout.of(warehouse, pipeline)
    if not exists(layout.root):
        raise QueryError(f"pipeline {pipeline!r} has no data in warehouse {layout.warehouse}: run it first")
    records = [r for r in CheckpointLog.shared(layout).records() if r.status.value == "COMPLETED"]
    if as_of_epoch is not None:
        records = [r for r in records if r.epoch == as_of_epoch]
        if not records:
            raise CheckpointError(f"epoch {as_of_epoch} is not a completed epoch of {pipeline}")
    if not records:
        raise QueryError(f"pipeline {pipeline!r} has no completed epoch yet")
    record = max(records, key=lambda r: r.recorded_at_us)  # the newest completed (or the one asked for)
    builder = QueryBuilder()
    views: list[str] = []
    versions = record.versions()
    named = _named_tables(sql, [*versions, "checkpoints"])
    try:
        for name in sorted(named & versions.keys()):
            table = DeltaTable(table_uri(layout, name), version=versions[name])
            if "__" in name:
                builder.register(f"{name}__changelog", table)
                views.append(_state_view(name, table))
            else:
                builder.register(name, table)
        if "checkpoints" in named:
            builder.register("checkpoints", DeltaTable(layout.checkpoint_log))
    except DeltaError as exc:
        raise QueryError(f"cannot open the tables of epoch {record.epoch}: {exc}") from exc
    try:
        return pa.table(builder.execute(_with_views(sql.strip().rstrip(";"), views)).read_all())
    except Exception as exc:  # DataFusion raises plain exceptions for SQL errors
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise QueryError(f"query failed: {message}") from exc


def _named_tables(sql: str, names: list[str]) -> set[str]:
    """The tables ``sql`` names (or their changelogs), all for catalog queries: opening a table reads its Delta log."""
    if re.search(r"\b(information_schema|show)\b", sql, flags=re.IGNORECASE):
        return set(names)

    def mentioned(word: str) -> bool:
        return re.search(rf"(?<![\w$]){re.escape(word)}(?![\w$])", sql, flags=re.IGNORECASE) is not None

    return {n for n in names if mentioned(n) or mentioned(f"{n}__changelog")}


def _with_views(sql: str, views: list[str]) -> str:
    """Prefix the state views as CTEs, merging with the query's own WITH."""
    if not views:
        return sql
    sql = re.sub(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", "", sql, count=1, flags=re.DOTALL)  # leading comments
    match = re.match(r"^\s*with\s+(recursive\s+)?", sql, flags=re.IGNORECASE)
    if match:
        return f"WITH {match.group(1) or ''}{', '.join(views)}, {sql[match.end() :]}"
    return f"WITH {', '.join(views)} {sql}"


def to_jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, (date, dtime)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()  # durations as seconds: a plain JSON number
    if isinstance(value, Decimal):
        return str(value)  # exact: a float would round
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN and infinities are not valid JSON
    return value


def format_rows(table: pa.Table, fmt: str) -> str:
    rows = [{k: to_jsonable(v) for k, v in row.items()} for row in pa.table(table).to_pylist()]
    columns = pa.table(table).column_names
    if fmt == "json":
        return json.dumps(rows, indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()} for row in rows)
        return buf.getvalue().rstrip("\n")
    cells = [[("" if r[c] is None else str(r[c])) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths)), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)
