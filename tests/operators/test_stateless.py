"""The stateless kernels (filter, select, map, flat_map), and one Arrow batch through a user function."""

from __future__ import annotations

import random
import re
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators import stateless
from barrierflow.operators.base import Node, position_columns
from barrierflow.operators.stateless import (
    Filter,
    FlatMapColumn,
    FlatMapFunction,
    MapColumns,
    MapFunction,
    Select,
    conform,
    filter_batch,
    flat_map_batch,
    map_batch,
)
from harness import KernelRun, run_both, run_kernel, upstream

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
        {
            "text": [" ".join("x" * rng.randrange(4)) for _ in range(n)],
            "n": list(range(n)),
            "_seq": pa.array(rng.sample(range(10**6), n), pa.int64()),
        }
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
        flat_map_batch(
            BATCH, function=lambda b: pa.array([1, 2, 3, 4]), schema=WORDS, users=USERS, engine=[], position=None, label="fm"
        )


def test_a_flat_map_row_must_name_exactly_the_declared_columns() -> None:
    """A misspelled key would otherwise be dropped by Arrow and its column read as null."""
    misspelled = lambda b: [[{"wrod": "a", "n": 1}], [], [], []]  # noqa: E731
    with pytest.raises(
        UserFunctionError,
        match=r"fm returned a row with columns \['n', 'wrod'\] for record 0 .*missing \['word'\], unexpected \['wrod'\]",
    ):
        flat_map_batch(BATCH, function=misspelled, schema=WORDS, users=USERS, engine=[], position=None, label="fm")
    partial = lambda b: [[], [{"word": "a"}], [], []]  # noqa: E731
    with pytest.raises(
        UserFunctionError, match=r"for record 1 .*missing \['n'\], unexpected \[\]\); give every column, None for a null"
    ):
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
        (
            {"x": [1, 2, 3]},
            r"m returned 3 rows for 4 records; map returns exactly one row per record \(flat_map returns any number\)",
        ),
        (
            {"y": [1, 2, 3, 4]},
            r"returned columns \['y'\], not those of its declared schema \['x'\] \(missing \['x'\], unexpected \['y'\]\)",
        ),
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


# -- the kernels ------------------------------------------------------------------------------------

EVENTS = pa.schema(
    [("user", pa.string()), ("text", pa.string()), pa.field("amount", pa.float64(), nullable=False), ("_seq", pa.int64())]
)


def _events(rows: list[tuple[str, str | None, float]]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"user": u, "text": t, "amount": a, "_seq": 100 + i} for i, (u, t, a) in enumerate(rows)], schema=EVENTS
    )


def _run(node: Node, records: pa.Table) -> KernelRun:
    """The kernel in one task and split across tasks (which must agree); its output in the schema it declares."""
    run = run_both(node, [records])
    assert run.output.schema == node.output_schema([records.schema])
    assert not run.changes and not run.emitted
    return run


EVENT_ROWS = _events([("u1", "a b", 1.0), ("u2", None, -2.0), ("u3", "", 0.0), ("u4", "c", 3.5)])


def test_filter_keeps_the_records_whose_condition_is_true_null_and_false_drop() -> None:
    node = Filter(operator_id="filter-1", parent=upstream(), condition="amount >= 0 and length(text) > 0")
    run = _run(node, EVENT_ROWS)
    # u2: null AND false is false; u3: length 0.
    assert run.output.to_pylist() == [
        {"user": "u1", "text": "a b", "amount": 1.0, "_seq": 100}, {"user": "u4", "text": "c", "amount": 3.5, "_seq": 103},
    ]  # fmt: skip
    unknown = _run(Filter(operator_id="filter-1", parent=upstream(), condition="length(text) > 0"), EVENT_ROWS)
    assert unknown.output["user"].to_pylist() == ["u1", "u4"]  # null (u2's text) drops the record
    assert _run(Filter(operator_id="f", parent=upstream(), condition="null"), EVENT_ROWS).output.num_rows == 0
    assert node.passes_through("user") and node.passes_through("amount")


def test_a_filter_condition_must_be_a_boolean() -> None:
    node = Filter(operator_id="filter-1", parent=upstream(), condition="amount * 2")
    with pytest.raises(PipelineDefinitionError, match=r"filter-1: the filter condition 'amount \* 2' is a double, not a boolean"):
        node.output_schema([EVENTS])


