"""What every operator is: a node of the pipeline graph whose semantics are one kernel over Arrow data.

An operator declares, from its inputs' schemas alone (when the pipeline is
planned, before any record is read): its output's schema
(:meth:`Node.output_schema`), the state tables it keeps
(:meth:`Node.state_specs`), the append tables it writes beside its output
(:meth:`Node.side_outputs`), and how each input reaches it
(:meth:`Node.exchanges`): in the task that produced it (``FORWARD``), by
the key group of its key (``KEYED``), all in one task (``GLOBAL``), or to
every task (``BROADCAST``). The planner cuts the pipeline into chains at
those exchanges, as Flink chains operators between ``keyBy``s.

Its kernel, :meth:`Node.run`, computes one epoch's output from its inputs'
rows as Arrow tables, reading and staging state through the
:class:`~barrierflow.state.table.StateTable` the :class:`Task` hands it.
The same kernel runs wherever the planner places it: a small epoch's whole
pipeline in one task, or a large epoch's chains in parallel tasks, each
holding some key groups. A kernel therefore never assumes it sees every
key group; it sees every record of the keys it is given.
"""

from __future__ import annotations

import enum
import sys
import sysconfig
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import pyarrow as pa

from barrierflow.core.columns import KEY_GROUP, position_columns, user_columns
from barrierflow.core.errors import UserFunctionError
from barrierflow.core.keys import key_groups
from barrierflow.core.settings import MAX_HELD_STATE_ELEMENTS
from barrierflow.state.spec import StateSpec

if TYPE_CHECKING:
    from barrierflow.state.table import StateTable

__all__ = [
    "Node", "Exchange", "Task", "with_key_group", "check_held_state_size", "ship_user_code",
    "user_columns", "position_columns",
]  # fmt: skip


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

    @property
    def watermark_prev_us(self) -> int | None:
        """W(n-1), the watermark at the epoch's start."""
        ...

    @property
    def watermark_us(self) -> int | None:
        """W(n): final by the time an event-time operator runs."""
        ...

    def state(self, spec: StateSpec) -> "StateTable":
        """One of the operator's state tables (declared by :meth:`Node.state_specs`)."""
        ...

    def emit(self, table: str, rows: pa.Table) -> None:
        """Rows of an append table (a side output, an append sink); ``_epoch`` is added when they are staged."""
        ...

    def upsert(self, table: str, rows: pa.Table, key: Sequence[str]) -> None:
        """An upsert sink's rows (``_epoch`` included), one per key: they replace the stored rows of their keys."""
        ...

    def observe_event_time(self, assigner_id: str, max_us: int | None, out_of_orderness_us: int) -> None:
        """A watermark assigner's largest event time among the task's records (None: it saw none)."""
        ...

    def count(self, what: str, n: int) -> None:
        """Add ``n`` to the epoch's counter ``what``, a message holding ``{n}`` (``"... dropped {n} late record(s)"``) the driver logs."""
        ...


@dataclass
class Node:
    """One operator of the pipeline graph, identified by a stable operator id."""

    operator_id: str
    parent: "Node | None"

    # Whether the operator reads its input's arrival positions (``_seq``...): an
    # order-sensitive one (deduplication, process functions) needs them in its input.
    needs_arrival_order = True
    # Whether it passes arrival positions on without using them (stateless operators,
    # unions): then whether its input needs them is up to its consumers.
    forwards_arrival_order = False
    # Whether the operator reads the watermark (windows, joins, timers): it
    # must be downstream of every watermark assigner when there are several.
    uses_watermark = False

    # -- the graph ---------------------------------------------------------

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
        keyed = self.keyed_inputs()
        if not keyed:
            return tuple(() for _ in self.inputs())
        return tuple(key for _, key in keyed)

    def passes_through(self, column: str) -> bool:
        """Whether ``column`` of its output is that of its input record, unchanged (a key checked at the source)."""
        return False

    def key_output(self) -> tuple[str, ...]:
        """Columns of its output holding its own keys, which were checked before it (never null nor empty)."""
        return ()

    def unique_by(self) -> tuple[str, ...] | None:
        """Columns of which the operator's output holds at most one row per value in an epoch (None: no such promise)."""
        return None

    # -- what it declares from its inputs' schemas -------------------------

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

    # -- the kernel --------------------------------------------------------

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """One epoch's output from each input's rows (in :meth:`inputs` order), as ``output_schema`` says."""
        raise NotImplementedError(type(self).__name__)

    def describe(self) -> dict[str, Any]:
        return {"operator_id": self.operator_id, "type": type(self).__name__}


def with_key_group(rows: pa.Table, key: Sequence[str], groups: int) -> pa.Table:
    """``rows`` with :data:`KEY_GROUP` of ``key`` appended (kept if a keyed exchange already added it)."""
    if KEY_GROUP in rows.column_names:
        return rows
    return rows.append_column(KEY_GROUP, key_groups(rows.select(list(key)), groups))


def check_held_state_size(operator_id: str, state: str, elements: int) -> None:
    """Refuse a state held whole by one task (operator list state, broadcast state) grown past its ceiling."""
    if elements > MAX_HELD_STATE_ELEMENTS:
        raise UserFunctionError(
            f"operator {operator_id!r}: its state {state!r} would hold {elements} elements; operator and broadcast "
            f"state are held whole by every task that reads them, up to {MAX_HELD_STATE_ELEMENTS} elements. "
            "Keep large state keyed (key_by(...).process(...)): it is read per key group"
        )


def ship_user_code(obj: Any) -> None:
    """Pickle the module defining ``obj`` (a user function or class) by value, so workers need not import it.

    A function defined in an application module (or a test) is not
    necessarily on the workers' path; shipping its module with the task makes
    local and cluster runs behave the same.
    """
    from pyspark import cloudpickle

    name = getattr(obj, "__module__", None) or type(obj).__module__
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or module.__name__ == "__main__" or module.__name__.split(".")[0] == "barrierflow":
        return
    path = getattr(module, "__file__", None)
    if path is None or any(path.startswith(p) for p in _INSTALLED):
        return  # the standard library and installed packages are on every worker's path
    cloudpickle.register_pickle_by_value(module)


_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
