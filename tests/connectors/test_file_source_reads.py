"""FileSource.splits and FileSource.read: what a task reads of a barrier, without Spark.

Expected values come from plain Python oracles over the files' bytes (or are
written out by hand), never from the source's own output.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from barrierflow.connectors.file_source import FileSource, RecordError
from barrierflow.connectors.source import FileRange, Split
from barrierflow.core.columns import SEQ, arrival_seq, seq_parts
from barrierflow.core.dead_letters import DEAD_LETTER_COLUMNS, DeadLetterReason
from barrierflow.core.errors import BlockedInputError, SourceError

_VALUE = pa.schema([pa.field("value", pa.string())])


def _source(landing: Path, **overrides: Any) -> FileSource:
    kwargs: dict[str, Any] = {
        "source_id": "src",
        "path": str(landing),
        "parser": lambda line: {"value": line},
        "parser_schema": _VALUE,
    }
    kwargs.update(overrides)
    return FileSource(**kwargs)


def _read_all(src: FileSource, splits: list[Split], keys: dict[str, str] | None = None) -> tuple[pa.Table, pa.Table]:
    parts = [src.read(split, keys or {}) for split in splits]
    records = (
        pa.concat_tables([p[0] for p in parts]) if parts else src.record_schema().append(pa.field(SEQ, pa.int64())).empty_table()
    )
    dead = pa.concat_tables([p[1] for p in parts]) if parts else pa.schema(DEAD_LETTER_COLUMNS).empty_table()
    return records, dead


def _positions(records: pa.Table) -> list[tuple[int, int, int]]:
    sources, files, lines = seq_parts(records[SEQ])
    return list(zip(sources.tolist(), (files & ((1 << 20) - 1)).tolist(), lines.tolist()))


def _lines_oracle(data: bytes) -> list[tuple[int, str]]:
    """(number, text) of each non-blank line: split on \\n, one trailing \\r dropped."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for number, raw in enumerate(lines, 1):
        text = raw.removesuffix(b"\r").decode()
        if text.strip():
            out.append((number, text))
    return out


# -- splits --------------------------------------------------------------------


def test_no_files_no_splits(landing: Path) -> None:
    src = _source(landing)
    assert src.splits({}, 0, None) == []
    assert src.splits({"file": "a.jsonl", "line": None, "files": []}, 3, 100) == []


def test_one_split_holds_every_file_in_reading_order_with_its_file_index(landing: Path) -> None:
    end = {"files": [["b.jsonl", 0, None, 40], ["a.jsonl", 2, 5, 30], ["c.jsonl", 0, None, 10**9]]}
    (split,) = _source(landing).splits(end, 3, None)
    assert split.source_index == 3 and split.late == ()
    assert [(f.name, f.file_index, f.from_line, f.to_line, f.byte_start, f.byte_end, f.size) for f in split.files] == [
        ("b.jsonl", 0, 0, None, 0, None, 40),
        ("a.jsonl", 1, 2, 5, 0, None, 30),
        ("c.jsonl", 2, 0, None, 0, None, 10**9),  # never cut without split_bytes
    ]
    assert split.files[0].uri == str(landing / "b.jsonl")
    assert split.bytes == 40 + 30 + 10**9


def test_splits_pack_files_in_order_and_cut_only_large_whole_files(landing: Path) -> None:
    end = {
        "files": [
            ["a.jsonl", 0, None, 4],
            ["b.jsonl", 0, None, 5],
            ["c.jsonl", 0, None, 23],  # whole and larger than a split: cut
            ["d.jsonl", 7, None, 50],  # a line range: whole, however large
            ["e.jsonl", 0, 3, 2],
            ["f.jsonl", 0, None, 0],
        ]
    }
    splits = _source(landing).splits(end, 1, 10)
    shape = [[(f.name, f.file_index, f.byte_start, f.byte_end) for f in s.files] for s in splits]
    assert shape == [
        [("a.jsonl", 0, 0, None), ("b.jsonl", 1, 0, None)],
        [("c.jsonl", 2, 0, 10)],
        [("c.jsonl", 2, 10, 20)],
        [("c.jsonl", 2, 20, 23)],
        [("d.jsonl", 3, 0, None)],
        [("e.jsonl", 4, 0, None), ("f.jsonl", 5, 0, None)],
    ]
    assert all(s.source_index == 1 for s in splits)
    assert [s.bytes for s in splits] == [9, 10, 10, 3, 50, 2]


