"""What every operator is: a node of the pipeline graph whose semantics are one kernel over Arrow data.

When the pipeline is planned, a node declares from its inputs' schemas its output schema, state tables, side outputs and how each
input reaches it (:class:`Exchange`: the planner cuts chains there, as Flink between ``keyBy``s). Its kernel, :meth:`Node.run`,
computes an epoch's output through the :class:`Task`, in one task holding every key group or in parallel tasks holding some each:
it sees every record of its keys, never every key group.
"""

from __future__ import annotations

import enum
import sys
import sysconfig
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.columns import EPOCH, KEY_GROUP, UPDATED_AT, position_columns, user_columns
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.core.keys import key_groups
from barrierflow.core.settings import MAX_HELD_STATE_ELEMENTS
from barrierflow.state.spec import StateSpec

if TYPE_CHECKING:
    from barrierflow.state.table import StateTable

__all__ = [
    "Node", "Exchange", "Task", "with_key_group", "key_fields", "key_ids", "ids_in", "held_state_table", "check_held_state_size",
    "ship_user_code", "folded_sums", "user_columns", "position_columns", "check_event_time", "check_numeric_columns",
    "calling_user_code",
]  # fmt: skip

_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})  # on every worker's path


class Exchange(enum.Enum):
    """How an input's rows reach an operator's tasks."""

    FORWARD = "forward"  # in the task that produced them
    KEYED = "keyed"  # by the key group of the operator's key columns on that input
    GLOBAL = "global"  # every row to one task
    BROADCAST = "broadcast"  # every row to every task of the operator


class Task(Protocol):
    """What a kernel sees of the task running it: the epoch's clocks, its state, and where its extra rows go."""

    epoch: int
    processing_time_ms: int  # the barrier's: a retry sees the same
    key_groups: int  # the pipeline's max parallelism
    parallelism: int  # the pipeline's, as the barrier fixed it (a non-keyed operator's subtasks)
    first_task: bool  # whether this is the first task of its stage (rows every task computes alike are emitted by it alone)

    # W(n-1), the watermark at the epoch's start; W(n), final by the time an event-time operator runs.
    @property
    def watermark_prev_us(self) -> int | None: ...
    @property
    def watermark_us(self) -> int | None: ...
    # One of the operator's state tables (declared by :meth:`Node.state_specs`).
    def state(self, spec: StateSpec) -> "StateTable": ...
    # Rows of an append table (a side output, an append sink); ``_epoch`` is added when they are staged.
    def emit(self, table: str, rows: pa.Table) -> None: ...
    # An upsert sink's rows (``_epoch`` included), one per key: they replace the stored rows of their keys.
    def upsert(self, table: str, rows: pa.Table, key: Sequence[str]) -> None: ...
    # A watermark assigner's largest event time among the task's records (None: it saw none).
    def observe_event_time(self, assigner_id: str, max_us: int | None, out_of_orderness_us: int) -> None: ...
    # Add ``n`` to the epoch's counter ``what``, a message with ``{n}`` (``"dropped {n} late records"``) the driver logs.
    def count(self, what: str, n: int) -> None: ...


