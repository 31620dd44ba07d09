"""Schema evolution: what changed between a stored table and the code, and the rows converted (README "Schema evolution
on restore"). :func:`compare_schemas` lists each change, field by field (into structs, list elements and map values):

  1. a field only the code declares is ADDED: restorable when it is nullable (old rows get null) or declares a
     default (:func:`field_with_default`); a non-nullable field without one is INCOMPATIBLE;
  2. a field whose type only widened is WIDENED (an integer to a wider signed integer, a float to a wider float:
     every stored value converts exactly);
  3. a field only the restore point has is REMOVED: a restore refuses to lose its values unless told to drop non-restored state;
  4. any other type change (or any change of a column the caller fixes, such as a key column, whose values place
     rows in key groups) is INCOMPATIBLE.

:func:`evolve` converts stored rows into the code's schema (steps 1-3). :func:`check_sink_schema` checks an epoch's output against
its sink table before the vote: added, nullable left-out, widened (the table's rows are then rewritten in the epoch's commit,
:mod:`barrierflow.connectors.delta_sink`) and narrower columns pass; any other change is refused, naming the columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError, SchemaEvolutionError

__all__ = [
    "state_signature", "ChangeKind", "SchemaChange", "SchemaEvolution", "compare_schemas", "evolve", "field_with_default",
    "check_sink_schema", "widened_columns", "widened_table_schema", "narrower_columns", "fitted_output_schema",
    "DEFAULT_METADATA_KEY",
]  # fmt: skip

DEFAULT_METADATA_KEY = b"barrierflow.default"


class ChangeKind(Enum):
    """What happened to one field between the restore point and the code."""

    ADDED = "added"
    WIDENED = "widened"
    REMOVED = "removed"
    INCOMPATIBLE = "incompatible"


@dataclass(frozen=True)
class SchemaChange:
    path: str  # "count", "stats.max", "readings[].value", "totals{}.sum"
    kind: ChangeKind
    stored: str | None  # the restore point's type (None when added)
    declared: str | None  # the code's type (None when removed)
    detail: str = ""

    def __str__(self) -> str:
        if self.kind is ChangeKind.ADDED:
            return f"{self.path} added ({self.declared}{', ' + self.detail if self.detail else ''})"
        if self.kind is ChangeKind.REMOVED:
            return f"{self.path} removed (was {self.stored})"
        return f"{self.path} {self.kind.value}: {self.stored} -> {self.declared}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class SchemaEvolution:
    changes: tuple[SchemaChange, ...]

    @property
    def unchanged(self) -> bool:
        return not self.changes

    @property
    def restorable(self) -> bool:
        """Every change converts without losing a value (steps 1-2)."""
        return all(c.kind in (ChangeKind.ADDED, ChangeKind.WIDENED) for c in self.changes)

    @property
    def incompatible(self) -> bool:
        return any(c.kind is ChangeKind.INCOMPATIBLE for c in self.changes)

    def describe(self) -> list[str]:
        return [str(c) for c in self.changes]


def field_with_default(name: str, type: pa.DataType, default: Any, nullable: bool = True) -> pa.Field:
    """A field (of state a savepoint restores into) whose rows from before it existed get ``default`` (step 1)."""
    try:
        pa.array([default], type=type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise PipelineDefinitionError(f"field {name}: default {default!r} is not a {type}: {exc}") from exc
    return pa.field(name, type, nullable=nullable, metadata={DEFAULT_METADATA_KEY: json.dumps(default).encode()})


def _default_of(field: pa.Field) -> tuple[bool, Any]:
    meta = field.metadata or {}
    return (True, json.loads(meta[DEFAULT_METADATA_KEY])) if DEFAULT_METADATA_KEY in meta else (False, None)


def _widens(stored: pa.DataType, declared: pa.DataType) -> bool:
    """Step 2: every value of ``stored`` is exactly a value of ``declared``."""
    integers = pa.types.is_integer(stored) and pa.types.is_signed_integer(declared)
    floats = pa.types.is_floating(stored) and pa.types.is_floating(declared)
    return (integers or floats) and declared.bit_width > stored.bit_width


def _same(stored: pa.DataType, declared: pa.DataType) -> bool:
    """Equal up to string/binary/list width (which stores the same values)."""
    return _normal_type(stored) == _normal_type(declared)


def _compare_fields(
    prefix: str, stored: Iterable[pa.Field], declared: Iterable[pa.Field], fixed: frozenset[str]
) -> list[SchemaChange]:
    old = {f.name: f for f in stored}
    new = {f.name: f for f in declared}
    changes: list[SchemaChange] = []
    for name, field in new.items():
        if name in old:
            changes += _compare_types(f"{prefix}{name}", old[name].type, field.type, name in fixed)
            continue
        has_default, default = _default_of(field)  # 1
        if name in fixed:
            kind, detail = ChangeKind.INCOMPATIBLE, "a key column cannot change"
        elif has_default:
            kind, detail = ChangeKind.ADDED, f"default {default!r}"
        elif field.nullable:
            kind, detail = ChangeKind.ADDED, "null in restored rows"
        else:
            kind, detail = ChangeKind.INCOMPATIBLE, "not nullable and no default declared"
        changes.append(SchemaChange(f"{prefix}{name}", kind, None, str(field.type), detail))
    for name, field in old.items():
        if name not in new:  # 3
            kind = ChangeKind.INCOMPATIBLE if name in fixed else ChangeKind.REMOVED
            changes.append(SchemaChange(f"{prefix}{name}", kind, str(field.type), None))
    return changes


def _compare_types(path: str, stored: pa.DataType, declared: pa.DataType, fixed: bool) -> list[SchemaChange]:
    if _same(stored, declared):
        return []
    if fixed:  # 4
        return [SchemaChange(path, ChangeKind.INCOMPATIBLE, str(stored), str(declared), "a key column cannot change")]
    if pa.types.is_struct(stored) and pa.types.is_struct(declared):
        return _compare_fields(f"{path}.", list(stored), list(declared), frozenset())
    if _is_list(stored) and _is_list(declared):
        return _compare_types(f"{path}[]", stored.value_type, declared.value_type, False)
    if pa.types.is_map(stored) and pa.types.is_map(declared) and _same(stored.key_type, declared.key_type):
        return _compare_types(f"{path}{{}}", stored.item_type, declared.item_type, False)
    if _widens(stored, declared):  # 2
        return [SchemaChange(path, ChangeKind.WIDENED, str(stored), str(declared))]
    return [SchemaChange(path, ChangeKind.INCOMPATIBLE, str(stored), str(declared))]  # 4


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def compare_schemas(stored: pa.Schema, declared: pa.Schema, fixed: Iterable[str] = ()) -> SchemaEvolution:
    """Steps 1-4 for a table's columns; ``fixed`` columns (keys) may not change at all."""
    return SchemaEvolution(tuple(_compare_fields("", list(stored), list(declared), frozenset(fixed))))