def test_late_files_go_in_the_first_split_even_alone(landing: Path) -> None:
    src = _source(landing)
    splits = src.splits({"files": [["a.jsonl", 0, None, 8], ["b.jsonl", 0, None, 8]], "late": [["0.jsonl", 12]]}, 0, 8)
    assert [s.late for s in splits] == [(("0.jsonl", 12),), ()]
    (alone,) = src.splits({"files": [], "late": [["0.jsonl", 12], ["00.jsonl", 3]]}, 0, 8)
    assert alone.files == () and alone.late == (("0.jsonl", 12), ("00.jsonl", 3))


def test_parquet_files_are_never_cut(landing: Path) -> None:
    src = FileSource("p", str(landing), format="parquet", schema=pa.schema([("x", pa.int64())]))
    splits = src.splits({"files": [["a.parquet", 0, None, 100], ["b.parquet", 0, None, 3]]}, 0, 10)
    assert [[(f.name, f.byte_end) for f in s.files] for s in splits] == [[("a.parquet", None)], [("b.parquet", None)]]


# -- byte ranges: every line once, numbered as in the whole file ------------------


def _varied(n: int = 80) -> bytes:
    rng = np.random.default_rng(7)
    parts = []
    for i in range(n):
        kind = i % 7
        if kind == 0:
            parts.append(b"\n")  # blank
        elif kind == 1:
            parts.append(("é✓" * int(rng.integers(0, 9)) + f" {i}\r\n").encode())
        elif kind == 2:
            parts.append(b"  \t \n")  # blank too
        else:
            parts.append((f"line {i} " + "x" * int(rng.integers(0, 30)) + "\n").encode())
    return b"".join(parts) + b"last line without a newline"


@pytest.mark.parametrize("split_bytes", [1, 2, 3, 17, 64, 333, 4096, 10**6])
def test_byte_ranges_read_every_line_once_with_its_number_however_cut(landing: Path, split_bytes: int) -> None:
    data = _varied()
    (landing / "a.jsonl").write_bytes(data)
    (landing / "b.jsonl").write_bytes(b"first\nsecond\n")
    src = _source(landing)
    end = {"files": [["a.jsonl", 0, None, len(data)], ["b.jsonl", 0, None, 13]]}
    records, dead = _read_all(src, src.splits(end, 2, split_bytes))
    expected = [(2, 0, n, text) for n, text in _lines_oracle(data)] + [(2, 1, 1, "first"), (2, 1, 2, "second")]
    got = [(*pos, value) for pos, value in zip(_positions(records), records["value"].to_pylist())]
    assert got == expected  # in reading order, each once
    assert dead.num_rows == 0


def test_whole_and_cut_reads_agree_on_dead_letters_too(landing: Path) -> None:
    lines = [json.dumps({"n": i}) if i % 5 else "not a number" for i in range(1, 80)]
    data = "\n".join(lines).encode()
    (landing / "a.jsonl").write_bytes(data)

    def parser(text: str) -> dict[str, Any]:
        return {"n": json.loads(text)["n"]}

    src = _source(landing, parser=parser, parser_schema=pa.schema([("n", pa.int64())]))
    end = {"files": [["a.jsonl", 0, None, len(data)]]}
    for split_bytes in (None, 5, 50, 211):
        records, dead = _read_all(src, src.splits(end, 0, split_bytes))
        assert [line for _, _, line in _positions(records)] == [i for i in range(1, 80) if i % 5]
        assert records["n"].to_pylist() == [i for i in range(1, 80) if i % 5]
        assert dead["line"].to_pylist() == [i for i in range(1, 80) if i % 5 == 0]
        assert set(dead["reason"].to_pylist()) == {"parser_failed"}
        assert set(dead["raw"].to_pylist()) == {"not a number"} and set(dead["source_file"].to_pylist()) == {"a.jsonl"}