@dataclass
class Node:
    """One operator of the pipeline graph, identified by a stable operator id."""

    operator_id: str
    parent: "Node | None"

    uses_watermark = False  # it reads the watermark (windows, joins, timers): it must be downstream of every assigner

    def inputs(self) -> tuple["Node", ...]:
        """The nodes whose output this one consumes, in order: its parent; more for a multi-input operator."""
        return () if self.parent is None else (self.parent,)

    def keyed_inputs(self) -> list[tuple["Node", tuple[str, ...]]]:
        """Each input with the key columns the operator takes from its records (none for an operator without a key)."""
        key = tuple(getattr(self, "key", ()))
        return [(node, key) for node in self.inputs()] if key else []

    def exchanges(self) -> tuple[Exchange, ...]:
        """How each input reaches the operator: by key group for a keyed operator, else forward."""
        return tuple(Exchange.KEYED if getattr(self, "key", ()) else Exchange.FORWARD for _ in self.inputs())

    def input_keys(self) -> tuple[tuple[str, ...], ...]:
        """Each input's key columns (for a ``KEYED`` exchange; empty otherwise)."""
        return tuple(key for _, key in self.keyed_inputs()) or tuple(() for _ in self.inputs())

    def passes_through(self, column: str) -> bool:
        """Whether ``column`` of its output is that of its input record, unchanged (a key checked at the source)."""
        return False

    def key_output(self) -> tuple[str, ...]:
        """Columns of its output holding its own keys, which were checked before it (never null nor empty)."""
        return ()

    def unique_by(self) -> tuple[str, ...] | None:
        """Columns of which the operator's output holds at most one row per value in an epoch (None: no such promise)."""
        return None

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        """The schema of its output given its inputs' (arrival-position columns included)."""
        raise NotImplementedError(type(self).__name__)

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        """Its state tables; with ``inputs``, their key columns typed by the inputs' schemas (else strings)."""
        return []

    def side_outputs(self) -> list[str]:
        """The append tables it writes beside its output (late records...)."""
        return []

    def side_output_schemas(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        """Each side output's rows' schema (without ``_epoch``), given its inputs'."""
        return {}

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """One epoch's output from each input's rows (in :meth:`inputs` order), as ``output_schema`` says."""
        raise NotImplementedError(type(self).__name__)

    def describe(self) -> dict[str, Any]:
        return {"operator_id": self.operator_id, "type": type(self).__name__}


def with_key_group(rows: pa.Table, key: Sequence[str], groups: int) -> pa.Table:
    """``rows`` with :data:`KEY_GROUP` of ``key`` appended (kept if a keyed exchange already added it)."""
    return rows if KEY_GROUP in rows.column_names else rows.append_column(KEY_GROUP, key_groups(rows.select(list(key)), groups))


def key_fields(key: Sequence[str], schema: pa.Schema | None) -> tuple[pa.Field, ...]:
    """A state table's key columns ``key``, typed as the input ``schema`` types them (strings without it: the untyped default)."""
    return tuple(pa.field(k, schema.field(k).type if schema is not None and k in schema.names else pa.string()) for k in key)


def key_ids(parts: Sequence[pa.Table], columns: Sequence[str]) -> tuple[pa.Table, list[np.ndarray]]:
    """The sorted distinct values of ``columns`` in ``parts`` (NaN above numbers, nulls last), each part's rows' index among them.
    Nulls equal nulls and NaN equals NaN, as Spark groups keys."""
    schema = pa.schema([f.with_nullable(True) for f in parts[0].select(list(columns)).schema])
    every = pa.concat_tables([p.select(list(columns)).cast(schema) for p in parts])
    order = pc.sort_indices(every, sort_keys=[(c, "ascending") for c in columns]).to_numpy()
    starts = np.arange(every.num_rows) == 0  # the sorted rows starting a value: differing from the row before
    for column in every.take(order).combine_chunks().columns:
        same = pc.fill_null(pc.equal(column[1:], column[:-1]), pc.and_(pc.is_null(column[1:]), pc.is_null(column[:-1])))
        if pa.types.is_floating(column.type):
            same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(column[1:]), pc.is_nan(column[:-1])), False))
        starts[1:] |= ~same.to_numpy(zero_copy_only=False)
    ids = np.empty(every.num_rows, dtype=np.int64)
    ids[order] = np.cumsum(starts) - 1
    bounds = np.cumsum([0, *(p.num_rows for p in parts)])
    return every.take(pa.array(order[starts])), [ids[bounds[i] : bounds[i + 1]] for i in range(len(parts))]


