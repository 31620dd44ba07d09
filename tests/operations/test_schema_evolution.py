"""State schema evolution on restore: the field-by-field comparison, the row conversion, and restores (stub engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import IncompatibleSavepointError, PipelineDefinitionError, SchemaEvolutionError
from barrierflow.core.schema_evolution import (
    ChangeKind,
    check_sink_schema,
    compare_schemas,
    evolve,
    field_with_default,
    fitted_output_schema,
    narrower_columns,
    state_signature,
    widened_columns,
    widened_table_schema,
)
from barrierflow.demo.pipelines.sensor_stats import sensor_stats
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import check_compatibility, restore
from barrierflow.operations.savepoint import create_savepoint
from stub_engine import LINES, stub_compute

STATS = pa.struct([("count", pa.int32()), ("label", pa.string())])
OLD = pa.schema(
    [("k", pa.string()), ("stats", STATS), ("hist", pa.list_(pa.struct([("v", pa.float32())]))), ("gone", pa.int64())]
)
NEW = pa.schema(
    [
        ("k", pa.string()),
        (
            "stats",
            pa.struct([("count", pa.int64()), field_with_default("high", pa.float64(), -1.0), ("label", pa.large_string())]),
        ),
        ("hist", pa.list_(pa.struct([("v", pa.float64()), field_with_default("w", pa.int64(), 1)]))),
        ("totals", pa.map_(pa.string(), pa.float64())),
        field_with_default("n", pa.int32(), 7),
    ]
)


def _kinds(old: pa.Schema, new: pa.Schema, fixed: tuple[str, ...] = ()) -> dict[str, ChangeKind]:
    return {c.path: c.kind for c in compare_schemas(old, new, fixed).changes}


def test_added_widened_and_removed_fields_are_found_inside_structs_and_lists() -> None:
    assert _kinds(OLD, NEW, ("k",)) == {
        "stats.count": ChangeKind.WIDENED,
        "stats.high": ChangeKind.ADDED,  # a default; a large string is a string
        "hist[].v": ChangeKind.WIDENED,
        "hist[].w": ChangeKind.ADDED,
        "totals": ChangeKind.ADDED,  # nullable
        "n": ChangeKind.ADDED,
        "gone": ChangeKind.REMOVED,
    }
    evolution = compare_schemas(OLD, NEW, ("k",))
    assert not evolution.restorable and not evolution.incompatible  # only a removal stands in the way
    assert "stats.high added (double, default -1.0)" in evolution.describe()
    assert "gone removed (was int64)" in evolution.describe()
    assert compare_schemas(NEW, NEW).unchanged


@pytest.mark.parametrize(
    ("stored", "declared", "kind"),
    [
        (pa.int32(), pa.int64(), ChangeKind.WIDENED),
        (pa.int8(), pa.int16(), ChangeKind.WIDENED),
        (pa.uint32(), pa.int64(), ChangeKind.WIDENED),
        (pa.float32(), pa.float64(), ChangeKind.WIDENED),
        (pa.int64(), pa.int32(), ChangeKind.INCOMPATIBLE),  # narrowing loses values
        (pa.uint64(), pa.int64(), ChangeKind.INCOMPATIBLE),
        (pa.int64(), pa.float64(), ChangeKind.INCOMPATIBLE),  # not exact beyond 2**53
        (pa.string(), pa.int64(), ChangeKind.INCOMPATIBLE),
        (pa.map_(pa.string(), pa.int32()), pa.map_(pa.string(), pa.int64()), ChangeKind.WIDENED),
        (pa.map_(pa.string(), pa.int32()), pa.map_(pa.int64(), pa.int32()), ChangeKind.INCOMPATIBLE),
    ],
)
def test_only_exact_widenings_convert(stored: pa.DataType, declared: pa.DataType, kind: ChangeKind) -> None:
    assert set(_kinds(pa.schema([("v", stored)]), pa.schema([("v", declared)])).values()) == {kind}


def test_a_key_column_or_a_required_field_without_default_never_converts() -> None:
    assert _kinds(pa.schema([("k", pa.int32())]), pa.schema([("k", pa.int64())]), ("k",)) == {"k": ChangeKind.INCOMPATIBLE}
    assert _kinds(pa.schema([]), pa.schema([pa.field("v", pa.int64(), nullable=False)])) == {"v": ChangeKind.INCOMPATIBLE}
    assert _kinds(pa.schema([]), pa.schema([field_with_default("v", pa.int64(), 0, nullable=False)])) == {"v": ChangeKind.ADDED}
    with pytest.raises(PipelineDefinitionError, match="default 'zero' is not a int64"):
        field_with_default("v", pa.int64(), "zero")


def test_evolve_converts_every_row_of_a_sliced_table() -> None:
    rows = [
        {"k": "a", "stats": {"count": 1, "label": "x"}, "hist": [{"v": 1.5}], "gone": 1},
        {"k": "b", "stats": None, "hist": None, "gone": 2},
        {"k": "c", "stats": {"count": 3, "label": None}, "hist": [{"v": 2.0}, {"v": 0.25}], "gone": 3},
    ]
    converted = evolve(pa.Table.from_pylist(rows, schema=OLD).slice(1), NEW)
    assert converted.schema == NEW
    assert converted.to_pylist() == [
        {"k": "b", "stats": None, "hist": None, "totals": None, "n": 7},
        {
            "k": "c",
            "stats": {"count": 3, "high": -1.0, "label": None},
            "hist": [{"v": 2.0, "w": 1}, {"v": 0.25, "w": 1}],
            "totals": None,
            "n": 7,
        },
    ]


def _saved(pipe: Any) -> dict[str, Any]:
    return {f"{s.operator_id}/{s.name}": state_signature(s.arrow_schema()) for s in pipe.state_specs()}


def test_the_compatibility_check_restores_evolved_state_and_lists_what_changed(tmp_path: Path) -> None:
    pipe = sensor_stats.build({"landing_dir": str(tmp_path)})
    spec = next(s for s in pipe.state_specs() if s.name == "accumulators")
    name = f"{spec.operator_id}/{spec.name}"
    current = spec.arrow_schema()
    # Written by older code: count was an int32 and the maximum did not exist.
    older = pa.schema([f.with_type(pa.int32()) if f.name == "count" else f for f in current if f.name != "max_temperature"])
    saved = {**_saved(pipe), name: state_signature(older)}
    found = check_compatibility(pipe, pipe.key_groups, saved, False, lambda n: older if n == name else None)
    assert name in found.restored and found.dropped == [] and found.empty == []
    assert found.evolved == {name: ["count widened: int32 -> int64", "max_temperature added (double, null in restored rows)"]}

    # Written by code that had one more field: refused with the field named, unless allowed (then dropped).
    richer = current.append(pa.field("mean", pa.float64()))
    saved[name] = state_signature(richer)
    with pytest.raises(IncompatibleSavepointError, match=r"totals/accumulators \(schema changed: mean removed \(was double\)\)"):
        check_compatibility(pipe, pipe.key_groups, saved, False, lambda n: richer)
    found = check_compatibility(pipe, pipe.key_groups, saved, True, lambda n: richer)
    assert name in found.restored and found.dropped == [f"{name}: mean removed (was double)"]


def _lines(landing: Path, files: range) -> None:
    for f in files:
        (landing / f"part-{f}.txt").write_text("".join(f"file {f} line {i}\n" for i in range(3)))


@pytest.mark.parametrize("change", ["widened", "removed"])
def test_a_savepoint_of_older_code_restores_converted_or_is_refused(tmp_path: Path, change: str) -> None:
    """The savepoint's state as older code wrote it (first_epoch an int32, or with a field since removed)."""
    landing, warehouse = tmp_path / "landing", str(tmp_path / "wh")
    landing.mkdir()
    _lines(landing, range(2))
    params = {"landing_dir": str(landing), "max_files_per_epoch": 1}

    def run(epochs: int) -> None:
        CheckpointCoordinator(LINES, params, warehouse, spark_factory=lambda: None, compute=stub_compute).run(epochs=epochs)

    run(2)
    sp = create_savepoint(LINES, warehouse, name="sp", params=params)
    before = run_query(warehouse, "lines", "select line_id, first_epoch from dedup__seen order by line_id").to_pylist()
    seen = next(i for i, s in enumerate(sp.states) if s.name == "dedup/seen")
    for path in (Path(sp.uri) / f for f in sp.states[seen].files):  # rewritten as the older code wrote them
        table = pq.read_table(path)
        i = table.schema.get_field_index("first_epoch")
        if change == "widened":
            table = table.set_column(i, pa.field("first_epoch", pa.int32()), table.column(i).cast(pa.int32()))
        else:
            table = table.append_column("origin", pa.array(["old"] * len(table)))
        pq.write_table(table, path)
        schema = table.schema
    doc = json.loads((Path(sp.uri) / "_savepoint.json").read_text())
    doc["states"][seen]["schema"] = [list(c) for c in state_signature(schema)]
    (Path(sp.uri) / "_savepoint.json").write_text(json.dumps(doc))

    if change == "removed":
        with pytest.raises(IncompatibleSavepointError, match=r"dedup/seen \(schema changed: origin removed \(was string\)\)"):
            restore(LINES, warehouse, savepoint="sp", rewind_sinks=True, params=params)
        result = restore(LINES, warehouse, savepoint="sp", rewind_sinks=True, allow_non_restored_state=True, params=params)
        assert result.dropped_states == ("dedup/seen: origin removed (was string)",)
    else:
        result = restore(LINES, warehouse, savepoint="sp", rewind_sinks=True, params=params)
        assert result.dropped_states == () and result.empty_states == ()
    assert result.restored_states == ("dedup/seen", "lines/offsets")
    assert list(result.evolved_states) == ["dedup/seen"]
    # The state table holds the savepoint's rows in the code's schema; the pipeline goes on from them.
    assert run_query(warehouse, "lines", "select line_id, first_epoch from dedup__seen order by line_id").to_pylist() == before
    _lines(landing, range(2, 3))
    run(1)
    assert run_query(warehouse, "lines", "select count(*) as n from lines").to_pylist() == [{"n": 9}]