def test_line_ranges_read_lines_from_line_plus_one_to_to_line(landing: Path) -> None:
    data = b"l1\nl2\n\nl4\r\nl5\nl6"
    (landing / "a.jsonl").write_bytes(data)
    src = _source(landing)
    for from_line, to_line, expected in [
        (0, 2, [(1, "l1"), (2, "l2")]),
        (2, 4, [(4, "l4")]),  # line 3 is blank
        (4, None, [(5, "l5"), (6, "l6")]),
        (5, 6, [(6, "l6")]),
        (6, None, []),
        (9, 12, []),
    ]:
        records, _ = src.read(Split(0, (FileRange("a.jsonl", str(landing / "a.jsonl"), len(data), 4, from_line, to_line),)), {})
        assert [(line, v) for (_, _, line), v in zip(_positions(records), records["value"].to_pylist())] == expected
        assert all(f == 4 for _, f, _ in _positions(records))


def test_seq_packs_source_file_and_line(landing: Path) -> None:
    (landing / "a.jsonl").write_bytes(b"x\ny\n")
    src = _source(landing)
    records, _ = src.read(Split(5, (FileRange("a.jsonl", str(landing / "a.jsonl"), 4, 9),)), {})
    assert records[SEQ].to_pylist() == arrival_seq(5, 9, np.array([1, 2])).to_pylist()


# -- the barrier's files are checked ---------------------------------------------


def test_a_file_gone_since_its_barrier_blocks_the_source_naming_it(landing: Path) -> None:
    src = _source(landing)
    with pytest.raises(BlockedInputError, match="source src: file gone.jsonl recorded in the barrier is gone"):
        src.read(Split(0, (FileRange("gone.jsonl", str(landing / "gone.jsonl"), 10, 0),)), {})


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_file_of_another_size_than_recorded_fails_naming_it(landing: Path, fmt: str) -> None:
    path = landing / f"a.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"x": [1, 2]}), path)
        src = FileSource("src", str(landing), format="parquet", schema=pa.schema([("x", pa.int64())]))
    else:
        path.write_bytes(b"1\n2\n")
        src = _source(landing)
    size = path.stat().st_size
    with pytest.raises(SourceError, match=f"a.{fmt} has {size} bytes, {size - 1} when its epoch was planned"):
        src.read(Split(0, (FileRange(path.name, str(path), size - 1, 0),)), {})


def test_late_files_are_one_dead_letter_each_and_never_opened(landing: Path) -> None:
    (landing / "b.jsonl").write_bytes(b"b\n")
    src = _source(landing)
    (split,) = src.splits({"files": [["b.jsonl", 0, None, 2]], "late": [["a.jsonl", 5], ["0.jsonl", 7]]}, 0, None)
    records, dead = src.read(split, {})  # a.jsonl and 0.jsonl do not even exist
    assert records["value"].to_pylist() == ["b"]
    assert dead.schema == pa.schema(DEAD_LETTER_COLUMNS)
    assert dead.to_pylist() == [
        {"source": "src", "source_file": name, "line": None, "raw": None, "reason": "late_file",
         "detail": f"landed after the stream had passed its name ({size} bytes, never read)"}
        for name, size in (("a.jsonl", 5), ("0.jsonl", 7))
    ]  # fmt: skip


# -- the line parser's rules --------------------------------------------------------


