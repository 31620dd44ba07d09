"""barrierflow.operators.stateless on the executors' side: one Arrow batch through a user function, without Spark."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from barrierflow.core.errors import UserFunctionError
from barrierflow.operators.base import position_columns
from barrierflow.operators.stateless import conform, filter_batch, flat_map_batch, map_batch

BATCH = pa.record_batch(
    {"text": ["a b", "", None, "c"], "n": [1, 2, 3, 4], "_seq": pa.array([40, 10, 30, 20], pa.int64()), "_file": ["f"] * 4}
)
USERS, ENGINE = ["text", "n"], ["_seq", "_file"]
WORDS = pa.schema([("word", pa.string()), ("n", pa.int64())])


def _words(batch: pa.RecordBatch) -> list[list[dict[str, Any]]]:
    assert batch.schema.names == USERS  # the function never sees engine columns
    return [[{"word": w, "n": n} for w in (t or "").split()] for t, n in zip(batch["text"].to_pylist(), batch["n"].to_pylist())]


def test_flat_map_rows_carry_their_record_s_engine_columns_and_index() -> None:
    out = flat_map_batch(BATCH, function=_words, schema=WORDS, users=USERS, engine=ENGINE, position="_seq_1", label="fm")
    assert out.schema.names == ["word", "n", "_seq", "_file", "_seq_1"]
    assert out.to_pylist() == [
        {"word": "a", "n": 1, "_seq": 40, "_file": "f", "_seq_1": 0},
        {"word": "b", "n": 1, "_seq": 40, "_file": "f", "_seq_1": 1},
        {"word": "c", "n": 4, "_seq": 20, "_file": "f", "_seq_1": 0},
    ]


def test_flat_map_positions_do_not_depend_on_how_records_are_batched() -> None:
    """Positions (``_seq``, ``_seq_1``) are unique and the same whatever batches Spark cuts."""
    rng = random.Random(7)
    n = 200
    records = pa.table(
        {"text": [" ".join("x" * rng.randrange(4)) for _ in range(n)], "n": list(range(n)), "_seq": pa.array(rng.sample(range(10**6), n), pa.int64())}
    )

    def words(batch: pa.RecordBatch) -> list[list[dict[str, Any]]]:
        return [[{"word": w, "n": i} for w in t.split()] for t, i in zip(batch["text"].to_pylist(), batch["n"].to_pylist())]

    def run(cuts: list[int]) -> set[tuple[int, int, int]]:
        rows: list[dict[str, Any]] = []
        bounds = [0, *cuts, n]
        for lo, hi in zip(bounds, bounds[1:]):
            batch = records.slice(lo, hi - lo).combine_chunks().to_batches()[0]
            out = flat_map_batch(batch, function=words, schema=WORDS, users=USERS, engine=["_seq"], position="_seq_1", label="fm")
            rows += out.to_pylist()
        positions = {(r["_seq"], r["_seq_1"]) for r in rows}
        assert len(positions) == len(rows)  # unique
        return {(r["n"], r["_seq"], r["_seq_1"]) for r in rows}

    assert run([]) == run([1, 50, 51, 199]) == run(sorted(rng.sample(range(1, n), 20)))


def test_flat_map_accepts_arrow_lists_and_refuses_what_is_not_one_list_per_record() -> None:
    lists = pa.array([[{"word": "z", "n": 9}], [], None, []], pa.list_(pa.struct(list(WORDS))))
    out = flat_map_batch(BATCH, function=lambda b: lists, schema=WORDS, users=USERS, engine=[], position=None, label="fm")
    assert out.to_pylist() == [{"word": "z", "n": 9}]
    with pytest.raises(UserFunctionError, match=r"fm returned 1 lists for 4 records; flat_map returns one list of rows"):
        flat_map_batch(BATCH, function=lambda b: [[]], schema=WORDS, users=USERS, engine=[], position=None, label="fm")
    with pytest.raises(UserFunctionError, match="fm returned list that is not one list of rows"):
        flat_map_batch(BATCH, function=lambda b: [1, 2, 3, 4], schema=WORDS, users=USERS, engine=[], position=None, label="fm")
    with pytest.raises(UserFunctionError, match=r"returned an array of int64; flat_map returns one list of rows per record"):
        flat_map_batch(BATCH, function=lambda b: pa.array([1, 2, 3, 4]), schema=WORDS, users=USERS, engine=[], position=None, label="fm")


def test_a_flat_map_row_must_name_exactly_the_declared_columns() -> None:
    """A misspelled key would otherwise be dropped by Arrow and its column read as null."""
    misspelled = lambda b: [[{"wrod": "a", "n": 1}], [], [], []]  # noqa: E731
    with pytest.raises(UserFunctionError, match=r"fm returned a row with columns \['n', 'wrod'\] for record 0 .*missing \['word'\], unexpected \['wrod'\]"):
        flat_map_batch(BATCH, function=misspelled, schema=WORDS, users=USERS, engine=[], position=None, label="fm")
    partial = lambda b: [[], [{"word": "a"}], [], []]  # noqa: E731
    with pytest.raises(UserFunctionError, match=r"for record 1 .*missing \['n'\], unexpected \[\]\); give every column, None for a null"):
        flat_map_batch(BATCH, function=partial, schema=WORDS, users=USERS, engine=[], position=None, label="fm")


def test_map_keeps_each_record_s_engine_columns() -> None:
    def double(batch: pa.RecordBatch) -> dict[str, Any]:
        return {"n2": [v * 2 for v in batch["n"].to_pylist()]}

    schema = pa.schema([("n2", pa.float64())])
    out = map_batch(BATCH, function=double, schema=schema, users=USERS, engine=ENGINE, label="m")
    assert out.schema.names == ["n2", "_seq", "_file"]
    assert out.column("n2").to_pylist() == [2.0, 4.0, 6.0, 8.0] and out.column("_seq").to_pylist() == [40, 10, 30, 20]


@pytest.mark.parametrize(
    "result, match",
    [
        ({"x": [1, 2, 3]}, r"m returned 3 rows for 4 records; map returns exactly one row per record \(flat_map returns any number\)"),
        ({"y": [1, 2, 3, 4]}, r"returned columns \['y'\], not those of its declared schema \['x'\] \(missing \['x'\], unexpected \['y'\]\)"),
        ({"x": ["1", "2", "3", "a"]}, r"column x is string, which does not convert to its declared int64"),
        ({"x": [1, None, 3, 4]}, r"column x is declared not nullable but holds 1 null\(s\)"),
        ({"x": [1, 2], "z": [1]}, "a mapping that is not columns of equal length"),
        ([1, 2, 3, 4], r"returned list; it must return a pyarrow.RecordBatch, a pyarrow.Table or a mapping"),
    ],
)
def test_map_results_are_checked_against_the_declared_schema(result: Any, match: str) -> None:
    schema = pa.schema([pa.field("x", pa.int64(), nullable=False)])
    with pytest.raises(UserFunctionError, match=match):
        map_batch(BATCH, function=lambda b: result, schema=schema, users=USERS, engine=ENGINE, label="m")


def test_conform_reorders_and_widens_losslessly() -> None:
    schema = pa.schema([("a", pa.float64()), ("b", pa.string())])
    arrays = conform(pa.table({"b": ["x", "y"], "a": pa.array([1, 2], pa.int32())}), schema, "m", rows=2)
    assert [a.type for a in arrays] == [pa.float64(), pa.string()] and arrays[0].to_pylist() == [1.0, 2.0]
    with pytest.raises(UserFunctionError, match="does not convert"):
        conform(pa.table({"a": [1.5], "b": ["x"]}), pa.schema([("a", pa.int64()), ("b", pa.string())]), "m")


def test_a_function_that_raises_is_named_in_the_error() -> None:
    def broken(batch: pa.RecordBatch) -> Any:
        raise KeyError("amount")

    with pytest.raises(UserFunctionError, match=r"^m raised KeyError: 'amount'$"):
        map_batch(BATCH, function=broken, schema=WORDS, users=USERS, engine=ENGINE, label="m")


def test_filter_keeps_true_drops_false_and_null() -> None:
    out = filter_batch(BATCH, function=lambda b: [True, False, None, True], users=USERS, label="f")
    assert out.column("n").to_pylist() == [1, 4] and out.column("_seq").to_pylist() == [40, 20]
    with pytest.raises(UserFunctionError, match=r"f returned 2 values of type bool for 4 records"):
        filter_batch(BATCH, function=lambda b: pa.array([True, False]), users=USERS, label="f")
    with pytest.raises(UserFunctionError, match="not one boolean per record"):
        filter_batch(BATCH, function=lambda b: 3, users=USERS, label="f")


def test_position_columns_order_nested_flat_maps_after_the_arrival_position() -> None:
    assert position_columns(["a", "_seq_10", "_seq", "_seq_2", "_seq_x", "_seq_1"]) == ["_seq", "_seq_1", "_seq_2", "_seq_10"]
