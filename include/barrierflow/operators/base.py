"""Common shape of every operator node; the state it declares is a :class:`~barrierflow.state.spec.StateSpec`."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from barrierflow.execution.spark import session_cached
from barrierflow.state.spec import StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "Node", "user_columns", "key_group_column", "position_columns", "position_order", "ship_user_code",
    "MAX_DRIVER_STATE_ELEMENTS", "check_driver_state_size",
]  # fmt: skip

# The ceiling of a state held whole on the driver and shipped with the function
# (operator list state, broadcast state), as Flink keeps them on each task's heap.
MAX_DRIVER_STATE_ELEMENTS = 1_000_000

# A flat_map's outputs carry their input's position plus their index among
# that input's outputs (``_seq_1``, then ``_seq_2`` for a flat_map of a
# flat_map's output): together a unique position, derived from the records alone.
_SUB_POSITION = re.compile(r"^_seq_([0-9]+)$")


def check_driver_state_size(operator_id: str, state: str, elements: int) -> None:
    """Refuse a driver-resident state grown past :data:`MAX_DRIVER_STATE_ELEMENTS` (before it is staged)."""
    if elements > MAX_DRIVER_STATE_ELEMENTS:
        from barrierflow.core.errors import UserFunctionError

        raise UserFunctionError(
            f"operator {operator_id!r}: its state {state!r} would hold {elements} elements; operator and broadcast "
            f"state are held whole on the driver and shipped to every task, up to {MAX_DRIVER_STATE_ELEMENTS} "
            "elements. Keep large state keyed (key_by(...).process(...)): it stays in Delta, read per key group"
        )


@dataclass
class Node:
    """One operator of the pipeline graph, identified by a stable operator id."""

    operator_id: str
    parent: "Node | None"

    # Whether the operator reads the ``_seq`` arrival position of its input
    # records; a source whose consumers all do without it may skip numbering lines.
    needs_arrival_order = True
    # Whether ``apply`` also takes a ``pyarrow.Table``: an operator whose
    # result is already on the driver returns it as Arrow, and only
    # consumers without this flag get it as a Spark frame.
    accepts_arrow = False
    # Whether the operator passes arrival order on without using it (stateless
    # operators): then whether its input needs ``_seq`` is up to its consumers.
    forwards_arrival_order = False
    # Whether the operator reads the watermark (windows, joins, timers): then
    # it must be downstream of every watermark assigner when there are several.
    uses_watermark = False

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame | pa.Table":
        raise NotImplementedError

    # -- the chained form (barrierflow.execution.chained_region): a small epoch's front in one Python task

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        """Its output's schema given its inputs', if it has a chained form for them; None (the default): it runs on Spark."""
        return None

    def chained_state_specs(self, inputs: Sequence[pa.Schema]) -> list["StateSpec"]:
        """The state tables its chained form reads and stages, typed by its inputs' schemas."""
        return self.state_specs()

    def chained_side_outputs(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        """The append tables its chained form emits (``task.emit``), by name: the rows' schema, without ``_epoch``."""
        return {}

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """What :meth:`apply_inputs` computes, on Arrow tables in one task (``task``: a ``chained_region.RegionTask``)."""
        raise NotImplementedError

    def inputs(self) -> tuple["Node", ...]:
        """The nodes whose output this one consumes, in order: its parent; more for a multi-input operator."""
        return () if self.parent is None else (self.parent,)

    def keyed_inputs(self) -> list[tuple["Node", tuple[str, ...]]]:
        """Each input with the key columns the operator takes from its records (none for an operator without a key)."""
        key = tuple(getattr(self, "key", ()))
        return [(node, key) for node in self.inputs()] if key else []

    def apply_inputs(self, ctx: Any, frames: Sequence[Any]) -> "DataFrame | pa.Table":
        """Compute the epoch's output from the output of each of :meth:`inputs`, in that order."""
        (df,) = frames
        return self.apply(ctx, df)

    def state_specs(self) -> list["StateSpec"]:
        return []

    def side_outputs(self) -> list[str]:
        return []

    def unique_by(self) -> tuple[str, ...] | None:
        """Columns of which the operator's output holds at most one row per value in an epoch (None: no such promise)."""
        return None

    def passes_through(self, column: str) -> bool:
        """Whether ``column`` of its output is that of its input record, unchanged (a key checked at the source)."""
        return False

    def key_output(self) -> tuple[str, ...]:
        """Columns of its output holding its own keys, which were checked before it (never null nor empty)."""
        return ()

    def describe(self) -> dict[str, Any]:
        return {"operator_id": self.operator_id, "type": type(self).__name__}


def user_columns(df: "DataFrame") -> list[str]:
    """Columns that belong to the records (not the engine's ``_`` columns)."""
    return [c for c in df.columns if not c.startswith("_")]


def key_group_column(key: tuple[str, ...], key_groups: int) -> "Column":
    """Key group of a key: a fixed hash modulo the max parallelism (native Spark)."""
    from pyspark.sql import functions as F

    def build() -> "Column":
        return F.pmod(F.xxhash64(*[F.col(k) for k in key]), F.lit(key_groups)).cast("int")

    return session_cached(("key_group", tuple(key), key_groups), build)


def position_columns(columns: Sequence[str]) -> list[str]:
    """The arrival-position columns among ``columns``, most significant first: ``_seq``, ``_seq_1``, ..."""
    subs = sorted((int(m.group(1)), c) for c in columns if (m := _SUB_POSITION.match(c)))
    return ["_seq", *[c for _, c in subs]]


def position_order(columns: Sequence[str]) -> list["Column"]:
    from pyspark.sql import functions as F

    return [F.col(c) for c in position_columns(columns)]


def ship_user_code(obj: Any) -> None:
    """Pickle the module defining ``obj`` (a user function or class) by value, so workers need not import it.

    A function defined in an application module (or a test) is not
    necessarily on the workers' path; shipping its module with the task makes
    local and cluster runs behave the same.
    """
    from pyspark import cloudpickle

    name = getattr(obj, "__module__", None) or type(obj).__module__
    module = sys.modules.get(name)
    if module is not None and module.__name__ != "__main__" and not module.__name__.startswith("barrierflow."):
        cloudpickle.register_pickle_by_value(module)