def _parsed(
    landing: Path, text: bytes, parser: Callable[[str], Any], schema: pa.Schema, keys: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    (landing / "in.jsonl").write_bytes(text)
    src = _source(landing, parser=parser, parser_schema=schema)
    records, dead = src.read(src.splits({"files": [["in.jsonl", 0, None, len(text)]]}, 0, None)[0], keys or {})
    assert records.schema == pa.schema([*(f.with_nullable(True) for f in schema), pa.field(SEQ, pa.int64())])
    problems = {d["line"]: f"{d['reason']}: {d['detail']}" for d in dead.to_pylist()}
    return records.drop_columns([SEQ]).to_pylist(), problems


def test_a_record_error_names_its_reason(landing: Path) -> None:
    def parser(text: str) -> dict[str, Any]:
        if text == "w":
            raise RecordError("n is lots", DeadLetterReason.WRONG_TYPE)
        if text == "k":
            raise RecordError("no key", DeadLetterReason.NULL_KEY)
        return {"n": int(text)}

    rows, problems = _parsed(landing, b"1\nw\nk\n2\n", parser, pa.schema([("n", pa.int64())]))
    assert rows == [{"n": 1}, {"n": 2}]
    assert problems == {2: "wrong_type: n is lots", 3: "null_key: no key"}


def test_values_are_never_coerced_and_the_first_wrong_field_in_schema_order_is_named(landing: Path) -> None:
    schema = pa.schema(
        [
            pa.field("i", pa.int32()),
            pa.field("f", pa.float64()),
            pa.field("s", pa.string()),
            pa.field("b", pa.bool_()),
            pa.field("t", pa.timestamp("us", tz="UTC")),
        ]
    )
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    returned: dict[str, dict[str, Any]] = {
        "ok": {"i": 1, "f": 2, "s": "x", "b": False, "t": when},  # an int is a fine double
        "ok-nulls": {},
        "bool-int": {"i": True},
        "float-int": {"i": 2.0},
        "int-overflow": {"i": 2**31},
        "np-int": {"i": np.int64(3)},  # not a Python int: refused, as before
        "str-float": {"f": "1.5"},
        "bool-float": {"f": False},
        "int-str": {"s": 5},
        "int-bool": {"b": 1},
        "str-ts": {"t": "2024-01-01T00:00:00Z"},
        "two-wrong": {"b": "no", "s": 1},  # s comes first in the schema
    }
    text = "\n".join(returned).encode()
    rows, problems = _parsed(landing, text, returned.__getitem__, schema)
    assert rows == [{"i": 1, "f": 2.0, "s": "x", "b": False, "t": when}, dict.fromkeys(schema.names)]
    assert problems == {
        3: "wrong_type: i: True is not int32",
        4: "wrong_type: i: 2.0 is not int32",
        5: f"wrong_type: i: {2**31} is not int32",
        6: "wrong_type: i: 3 is not int32",
        7: "wrong_type: f: 1.5 is not double",
        8: "wrong_type: f: False is not double",
        9: "wrong_type: s: 5 is not string",
        10: "wrong_type: b: 1 is not bool",
        11: "wrong_type: t: 2024-01-01T00:00:00Z is not timestamp[us, tz=UTC]",
        12: "wrong_type: s: 1 is not string",
    }


def test_missing_fields_then_keys_then_types_decide_a_lines_problem(landing: Path) -> None:
    schema = pa.schema(
        [pa.field("a", pa.int64(), nullable=False), pa.field("k", pa.int64()), pa.field("z", pa.string(), nullable=False)]
    )
    returned: dict[str, Any] = {
        "1": {"a": None, "k": None, "z": None},  # a first: missing_field a
        "2": {"a": "x", "k": None, "z": None},  # a is there (wrong, but later): missing z
        "3": {"a": "x", "k": None, "z": "z"},  # then the key
        "4": {"a": "x", "k": "", "z": "z"},  # an empty key of a non-string field is still empty
        "5": {"a": "x", "k": 1, "z": "z"},  # then types
        "6": {"a": 1, "k": 2, "z": "z", "extra": object()},  # other keys of the mapping are ignored
    }
    rows, problems = _parsed(landing, "\n".join(returned).encode(), returned.__getitem__, schema, {"k": "per_k"})
    assert rows == [{"a": 1, "k": 2, "z": "z"}]
    assert problems == {
        1: "missing_field: required field a is missing or null",
        2: "missing_field: required field z is missing or null",
        3: "null_key: key k of operator per_k is missing or null",
        4: "empty_key: key k of operator per_k is empty",
        5: "wrong_type: a: x is not int64",
    }


def test_keys_are_checked_in_name_order_and_only_the_sources_own(landing: Path) -> None:
    schema = pa.schema([("b", pa.string()), ("a", pa.string())])
    returned: dict[str, Any] = {"1": {"b": None, "a": ""}, "2": {"b": "", "a": "x"}, "3": {"b": "y", "a": "x"}}
    rows, problems = _parsed(landing, b"1\n2\n3\n", returned.__getitem__, schema, {"b": "op_b", "a": "op_a", "computed": "op_c"})
    assert rows == [{"b": "y", "a": "x"}]
    assert problems == {1: "empty_key: key a of operator op_a is empty", 2: "empty_key: key b of operator op_b is empty"}


def test_mappings_other_than_dicts_are_records_and_other_values_are_not(landing: Path) -> None:
    class Row(dict):
        pass

    from types import MappingProxyType

    returned: dict[str, Any] = {"1": Row(n=1), "2": MappingProxyType({"n": 2}), "3": None, "4": 7}
    rows, problems = _parsed(landing, b"1\n2\n3\n4\n", returned.__getitem__, pa.schema([("n", pa.int64())]))
    assert rows == [{"n": 1}, {"n": 2}]
    assert problems == {
        3: "parser_failed: the parser returned a NoneType, not a mapping",
        4: "parser_failed: the parser returned a int, not a mapping",
    }


def test_lines_are_decoded_blank_ones_skipped_and_cr_dropped_once(landing: Path) -> None:
    seen: list[str] = []

    def parser(text: str) -> dict[str, Any]:
        seen.append(text)
        return {"value": text}

    text = b"a\r\r\n\xe2\x80\x83\n\t \r\n\xc3\x28x\r\nb"
    rows, problems = _parsed(landing, text, parser, _VALUE)
    assert seen == ["a\r", "b"]  # line 2 is an em space, line 3 blank too
    assert rows == [{"value": "a\r"}, {"value": "b"}]
    assert problems == {4: "invalid_utf8: not valid UTF-8: invalid continuation byte at byte 0"}


def test_the_dead_letters_of_a_parser_keep_the_decoded_line_as_raw(landing: Path) -> None:
    (landing / "in.jsonl").write_bytes(b"ok\nbad\xff\r\n")
    src = _source(landing, parser=lambda t: {"value": t} if t == "ok" else 1 / 0)
    records, dead = src.read(src.splits({"files": [["in.jsonl", 0, None, 9]]}, 0, None)[0], {})
    assert records["value"].to_pylist() == ["ok"]
    assert dead.select(["line", "raw", "reason"]).to_pylist() == [{"line": 2, "raw": "bad\ufffd", "reason": "invalid_utf8"}]


# -- JSON Lines against a schema ----------------------------------------------------


def test_jsonl_with_a_schema_gives_records_with_seq_and_dead_letters_with_lines(landing: Path) -> None:
    data = b'{"id": "a", "n": 1}\n[1]\n\n{"id": "", "n": 2}\n{"id": "b", "n": 3}\n'
    (landing / "a.jsonl").write_bytes(data)
    schema = pa.schema([pa.field("id", pa.string()), pa.field("n", pa.int64())])
    src = FileSource("src", str(landing), schema=schema)
    assert src.record_schema() == pa.schema([f.with_nullable(True) for f in schema])
    for split_bytes in (None, 7, 30):
        records, dead = _read_all(src, src.splits({"files": [["a.jsonl", 0, None, len(data)]]}, 1, split_bytes), {"id": "dedup"})
        assert records.schema == src.record_schema().append(pa.field(SEQ, pa.int64()))
        assert records.drop_columns([SEQ]).to_pylist() == [{"id": "a", "n": 1}, {"id": "b", "n": 3}]
        assert _positions(records) == [(1, 0, 1), (1, 0, 5)]
        assert sorted(dead.select(["source", "source_file", "line", "raw", "reason"]).to_pylist(), key=lambda d: d["line"]) == [
            {"source": "src", "source_file": "a.jsonl", "line": 2, "raw": "[1]", "reason": "not_an_object"},
            {"source": "src", "source_file": "a.jsonl", "line": 4, "raw": '{"id": "", "n": 2}', "reason": "empty_key"},
        ]


# -- Parquet ----------------------------------------------------------------------------

_PARQUET_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("amount", pa.float64()),
        pa.field("n", pa.int64()),
        pa.field("note", pa.string()),
    ]
)