def test_filter_with_a_function_is_called_per_batch_of_the_user_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stateless, "BATCH_ROWS", 3)
    records = _events([(f"u{i}", "x" * (i % 3), float(i)) for i in range(8)])
    calls: list[tuple[int, list[str]]] = []

    def nonempty(batch: pa.RecordBatch) -> pa.Array:
        calls.append((batch.num_rows, batch.schema.names))
        return pc.greater(pc.utf8_length(batch["text"]), 0)

    out = run_kernel(Filter(operator_id="filter-2", parent=upstream(), function=nonempty), [records]).output
    assert out["user"].to_pylist() == ["u1", "u2", "u4", "u5", "u7"] and out.schema == EVENTS
    assert calls == [(3, ["user", "text", "amount"]), (3, ["user", "text", "amount"]), (2, ["user", "text", "amount"])]
    empty = run_kernel(Filter(operator_id="filter-2", parent=upstream(), function=nonempty), [EVENTS.empty_table()])
    assert empty.output.schema == EVENTS and empty.output.num_rows == 0 and len(calls) == 3  # no call without records


def test_select_projects_and_keeps_the_engine_columns() -> None:
    node = Select(
        operator_id="select-1", parent=upstream(), columns=("amount * 100 AS cents", "USER", "text as words", "'web' AS channel")
    )
    run = _run(node, EVENT_ROWS)
    assert run.output.schema == pa.schema(
        [("cents", pa.float64()), ("user", pa.string()), ("words", pa.string()), ("channel", pa.string()), ("_seq", pa.int64())]
    )
    assert run.output.to_pylist()[1] == {"cents": -200.0, "user": "u2", "words": None, "channel": "web", "_seq": 101}
    star = Select(operator_id="select-2", parent=upstream(), columns=("*", "amount > 0 AS positive"))
    out = _run(star, EVENT_ROWS).output
    assert out.column_names == ["user", "text", "amount", "positive", "_seq"] and out["positive"].to_pylist() == [
        True,
        False,
        False,
        True,
    ]
    assert out.schema.field("amount").nullable is False  # a column passes through as it is
    assert star.passes_through("user") and not star.passes_through("positive")
    assert node.passes_through("user") is False  # "USER" names the column user, spelt otherwise: not promised
    renamed = Select(operator_id="s", parent=upstream(), columns=("text AS user", "user AS text"))
    assert not renamed.passes_through("user") and not renamed.passes_through("text")
    assert Select(operator_id="s", parent=upstream(), columns=("user", "amount")).passes_through("user")


@pytest.mark.parametrize(
    "columns, match",
    [
        (("upper(user)",), r"s: select 'upper\(user\)' needs a name for its output column: write \"upper\(user\) AS name\""),
        (("user", "text AS user"), r"output columns \['user', 'user'\] are not allowed: \['user'\] appear more than once"),
        (("amount AS _cents",), r"\['_cents'\] start with _ \(the engine columns, which every record keeps anyway\)"),
    ],
)
def test_select_refuses_unnamed_duplicate_and_engine_columns_when_declared(columns: tuple[str, ...], match: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=match):
        Select(operator_id="s", parent=upstream(), columns=columns)


def test_select_refuses_a_star_that_repeats_a_column_when_planned() -> None:
    node = Select(operator_id="s", parent=upstream(), columns=("*", "amount"))
    with pytest.raises(PipelineDefinitionError, match=r"\['amount'\] appear more than once"):
        node.output_schema([EVENTS])


def test_map_columns_adds_and_replaces_each_from_the_input_record() -> None:
    node = MapColumns(
        operator_id="map-1", parent=upstream(),
        columns={"cents": "cast(round(amount * 100) as long)", "text": "upper(user)", "user": "text", "n": "length(text)"},
    )  # fmt: skip
    run = _run(node, EVENT_ROWS)
    assert run.output.schema == pa.schema(
        [("user", pa.string()), ("text", pa.string()), pa.field("amount", pa.float64(), nullable=False),
         ("cents", pa.int64()), ("n", pa.int32()), ("_seq", pa.int64())]
    )  # fmt: skip
    assert run.output.to_pylist() == [
        {"user": "a b", "text": "U1", "amount": 1.0, "cents": 100, "n": 3, "_seq": 100},
        {"user": None, "text": "U2", "amount": -2.0, "cents": -200, "n": None, "_seq": 101},
        {"user": "", "text": "U3", "amount": 0.0, "cents": 0, "n": 0, "_seq": 102},
        {"user": "c", "text": "U4", "amount": 3.5, "cents": 350, "n": 1, "_seq": 103},
    ]
    assert node.passes_through("amount") and not node.passes_through("text") and not node.passes_through("USER")


