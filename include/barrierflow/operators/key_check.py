"""Keys computed upstream of a keyed operator are checked before it consumes them, as sources check the keys they read.

Flink refuses a null key; here a key column that reaches a keyed operator
(deduplicate, ``key_by`` and what follows it, joins) unchanged from a source
is checked by the source (``Pipeline.source_keys``). One computed on the way
(a map, select or flat_map: ``Pipeline.computed_keys``) is checked here,
just before the operator: a row whose key is null, or an empty string, is a
``null_key`` / ``empty_key`` dead letter of the epoch, never a NULL group;
the other rows go on to the operator. Only such inputs pay for the check.

A dead letter names the source, file and line its record came from (decoded
from ``_seq``), its ``raw`` text is the row as JSON (user columns). An input
without ``_seq`` comes from an unordered read (no consumer needed arrival
order): if any of its rows is a dead letter, the runtime computes the epoch
again with ordered reads, as for a bad input line, so that every dead letter
has its file and line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from barrierflow.connectors.dead_letters import first_problem, reason_and_detail
from barrierflow.connectors.dead_letters import key_problems as source_key_problems
from barrierflow.connectors.source import SEQ, file_position, seq_parts
from barrierflow.operators.base import Node, user_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["split_computed_keys", "key_problems"]

_PROBLEM = "_key_problem"


def key_problems(operator_id: str, keys: list[tuple[str, str, bool]]) -> list[tuple[str, str, str]]:
    """``(column, check, problem string)`` for each key ``(column, computed by, is a string)``: null, and empty if a string.

    ``check`` is ``"null"`` or ``"empty"``; the wording is the sources' (:func:`dead_letters.key_problems`),
    plus the operator that computed the key.
    """
    return [
        (column, check, text)
        for column, computed_by, is_string in keys
        for check, text in source_key_problems(column, operator_id, is_string, f" (computed by {computed_by})")
    ]


def split_computed_keys(ctx: Any, node: Node, index: int, frame: "DataFrame", keys: list[tuple[str, str]]) -> "DataFrame":
    """``frame`` (input ``index`` of ``node``) without the rows whose computed ``keys`` ``(column, computed by)`` are null or empty.

    Those rows are handed to ``ctx`` (:meth:`EpochContext.add_key_dead_letters`)
    as dead-letter rows. A key column the input lacks is left to the
    operator, whose own error names it.
    """
    from pyspark.sql import functions as F

    types = dict(frame.dtypes)
    checks = key_problems(node.operator_id, [(c, by, types[c] == "string") for c, by in keys if c in types])
    if not checks:
        return frame
    conditions = [
        (F.col(column).isNull() if check == "null" else F.col(column) == F.lit(""), text) for column, check, text in checks
    ]
    error = first_problem(conditions)
    assert error is not None  # there are checks
    checked = frame.withColumn(_PROBLEM, error)
    if not ctx.is_cached(frame):
        # The operator and the dead letters read the rows: computed once (a Python map upstream runs once).
        checked = ctx.persist(checked)
    good = ctx.cached_view(checked.where(F.col(_PROBLEM).isNull()).drop(_PROBLEM))
    sources = ctx.pipeline.upstream_sources(node.inputs()[index])
    ordered = SEQ in types
    dead = _dead_letter_rows(ctx, node, checked.where(F.col(_PROBLEM).isNotNull()), [s.operator_id for s in sources], ordered)
    # Without ``_seq`` (an unordered read upstream) the rows have no file and line: any dead letter means an ordered read.
    probe = not ordered and any(s.operator_id in ctx.unordered_sources for s in sources)
    ctx.add_key_dead_letters(node, index, dead, probe)
    return good


def _dead_letter_rows(ctx: Any, node: Node, bad: "DataFrame", sources: list[str], ordered: bool) -> "DataFrame":
    """The dead-letter table's columns (but ``_epoch``) of rows refused before ``node``."""
    from pyspark.sql import functions as F

    reason, detail = reason_and_detail(F.col(_PROBLEM))
    raw = F.to_json(F.struct(*[F.col(c) for c in user_columns(bad)]))
    if ordered:
        source_index, position, line_number = seq_parts(F.col(SEQ))
        ids = F.array(*[F.lit(s.operator_id) for s in ctx.pipeline.sources])
        source = F.element_at(ids, (source_index + 1).cast("int"))
        names = [(file_position(i, f), name) for i, files in sorted(ctx.source_files.items()) for f, name in enumerate(files)]
        by_position = F.create_map(*[c for key, name in names for c in (F.lit(key).cast("long"), F.lit(name))])
        source_file = F.element_at(by_position, position) if names else F.lit(None).cast("string")
    else:
        source = F.lit(sources[0] if len(sources) == 1 else node.operator_id)
        source_file, line_number = F.lit(None).cast("string"), F.lit(None).cast("long")
    return bad.select(
        source.alias("source"),
        source_file.alias("source_file"),
        line_number.alias("line"),
        raw.alias("raw"),
        reason.alias("reason"),
        detail.alias("detail"),
    )