def _parquet_source(landing: Path) -> FileSource:
    return FileSource("pq", str(landing), format="parquet", schema=_PARQUET_SCHEMA)


def _end(landing: Path, *names: str, ranges: dict[str, tuple[int, int | None]] | None = None) -> dict[str, Any]:
    ranges = ranges or {}
    return {"files": [[n, *ranges.get(n, (0, None)), (landing / n).stat().st_size] for n in names]}


def test_parquet_record_schema_is_the_declared_one_nullable(landing: Path) -> None:
    assert _parquet_source(landing).record_schema() == pa.schema([f.with_nullable(True) for f in _PARQUET_SCHEMA])


def test_parquet_narrower_types_widen_extra_columns_are_ignored_absent_nullable_ones_null(landing: Path) -> None:
    pq.write_table(
        pa.table(
            {
                "extra": pa.array([b"x", b"y"]),
                "n": pa.array([1, 2], pa.int16()),
                "amount": pa.array([1.5, 2.5], pa.float32()),
                "id": ["a", "b"],
            }
        ),
        landing / "a.parquet",
    )
    src = _parquet_source(landing)
    records, dead = _read_all(src, src.splits(_end(landing, "a.parquet"), 0, None))
    assert records.schema == src.record_schema().append(pa.field(SEQ, pa.int64()))
    assert records.drop_columns([SEQ]).to_pylist() == [
        {"id": "a", "amount": 1.5, "n": 1, "note": None},
        {"id": "b", "amount": 2.5, "n": 2, "note": None},
    ]
    assert _positions(records) == [(0, 0, 1), (0, 0, 2)]
    assert dead.num_rows == 0