def test_a_sink_takes_new_left_out_nullable_and_widened_columns() -> None:
    table = pa.schema([("user", pa.string()), ("count", pa.int32()), pa.field("_epoch", pa.int64(), nullable=False)])
    output = pa.schema(
        [("user", pa.string()), pa.field("_epoch", pa.int64(), nullable=False), pa.field("flag", pa.bool_(), nullable=False)]
    )
    assert check_sink_schema("counts", table, output) == [
        "flag added (bool, nullable in the table; earlier rows read null)",
        "count no longer written (int32; this epoch's rows read null)",
    ]
    assert widened_columns(table, output) == ()
    widened = table.set(1, pa.field("count", pa.int64())).append(pa.field("total", pa.float64(), nullable=False))
    assert check_sink_schema("counts", table, widened, rows=5) == [
        "count widened from int32 to int64 (5 rows rewritten)",
        "total added (double, nullable in the table; earlier rows read null)",
    ]
    assert widened_columns(table, widened) == ("count",)
    # The table keeps its columns' order and nullability; the new column is nullable.
    assert widened_table_schema(table, widened) == pa.schema(
        [("user", pa.string()), ("count", pa.int64()), pa.field("_epoch", pa.int64(), nullable=False), ("total", pa.float64())]
    )
    with pytest.raises(SchemaEvolutionError, match=r"_epoch removed"):  # a required column cannot be left out
        check_sink_schema("counts", table, table.remove(2))