def test_an_expression_failing_at_run_time_fails_the_epoch_naming_the_operator() -> None:
    node = MapColumns(operator_id="map-3", parent=upstream(), columns={"ratio": "100 div cast(amount as int)"})
    with pytest.raises(UserFunctionError, match=r"^map-3: expression '100 div cast\(amount as int\)' failed: .*division by zero"):
        run_kernel(node, [EVENT_ROWS])
    guarded = MapColumns(
        operator_id="map-3", parent=upstream(), columns={"ratio": "if(amount = 0, null, 100 div cast(amount as int))"}
    )
    assert run_kernel(guarded, [EVENT_ROWS]).output["ratio"].to_pylist() == [100, -50, None, 33]


def test_map_function_replaces_the_user_columns_and_names_the_operator_when_it_fails() -> None:
    schema = pa.schema([pa.field("user", pa.string(), nullable=False), ("double", pa.float64())])

    def double(batch: pa.RecordBatch) -> dict[str, Any]:
        return {"double": pc.multiply(batch["amount"], 2), "user": batch["user"]}

    node = MapFunction(operator_id="map-1", parent=upstream(), function=double, schema=schema)
    run = _run(node, EVENT_ROWS)
    assert run.output.schema == pa.schema([*schema, ("_seq", pa.int64())])
    assert run.output.to_pylist()[3] == {"user": "u4", "double": 7.0, "_seq": 103}

    for function, message in (
        (_too_few, r"MapFunction map-1 \(_too_few\) returned 3 rows for 4 records; map returns exactly one row per record"),
        (
            _wrong_type,
            r"MapFunction map-1 \(_wrong_type\): column double is string, which does not convert to its declared double",
        ),
    ):
        with pytest.raises(UserFunctionError, match=message):
            run_kernel(MapFunction(operator_id="map-1", parent=upstream(), function=function, schema=schema), [EVENT_ROWS])


def _too_few(batch: pa.RecordBatch) -> Any:
    return {"user": batch["user"][:-1], "double": batch["amount"][:-1]}


def _wrong_type(batch: pa.RecordBatch) -> Any:
    return {"user": batch["amount"], "double": batch["user"]}


def test_flat_map_column_explodes_arrays_keeping_positions() -> None:
    node = FlatMapColumn(operator_id="flat_map-1", parent=upstream(), name="word", expression="split(text, ' ')")
    records = _events([("u1", "a b", 1.0), ("u2", None, 2.0), ("u3", "", 3.0), ("u4", "c d e", 4.0)])
    run = _run(node, records)
    assert run.output.schema == pa.schema(
        [("user", pa.string()), ("text", pa.string()), pa.field("amount", pa.float64(), nullable=False), ("word", pa.string()),
         ("_seq", pa.int64()), pa.field("_seq_1", pa.int64(), nullable=False)]
    )  # fmt: skip
    rows = [(r["user"], r["word"], r["_seq"], r["_seq_1"]) for r in run.output.to_pylist()]
    # A null array gives nothing; split('') is [''] (one empty word), as Spark's.
    assert rows == [
        ("u1", "a", 100, 0),
        ("u1", "b", 100, 1),
        ("u3", "", 102, 0),
        ("u4", "c", 103, 0),
        ("u4", "d", 103, 1),
        ("u4", "e", 103, 2),
    ]
    again = FlatMapColumn(
        operator_id="flat_map-2", parent=upstream(), name="letter", expression="split(concat(word, '.'), '[.]')"
    )
    nested = _run(again, run.output).output
    assert nested.column_names == ["user", "text", "amount", "word", "letter", "_seq", "_seq_1", "_seq_2"]
    assert [(r["letter"], r["_seq_1"], r["_seq_2"]) for r in nested.to_pylist()][:3] == [("a", 0, 0), ("", 0, 1), ("b", 1, 0)]
    assert node.passes_through("user") and not node.passes_through("word")


def test_flat_map_column_replaces_a_column_of_its_name_and_adds_no_position_without_one() -> None:
    unordered = EVENT_ROWS.drop_columns(["_seq"])
    node = FlatMapColumn(operator_id="flat_map-1", parent=upstream(), name="text", expression="split(text, ' ')")
    run = _run(node, unordered)
    assert run.output.column_names == ["user", "amount", "text"]
    assert run.output["text"].to_pylist() == ["a", "b", "", "c"]
    empty = FlatMapColumn(operator_id="flat_map-1", parent=upstream(), name="x", expression="null")
    assert _run(empty, EVENT_ROWS).output.num_rows == 0
    with pytest.raises(PipelineDefinitionError, match=r"flat_map-1: flat_map's w='upper\(text\)' is a string, not an array"):
        FlatMapColumn(operator_id="flat_map-1", parent=upstream(), name="w", expression="upper(text)").output_schema([EVENTS])