def test_parquet_files_that_do_not_fit_are_one_dead_letter_each_and_the_epoch_goes_on(landing: Path) -> None:
    pq.write_table(pa.table({"id": ["a"], "amount": ["lots"]}), landing / "a.parquet")
    pq.write_table(pa.table({"amount": [1.0]}), landing / "b.parquet")  # the required id is absent
    (landing / "c.parquet").write_bytes(b"not parquet at all")
    pq.write_table(pa.table({"id": ["d"], "n": pa.array([4], pa.int64())}), landing / "d.parquet")
    src = _parquet_source(landing)
    records, dead = _read_all(src, src.splits(_end(landing, "a.parquet", "b.parquet", "c.parquet", "d.parquet"), 0, 1))
    assert records.drop_columns([SEQ]).to_pylist() == [{"id": "d", "amount": None, "n": 4, "note": None}]
    assert _positions(records) == [(0, 3, 1)]
    rows = {d["source_file"]: d for d in dead.to_pylist()}
    assert set(rows) == {"a.parquet", "b.parquet", "c.parquet"}
    assert (rows["a.parquet"]["reason"], rows["a.parquet"]["detail"]) == (
        "incompatible_schema",
        "column amount is string, not double",
    )
    assert rows["a.parquet"]["raw"] == "id string, amount string"
    assert (rows["b.parquet"]["reason"], rows["b.parquet"]["detail"]) == ("incompatible_schema", "column id (string) is missing")
    assert rows["c.parquet"]["reason"] == "unreadable_file"
    assert rows["c.parquet"]["detail"].startswith("not a readable Parquet file: ")
    assert all(d["line"] is None for d in rows.values())


def test_parquet_rows_are_checked_like_lines_with_their_row_number(landing: Path) -> None:
    pq.write_table(
        pa.table({"id": ["a", None, "c", "", "e"], "amount": [1.0, 2.0, 3.0, 4.0, None], "note": ["x", None, None, None, "y"]}),
        landing / "a.parquet",
    )
    src = _parquet_source(landing)
    records, dead = _read_all(src, src.splits(_end(landing, "a.parquet"), 0, None), {"id": "dedup", "note": "per_note"})
    assert records.drop_columns([SEQ]).to_pylist() == [
        {"id": "a", "amount": 1.0, "n": None, "note": "x"},
        {"id": "e", "amount": None, "n": None, "note": "y"},
    ]
    assert [line for *_, line in _positions(records)] == [1, 5]
    assert dead.select(["source_file", "line", "raw", "reason", "detail"]).to_pylist() == [
        {"source_file": "a.parquet", "line": 2, "raw": '{"amount":2.0}', "reason": "missing_field", "detail": "required field id is missing or null"},
        {"source_file": "a.parquet", "line": 3, "raw": '{"id":"c","amount":3.0}', "reason": "null_key", "detail": "key note of operator per_note is missing or null"},
        {"source_file": "a.parquet", "line": 4, "raw": '{"id":"","amount":4.0}', "reason": "empty_key", "detail": "key id of operator dedup is empty"},
    ]  # fmt: skip


def test_parquet_row_ranges_read_only_their_rows_across_row_groups(landing: Path) -> None:
    ids = [f"r{i}" for i in range(1, 24)]
    pq.write_table(pa.table({"id": ids}), landing / "a.parquet", row_group_size=5)
    src = _parquet_source(landing)
    for from_row, to_row in [(0, 3), (3, 11), (11, None), (20, 23), (23, None), (4, 5)]:
        end = _end(landing, "a.parquet", ranges={"a.parquet": (from_row, to_row)})
        records, _ = _read_all(src, src.splits(end, 0, 1))
        assert records["id"].to_pylist() == ids[from_row:to_row]
        assert [line for *_, line in _positions(records)] == list(range(from_row + 1, (to_row or 23) + 1))