def test_a_sink_writes_a_narrower_column_as_the_tables_type() -> None:
    """Code rolled back after a widening: its narrower values fit the wider column, nothing is rewritten."""
    table = pa.schema(
        [("user", pa.string()), ("count", pa.int64()), ("stats", pa.struct([("n", pa.int64()), ("max", pa.float64())]))]
    )
    output = pa.schema(
        [("user", pa.string()), ("count", pa.int32()), ("stats", pa.struct([("n", pa.int16()), ("max", pa.float32())]))]
    )
    assert check_sink_schema("counts", table, output) == [
        "count written as int64 (the table's type; this epoch's int32 values fit)",
        "stats written as struct<n: int64, max: double> (the table's type; this epoch's struct<n: int16, max: float> values fit)",
    ]
    assert narrower_columns(table, output) == ("count", "stats") and widened_columns(table, output) == ()
    assert fitted_output_schema(table, output) == table
    mixed = output.set(2, pa.field("stats", pa.struct([("n", pa.int16()), ("max", pa.float64()), ("min", pa.float64())])))
    assert narrower_columns(table, mixed) == ("count",)  # stats gains a field too: no longer only narrower
    with pytest.raises(SchemaEvolutionError, match=r"stats\.min added"):
        check_sink_schema("counts", table, mixed)


@pytest.mark.parametrize(
    ("stored", "declared", "message"),
    [
        (pa.string(), pa.int64(), r"count incompatible: string -> int64"),
        (pa.int32(), pa.uint32(), r"count incompatible: int32 -> uint32"),  # neither holds the other's values
        (pa.int64(), pa.float64(), r"count incompatible: int64 -> double"),  # not exact
    ],
)
def test_a_sink_refuses_any_other_type_change_naming_the_column(stored: pa.DataType, declared: pa.DataType, message: str) -> None:
    table = pa.schema([("user", pa.string()), ("count", stored)])
    with pytest.raises(SchemaEvolutionError, match=r"sink counts: .*" + message) as refused:
        check_sink_schema("counts", table, table.set(1, pa.field("count", declared)))
    assert "not even a widening" not in str(refused.value) and "widened types" in str(refused.value)


def test_a_sink_widens_inside_a_column_but_takes_no_other_nested_change() -> None:
    stats = pa.struct([("n", pa.int32()), ("max", pa.float32())])
    table = pa.schema([("user", pa.string()), ("stats", stats), ("readings", pa.list_(pa.int16()))])
    output = pa.schema(
        [
            ("user", pa.string()),
            ("stats", pa.struct([("n", pa.int64()), ("max", pa.float64())])),
            ("readings", pa.list_(pa.int32())),
        ]
    )
    assert check_sink_schema("s", table, output) == [
        "stats.n widened from int32 to int64 (every stored row rewritten)",
        "stats.max widened from float to double (every stored row rewritten)",
        "readings[] widened from int16 to int32 (every stored row rewritten)",
    ]
    assert widened_columns(table, output) == ("stats", "readings")
    assert widened_table_schema(table, output) == output
    added = output.set(1, pa.field("stats", pa.struct([("n", pa.int64()), ("max", pa.float64()), ("min", pa.float64())])))
    with pytest.raises(SchemaEvolutionError, match=r"stats\.min added"):
        check_sink_schema("s", table, added)
    assert widened_columns(table, added) == ("readings",)  # stats changes otherwise too