def test_flat_map_function_rows_keep_their_record_s_position() -> None:
    schema = pa.schema([("user", pa.string()), ("word", pa.string())])
    node = FlatMapFunction(operator_id="flat_map-1", parent=upstream(), function=_user_words, schema=schema)
    run = _run(node, EVENT_ROWS)
    assert run.output.schema == pa.schema([*schema, ("_seq", pa.int64()), pa.field("_seq_1", pa.int64(), nullable=False)])
    assert run.output.to_pylist() == [
        {"user": "u1", "word": "a", "_seq": 100, "_seq_1": 0}, {"user": "u1", "word": "b", "_seq": 100, "_seq_1": 1},
        {"user": "u4", "word": "c", "_seq": 103, "_seq_1": 0},
    ]  # fmt: skip
    assert run_kernel(node, [EVENTS.empty_table()]).output.schema == run.output.schema


def _user_words(batch: pa.RecordBatch) -> list[list[dict[str, Any]]]:
    return [
        [{"user": u, "word": w} for w in (t or "").split()] for u, t in zip(batch["user"].to_pylist(), batch["text"].to_pylist())
    ]


# -- the integration test's pipeline, kernel after kernel -----------------------------------------------

SENTENCE_WORDS = pa.schema([("user", pa.string()), ("sentence", pa.string()), ("word", pa.string()), ("cents", pa.int64())])
FILES = [
    ("u1", "y x. x z. q", 1.25), ("u2", "z skip w. w", 2.5), ("u2", "neg", -1.0), ("u3", None, 3.0), ("u3", "dup dup.", 0.75),
    ("u1", "new. y", 10.0), ("u4", "w new2", 0.0),
]  # fmt: skip


def _split_words(batch: pa.RecordBatch) -> list[list[dict[str, Any]]]:
    assert not any(name.startswith("_") for name in batch.schema.names)  # engine columns stay outside
    return [
        [{"user": u, "sentence": s, "word": w, "cents": c} for w in s.split()]
        for u, s, c in zip(batch["user"].to_pylist(), batch["sentence"].to_pylist(), batch["cents"].to_pylist())
    ]


def test_the_stream_api_pipeline_s_stateless_chain_gives_the_reference_rows() -> None:
    """tests/integration/test_stream_api.py's chain of stateless operators on the same records, against plain Python."""
    chain: list[Node] = [
        Filter(operator_id="filter-1", parent=upstream(), condition="amount >= 0"),
        MapColumns(operator_id="map-1", parent=upstream(), columns={"cents": "cast(round(amount * 100) as long)"}),
        FlatMapColumn(operator_id="flat_map-1", parent=upstream(), name="sentence", expression="split(text, '[.]')"),
        FlatMapFunction(operator_id="flat_map-2", parent=upstream(), function=_split_words, schema=SENTENCE_WORDS),
        Filter(operator_id="filter-2", parent=upstream(), function=lambda b: pc.not_equal(b["word"], "skip")),
        MapColumns(operator_id="map-2", parent=upstream(), columns={"letters": "length(word)"}),
    ]
    rows = _events(FILES)
    for node in chain:
        rows = _run(node, rows).output
    assert rows.column_names == ["user", "sentence", "word", "cents", "letters", "_seq", "_seq_1", "_seq_2"]
    assert rows.schema.field("letters").type == pa.int32()
    got = [
        tuple(r.values())
        for r in rows.sort_by([("_seq", "ascending"), ("_seq_1", "ascending"), ("_seq_2", "ascending")]).to_pylist()
    ]
    expected = []
    for position, (user, text, amount) in enumerate(FILES):
        if amount < 0 or text is None:
            continue
        for s, sentence in enumerate(re.split(r"[.]", text)):
            for w, word in enumerate(sentence.split()):
                if word != "skip":
                    expected.append((user, sentence, word, int(amount * 100), len(word), 100 + position, s, w))
    assert got == expected


@pytest.mark.parametrize("placement", [run_kernel, run_both])
def test_a_computed_key_is_the_first_word_or_null_or_empty(placement: Callable[..., KernelRun]) -> None:
    """tests/integration/test_stream_api.py's computed_keys map: its null and empty keys become dead letters later."""
    texts = ["y x", None, " lead", "y z", "z", "", None, "z y"]
    records = _events([(f"u{i}", t, 1.0) for i, t in enumerate(texts)])
    node = MapColumns(operator_id="map-1", parent=upstream(), columns={"topic": "element_at(split(text, ' '), 1)"})
    out = placement(node, [records]).output
    assert sorted(out.to_pylist(), key=lambda r: r["_seq"]) == [
        {**r, "topic": None if t is None else t.split(" ")[0]} for r, t in zip(records.to_pylist(), texts)
    ]