def ids_in(keys: pa.Table, rows: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Each of ``rows``' index among ``keys`` (distinct, as :func:`key_ids` made them) by its key columns; -1 if absent."""
    _, (of_keys, of_rows) = key_ids([keys.select(list(key)), rows.select(list(key))], key)
    position = np.full(len(of_keys) + len(of_rows), -1, dtype=np.int64)
    position[of_keys] = np.arange(len(of_keys))
    return position[of_rows]


def check_event_time(what: str, schema: pa.Schema, column: str) -> None:
    """Refuse an event-time ``column`` that ``schema`` lacks or holds as other than a timestamp (``what``: the operator)."""
    if column not in schema.names or not pa.types.is_timestamp(schema.field(column).type):
        found = schema.field(column).type if column in schema.names else "no such column"
        raise PipelineDefinitionError(
            f"{what}: its event-time column {column!r} must be a timestamp "
            f"(found: {found}; columns: {user_columns(schema.names)})"
        )


@contextmanager
def calling_user_code(label: str, where: Callable[[], str] = lambda: "", what: str = "the function") -> Iterator[None]:
    """Around user code: API errors get ``label`` and ``where()`` (the key); any other is a UserFunctionError naming them."""
    try:
        yield
    except (PipelineDefinitionError, UserFunctionError) as exc:
        raise type(exc)(f"{label}{where()}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's function failed: the epoch fails, naming it
        raise UserFunctionError(f"{label}: {what} raised {type(exc).__name__}: {exc}{where()}") from exc


def check_numeric_columns(what: str, aggregations: Sequence[Any], schema: pa.Schema) -> None:
    """Refuse an aggregation of a column ``schema`` lacks or holds as other than an integer, float or decimal."""
    for agg in aggregations:
        column = agg.value_column
        type_ = schema.field(column).type if column in schema.names else None
        numeric = type_ is not None and (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_))
        if column is not None and not numeric:
            found = "no such column" if type_ is None else type_
            raise PipelineDefinitionError(f"{what}: {type(agg).__name__}({column!r}) needs a numeric column (found: {found})")


def held_state_table(spec: StateSpec, rows: list[dict[str, Any]], epoch: int, updated_at_ms: int, misfit: str = "") -> pa.Table:
    """Changelog ``rows`` of a state held whole (key group 0) as written by ``epoch``; ``misfit`` names a value not fitting."""
    element = f"an element does not fit its declared type {spec.value_fields[0].type}"
    misfit = misfit or f"operator state {spec.name!r} of {spec.operator_id!r}: {element}"
    written = {KEY_GROUP: 0, UPDATED_AT: updated_at_ms, EPOCH: epoch}
    try:
        return pa.Table.from_pylist([{**row, **written} for row in rows], schema=spec.arrow_schema())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise UserFunctionError(f"{misfit}: {exc}") from None


def check_held_state_size(operator_id: str, state: str, elements: int) -> None:
    """Refuse a state held whole by one task (operator list state, broadcast state) grown past its ceiling."""
    if elements > MAX_HELD_STATE_ELEMENTS:
        raise UserFunctionError(
            f"operator {operator_id!r}: its state {state!r} would hold {elements} elements; operator and broadcast "
            f"state are held whole by every task that reads them, up to {MAX_HELD_STATE_ELEMENTS} elements. "
            "Keep large state keyed (key_by(...).process(...)): it is read per key group"
        )


def ship_user_code(obj: Any) -> None:
    """Pickle the module defining ``obj`` (a user function or class) by value: workers need not have it on their path."""
    from pyspark import cloudpickle

    name = getattr(obj, "__module__", None) or type(obj).__module__
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or module.__name__ == "__main__" or module.__name__.split(".")[0] == "barrierflow":
        return
    path = getattr(module, "__file__", None)
    if path is not None and not path.startswith(_INSTALLED):  # the standard library and installed packages are on workers'
        cloudpickle.register_pickle_by_value(module)


FOLD_COLUMNS = 32  # windows this short fold column by column; longer ones alone


def folded_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each window's left fold ``((0.0 + v1) + v2) + ...`` in IEEE doubles (``aggregate(values, 0.0, (a, x) -> a + x)``). Windows
    of up to :data:`FOLD_COLUMNS` values add their j-th value all at once, column by column; a longer window folds alone
    (``cumsum`` adds in order, never pairwise)."""
    counts = np.diff(offsets)
    sums = np.zeros(len(counts))
    starts = offsets[:-1]
    short = np.flatnonzero(counts <= FOLD_COLUMNS)
    short = short[np.argsort(-counts[short], kind="stable")]  # longest first: those with a j-th value are a prefix
    lengths = counts[short]
    for j in range(int(lengths[0]) if len(short) else 0):
        active = short[: int(np.count_nonzero(lengths > j))]
        sums[active] = sums[active] + values[starts[active] + j]
    for w in np.flatnonzero(counts > FOLD_COLUMNS):
        sums[w] = np.cumsum(np.concatenate([[0.0], values[starts[w] : offsets[w + 1]]]))[-1]
    return sums