def evolve(table: pa.Table, declared: pa.Schema) -> pa.Table:
    """Rows of a stored schema as rows of ``declared`` (steps 1-3); only when :func:`compare_schemas` found nothing incompatible."""
    columns = [
        _evolve_array(table.column(f.name), f) if f.name in table.column_names else _filled(f, len(table)) for f in declared
    ]
    return pa.Table.from_arrays(columns, schema=declared)


def _filled(field: pa.Field, length: int) -> pa.Array:
    has_default, default = _default_of(field)
    return pa.array([default if has_default else None] * length, type=field.type)


def _evolve_array(array: pa.Array | pa.ChunkedArray, field: pa.Field) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks else pa.array([], type=array.type)
    target = field.type
    if not _declares_defaults(target):
        return array.cast(target)  # Arrow matches struct fields by name: removed dropped, added null
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target):
        present = {array.type.field(i).name for i in range(array.type.num_fields)}
        children = [
            _evolve_array(array.field(child.name), child) if child.name in present else _filled(child, len(array))
            for child in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    offsets = array.offsets  # a list or map whose elements declare a default: evolve the elements this array's offsets cover
    start = offsets[0].as_py()
    elements = array.values.slice(start, offsets[-1].as_py() - start)
    offsets = pc.subtract(offsets, pa.scalar(start, offsets.type))
    if pa.types.is_map(target):
        items = _evolve_array(elements.field(1), target.item_field)
        return pa.MapArray.from_arrays(offsets, elements.field(0).cast(target.key_type), items, type=target, mask=mask)
    values = _evolve_array(elements, target.value_field)
    cls = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray
    return cls.from_arrays(offsets, values, type=target, mask=mask)


def _declares_defaults(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(_default_of(f)[0] or _declares_defaults(f.type) for f in t)
    if _is_list(t):
        return _declares_defaults(t.value_type)
    if pa.types.is_map(t):
        return _declares_defaults(t.item_type)
    return False


def check_sink_schema(sink: str, table: pa.Schema, output: pa.Schema, rows: int | None = None) -> list[str]:
    """The changes an epoch's ``output`` makes to sink table ``sink``, said for a warning, or SchemaEvolutionError.

    Columns are compared by name. A widened column (step 2, at any depth) has the table's ``rows`` rewritten; a narrower one (code
    rolled back after a widening) is written with the table's type (:func:`fitted_output_schema`).
    """
    accepted, refused = [], []
    widened = set(widened_columns(table, output))
    narrower = set(narrower_columns(table, output))
    for change in compare_schemas(table, output).changes:
        top = _top(change.path)
        if top in narrower:
            text = (
                f"{top} written as {table.field(top).type} (the table's type; this epoch's {output.field(top).type} values fit)"
            )
            if text not in accepted:
                accepted.append(text)
        elif change.stored is None and top == change.path:  # a column added (nullable in the table, whatever the output says)
            nullable = "" if change.kind is ChangeKind.ADDED else ", nullable in the table"
            accepted.append(f"{change.path} added ({change.declared}{nullable}; earlier rows read null)")
        elif change.kind is ChangeKind.REMOVED and top == change.path and table.field(top).nullable:
            accepted.append(f"{change.path} no longer written ({change.stored}; this epoch's rows read null)")
        elif change.kind is ChangeKind.WIDENED and top in widened:
            stored_rows = "every stored row" if rows is None else f"{rows} row{'' if rows == 1 else 's'}"
            accepted.append(f"{change.path} widened from {change.stored} to {change.declared} ({stored_rows} rewritten)")
        else:
            refused.append(str(change))
    if refused:
        raise SchemaEvolutionError(
            f"sink {sink}: the epoch's output does not fit the table's schema: {'; '.join(refused)}. A sink table "
            "takes added columns, (when nullable) left-out ones, widened types (int to long, float to double; its "
            "stored rows are rewritten) and narrower ones (written as the table's type), but no other type change: "
            "cast the column, or write to a new sink table"
        )
    return accepted


def widened_columns(table: pa.Schema, output: pa.Schema) -> tuple[str, ...]:
    """Top-level columns of sink table ``table`` whose type ``output`` only widens (step 2, at any depth): their rows are rewritten."""
    by_column: dict[str, list[SchemaChange]] = {}
    for change in compare_schemas(table, output).changes:
        top = _top(change.path)
        if change.path != top or (change.stored is not None and change.declared is not None):  # not a column added or left out
            by_column.setdefault(top, []).append(change)
    return tuple(name for name, changes in by_column.items() if all(c.kind is ChangeKind.WIDENED for c in changes))


def narrower_columns(table: pa.Schema, output: pa.Schema) -> tuple[str, ...]:
    """Top-level columns whose ``output`` type the table's type only widens (at any depth): written as the table's type."""
    return tuple(
        f.name
        for f in output
        if f.name in table.names
        and not _same(table.field(f.name).type, f.type)
        and all(c.kind is ChangeKind.WIDENED for c in _compare_types(f.name, f.type, table.field(f.name).type, False))
    )


def fitted_output_schema(table: pa.Schema, output: pa.Schema) -> pa.Schema:
    """``output`` with the table's type for each of its :func:`narrower_columns` (the staged files' schema)."""
    narrower = set(narrower_columns(table, output))
    return pa.schema([f.with_type(table.field(f.name).type) if f.name in narrower else f for f in output])


def widened_table_schema(table: pa.Schema, output: pa.Schema) -> pa.Schema:
    """Sink table ``table``'s schema after ``output``'s commit: its columns (widened ones retyped), then new ones, nullable."""
    widened = set(widened_columns(table, output))
    fields = [output.field(f.name).with_nullable(f.nullable) if f.name in widened else f for f in table]
    fields += [f.with_nullable(True) for f in output if f.name not in table.names]
    return pa.schema(fields)


def _top(path: str) -> str:
    """The top-level column of a change's path ("stats.max" -> "stats", "readings[].value" -> "readings")."""
    return path.split(".")[0].split("[")[0].split("{")[0]


def state_signature(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    """Comparable (column, type) pairs; large and small string/binary types count as one."""
    return tuple((f.name, _normal_type(f.type)) for f in schema)


def _normal_type(t: pa.DataType) -> str:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return str(pa.string())
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return str(pa.binary())
    if _is_list(t) or pa.types.is_list_view(t):
        return f"list<{_normal_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {_normal_type(f.type)}" for f in t) + ">"
    if pa.types.is_map(t):
        return f"map<{_normal_type(t.key_type)}, {_normal_type(t.item_type)}>"
    return str(t)
