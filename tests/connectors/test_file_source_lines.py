"""barrierflow.connectors.file_source: planning, line enumeration and byte-range chunks.

Moved from tests/unit; the old task dictionaries and line iterators are gone:
a task's part of a file is a :class:`FileRange`, its lines are what
:func:`owned_lines` reads (numbered from its first line), and a source
reads a :class:`Split` (``FileSource.read``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa
import pytest

from barrierflow.connectors import file_source
from barrierflow.connectors.file_source import FileSource, RecordError, _count_lines, count_records, lines_of, owned_lines
from barrierflow.connectors.source import FileRange, Split, open_file
from barrierflow.core.columns import SEQ, seq_parts
from barrierflow.core.errors import PipelineDefinitionError, SourceError

# -- helpers -----------------------------------------------------------------


def _count_here(uris: Sequence[str], fmt: str) -> dict[str, int]:
    """The coordinator's record counter without Spark: the executor tasks' own count, in this process."""
    return {uri: count_records(uri, fmt) for uri in uris}


def _task(
    path: Path | str, byte_start: int = 0, byte_end: int = -1, from_line: int = 0, to_line: int = -1, size: int | None = None
) -> FileRange:
    """A task's part of one file (the old task dictionary's fields: -1 for "to the end" / "not a byte range")."""
    path = Path(path)
    return FileRange(
        name=path.name,
        uri=str(path),
        size=path.stat().st_size if size is None else size,
        file_index=0,
        from_line=from_line,
        to_line=None if to_line < 0 else to_line,
        byte_start=byte_start,
        byte_end=None if byte_end < 0 else byte_end,
    )


def _iter_lines(part: FileRange) -> list[tuple[int, bytes]]:
    """(1-based line number, raw bytes without the \n) of the lines a task owns: what it reads, split into lines."""
    with open_file("src", part) as handle:
        first, data = owned_lines(handle, part)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # a trailing newline ends the last line, it does not start one
    return list(enumerate(lines, first))


def _expected_lines(data: bytes) -> list[tuple[int, bytes]]:
    """Independent oracle: 1-based (line number, bytes without the \n)."""
    out = []
    line_no, start = 1, 0
    while start < len(data):
        nl = data.find(b"\n", start)
        if nl < 0:
            out.append((line_no, data[start:]))
            break
        out.append((line_no, data[start:nl]))
        line_no += 1
        start = nl + 1
    return out


def _chunked(path: Path, size: int, chunk: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    for start in range(0, size, chunk):
        got.extend(_iter_lines(_task(path, start, min(size, start + chunk))))
    return got


def _parts(splits: list[Split]) -> list[FileRange]:
    return [part for split in splits for part in split.files]


@pytest.fixture
def varied_file(tmp_path: Path) -> tuple[Path, bytes]:
    """Lines of very different lengths: empty, \\r\\n-terminated, multi-byte UTF-8,
    and a final line without a newline."""
    rng = random.Random(1234)
    parts: list[bytes] = []
    for i in range(120):
        kind = i % 6
        if kind == 0:
            body = b""
        elif kind == 1:
            body = b'{"i": %d, "pad": "%s"}' % (i, b"x" * rng.randint(0, 300))
        elif kind == 2:
            body = ("température é ✓ %d" % i).encode()
        elif kind == 3:
            body = b"y" * rng.randint(1, 3)
        elif kind == 4:
            body = b"\r"  # an empty \r\n line
        else:
            body = b"z" * rng.randint(40, 90)
        ending = b"\r\n" if i % 4 == 1 else b"\n"
        parts.append(body + ending)
    parts.append(b'{"last": "line without a newline"}')
    data = b"".join(parts)
    path = tmp_path / "varied.jsonl"
    path.write_bytes(data)
    return path, data


# -- _count_lines / whole-file _iter_lines -------------------------------------


@pytest.mark.parametrize(
    ("data", "count"),
    [
        (b"", 0),
        (b"a", 1),
        (b"a\n", 1),
        (b"a\nb", 2),
        (b"a\nb\n", 2),
        (b"\n", 1),
        (b"\n\n", 2),
        (b"a\r\nb\r\n", 2),
    ],
)
def test_count_lines_agrees_with_whole_file_enumeration(tmp_path: Path, data: bytes, count: int) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    assert _count_lines(str(path)) == count
    assert list(_iter_lines(_task(path))) == _expected_lines(data)
    assert len(list(_iter_lines(_task(path)))) == count


def test_whole_file_enumeration_of_varied_file(varied_file: tuple[Path, bytes]) -> None:
    path, data = varied_file
    lines = list(_iter_lines(_task(path)))
    assert lines == _expected_lines(data)
    assert lines[-1] == (121, b'{"last": "line without a newline"}')
    assert lines[1][1].endswith(b"\r")  # \r is left for _decode to strip
    assert _count_lines(str(path)) == 121


def test_from_and_to_line_select_a_slice(varied_file: tuple[Path, bytes]) -> None:
    path, data = varied_file
    expected = _expected_lines(data)
    assert list(_iter_lines(_task(path, from_line=10, to_line=20))) == expected[10:20]
    assert list(_iter_lines(_task(path, from_line=115))) == expected[115:]
    assert list(_iter_lines(_task(path, from_line=100, to_line=10_000))) == expected[100:]
    assert list(_iter_lines(_task(path, from_line=121))) == []


# -- byte-range chunking -------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 97, 500, 4096, 1 << 20])
def test_byte_range_chunks_enumerate_every_line_exactly_once(varied_file: tuple[Path, bytes], chunk: int) -> None:
    path, data = varied_file
    assert _chunked(path, len(data), chunk) == _expected_lines(data)


def test_byte_range_chunks_with_trailing_newline_and_crlf_boundaries(tmp_path: Path) -> None:
    # Every split point of a small file, including between \r and \n.
    data = b"ab\r\n\r\ncd\n\nefg\r\nh\n"
    path = tmp_path / "small.jsonl"
    path.write_bytes(data)
    expected = _expected_lines(data)
    for cut in range(len(data) + 1):
        got = list(_iter_lines(_task(path, 0, cut))) + list(_iter_lines(_task(path, cut, len(data))))
        assert got == expected, f"split at byte {cut}"


def test_byte_range_owns_lines_starting_inside_it(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"aaaa\nbbbb\ncccc\n")  # lines start at 0, 5, 10
    assert list(_iter_lines(_task(path, 0, 5))) == [(1, b"aaaa")]
    assert list(_iter_lines(_task(path, 1, 5))) == []  # mid-line start, no line starts in [1, 5)
    assert list(_iter_lines(_task(path, 1, 6))) == [(2, b"bbbb")]
    assert list(_iter_lines(_task(path, 5, 6))) == [(2, b"bbbb")]
    assert list(_iter_lines(_task(path, 10, 15))) == [(3, b"cccc")]


def test_tasks_chunk_only_whole_large_files(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path], landing: Path
) -> None:
    write_file("a.jsonl", b"x" * 25)
    write_file("b.jsonl", b"y" * 25)
    write_file("c.jsonl", b"z" * 5)
    src = make_source()
    ranges = [["a.jsonl", 0, None, 25], ["b.jsonl", 3, None, 25], ["c.jsonl", 0, 2, 5]]
    tasks = [
        (p.name, p.file_index, p.uri, p.from_line, p.to_line, p.byte_start, p.byte_end, p.size)
        for p in _parts(src.splits({"files": ranges}, 0, 10))
    ]
    a, b, c = str(landing / "a.jsonl"), str(landing / "b.jsonl"), str(landing / "c.jsonl")
    assert tasks == [
        ("a.jsonl", 0, a, 0, None, 0, 10, 25),
        ("a.jsonl", 0, a, 0, None, 10, 20, 25),
        ("a.jsonl", 0, a, 0, None, 20, 25, 25),
        ("b.jsonl", 1, b, 3, None, 0, None, 25),  # resumes at a line: not chunked
        ("c.jsonl", 2, c, 0, 2, 0, None, 5),  # bounded: not chunked
    ]


def test_tasks_file_exactly_one_chunk_is_not_split(make_source: Callable[..., FileSource]) -> None:
    parts = _parts(make_source().splits({"files": [["a.jsonl", 0, None, 10], ["b.jsonl", 0, None, 20]]}, 0, 10))
    assert [(p.byte_start, p.byte_end) for p in parts] == [(0, None), (0, 10), (10, 20)]


@pytest.mark.parametrize("chunk_bytes", [1, 5, 33, 256, 100_000])
def test_tasks_then_iter_lines_reads_the_whole_file(
    make_source: Callable[..., FileSource], varied_file: tuple[Path, bytes], chunk_bytes: int
) -> None:
    path, data = varied_file
    splits = make_source(path=str(path.parent)).splits({"files": [[path.name, 0, None, len(data)]]}, 0, chunk_bytes)
    got = [line for part in _parts(splits) for line in _iter_lines(part)]
    assert got == _expected_lines(data)


# -- planning --------------------------------------------------------------------


def test_plan_lexicographic_order_and_ignored_names(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path], landing: Path
) -> None:
    for name in ("b.jsonl", "a.jsonl", "c.json", "_tmp.jsonl", ".partial.jsonl", "notes.txt", "B.jsonl"):
        write_file(name, ["{}"])
    (landing / "dir.jsonl").mkdir()
    plan = make_source(max_files_per_epoch=100).plan(None, None)
    assert [r[0] for r in plan["files"]] == ["B.jsonl", "a.jsonl", "b.jsonl", "c.json"]
    assert plan["file"] == "c.json"
    assert plan["line"] is None
    assert all(r[1] == 0 and r[2] is None and r[3] == 3 for r in plan["files"])


def test_plan_custom_suffixes(make_source: Callable[..., FileSource], write_file: Callable[..., Path]) -> None:
    write_file("a.jsonl", ["{}"])
    write_file("b.json", ["{}"])
    plan = make_source(suffixes=(".jsonl",)).plan(None, None)
    assert [r[0] for r in plan["files"]] == ["a.jsonl"]


def test_plan_max_files_per_epoch_and_resume_after_last_file(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path]
) -> None:
    for i in range(5):
        write_file(f"f{i}.jsonl", ["{}", "{}"])
    src = make_source(max_files_per_epoch=2)
    first = src.plan(None, None)
    assert [r[0] for r in first["files"]] == ["f0.jsonl", "f1.jsonl"]
    second = src.plan(first, None)
    assert [r[0] for r in second["files"]] == ["f2.jsonl", "f3.jsonl"]
    third = src.plan(second, None)
    assert [r[0] for r in third["files"]] == ["f4.jsonl"]
    assert src.has_records(third)
    idle = src.plan(third, None)
    assert idle == {"file": "f4.jsonl", "line": None, "files": [], "consumed": 5, "recent": [f"f{i}.jsonl" for i in range(5)]}
    assert not src.has_records(idle)


def test_plan_on_empty_directory_is_idle(make_source: Callable[..., FileSource]) -> None:
    assert make_source().plan(None, None) == {"file": None, "line": None, "files": [], "consumed": 0, "recent": []}


def test_plan_picks_up_files_landing_later(make_source: Callable[..., FileSource], write_file: Callable[..., Path]) -> None:
    src = make_source()
    write_file("2024-01-01.jsonl", ["{}"])
    first = src.plan(None, None)
    write_file("2024-01-02.jsonl", ["{}"])
    second = src.plan(first, None)
    assert [r[0] for r in second["files"]] == ["2024-01-02.jsonl"]
    assert second["consumed"] == 2


def test_plan_max_records_splits_inside_a_file_and_resumes(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path]
) -> None:
    write_file("a.jsonl", [f'{{"n": {i}}}' for i in range(10)])
    write_file("b.jsonl", [f'{{"n": {i}}}' for i in range(3)])
    src = make_source(max_records_per_epoch=4, max_files_per_epoch=10)
    e1 = src.plan(None, None, _count_here)
    assert [r[:3] for r in e1["files"]] == [["a.jsonl", 0, 4]]
    assert (e1["file"], e1["line"]) == ("a.jsonl", 4)
    e2 = src.plan(e1, None, _count_here)
    assert [r[:3] for r in e2["files"]] == [["a.jsonl", 4, 8]]
    assert (e2["file"], e2["line"]) == ("a.jsonl", 8)
    e3 = src.plan(e2, None, _count_here)  # the rest of a.jsonl (2 records) plus 2 of b.jsonl
    assert [r[:3] for r in e3["files"]] == [["a.jsonl", 8, None], ["b.jsonl", 0, 2]]
    assert (e3["file"], e3["line"]) == ("b.jsonl", 2)
    e4 = src.plan(e3, None, _count_here)
    assert [r[:3] for r in e4["files"]] == [["b.jsonl", 2, None]]
    assert (e4["file"], e4["line"]) == ("b.jsonl", None)
    assert src.plan(e4, None, _count_here)["files"] == []


def test_plan_max_records_ranges_read_every_line_once(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path], landing: Path
) -> None:
    contents = {"a.jsonl": [f"a{i}" for i in range(7)], "b.jsonl": [f"b{i}" for i in range(5)], "c.jsonl": ["c0"]}
    for name, lines in contents.items():
        write_file(name, lines)
    src = make_source(max_records_per_epoch=3, max_files_per_epoch=2)
    seen: list[tuple[str, int, bytes]] = []
    position = None
    for _ in range(20):
        plan = src.plan(position, None, _count_here)
        if not plan["files"]:
            break
        assert sum((r[2] if r[2] is not None else len(contents[r[0]])) - r[1] for r in plan["files"]) <= 3
        for part in _parts(src.splits(plan, 0, None)):
            seen.extend((part.name, n, raw) for n, raw in _iter_lines(part))
        position = plan
    expected = [(name, i + 1, line.encode()) for name, lines in contents.items() for i, line in enumerate(lines)]
    assert seen == expected


def test_plan_reads_no_input_file_and_counts_only_what_the_record_budget_may_take(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(12):
        write_file(f"{i:02d}.jsonl", ["{}"] * 5)
    asked: list[list[str]] = []

    def counter(uris: Sequence[str], fmt: str) -> dict[str, int]:
        asked.append([Path(u).name for u in uris])
        return dict.fromkeys(uris, 5)

    def no_reading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("planning opened an input file")

    monkeypatch.setattr(file_source.objects, "open_input", no_reading)
    plan = make_source(max_records_per_epoch=12, max_files_per_epoch=20).plan(None, None, counter)
    assert [r[:3] for r in plan["files"]] == [["00.jsonl", 0, None], ["01.jsonl", 0, None], ["02.jsonl", 0, 2]]
    assert asked == [[f"{i:02d}.jsonl" for i in range(8)]]  # one job for the first few candidates
    with pytest.raises(SourceError, match="max_records_per_epoch needs the records of the files counted by executors"):
        make_source(max_records_per_epoch=12).plan(None, None)
    assert len(make_source().plan(None, None)["files"]) == 10  # no record limit: nothing to count


def test_plan_records_file_sizes(make_source: Callable[..., FileSource], write_file: Callable[..., Path]) -> None:
    path = write_file("a.jsonl", b'{"x": 1}\n{"x": 2}')
    plan = make_source(max_records_per_epoch=1).plan(None, None, _count_here)
    assert plan["files"] == [["a.jsonl", 0, 1, path.stat().st_size]]


def test_plan_arrival_cutoff_skips_newer_files(make_source: Callable[..., FileSource], write_file: Callable[..., Path]) -> None:
    write_file("a.jsonl", ["{}"], mtime_ms=1_000_000)
    write_file("b.jsonl", ["{}"], mtime_ms=2_000_000)
    src = make_source()
    assert [r[0] for r in src.plan(None, 1_500_000)["files"]] == ["a.jsonl"]
    assert [r[0] for r in src.plan(None, 2_000_000)["files"]] == ["a.jsonl", "b.jsonl"]


def test_plan_missing_directory_is_a_source_error(make_source: Callable[..., FileSource], tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="landing_dir"):
        make_source(path=str(tmp_path / "missing")).plan(None, None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format": "csv"}, "format must be"),
        ({"max_files_per_epoch": 0}, "max_files_per_epoch"),
        ({"max_records_per_epoch": 0}, "max_records_per_epoch"),
        ({"schema": pa.schema([("x", pa.int64())])}, "exactly one of"),  # both schema and parser
        ({"parser": None, "parser_schema": None}, "exactly one of"),  # neither
        ({"parser_schema": None}, "parser_schema"),
    ],
)
def test_source_definition_errors(make_source: Callable[..., FileSource], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=match):
        make_source(**kwargs)


# -- the line parser's stage over read lines (FileSource.read with parser=) ------

_SCHEMA = pa.schema([pa.field("n", pa.int64()), pa.field("label", pa.string())])


def _read_rows(
    path: Path, parser: Callable[[str], Any], schema: pa.Schema = _SCHEMA, keys: dict[str, str] | None = None, from_line: int = 0
) -> list[dict[str, Any]]:
    """The file read by a parser source, as the old parsed lines: fields, ``_fidx``, ``_line``, ``_raw``, ``_error``, in line order."""
    src = FileSource("src", str(path.parent), parser=parser, parser_schema=schema)
    records, dead = src.read(Split(0, (_task(path, from_line=from_line),)), keys or {})
    assert records.schema == pa.schema([*(f.with_nullable(True) for f in schema), pa.field(SEQ, pa.int64())])
    _, files, lines = seq_parts(records[SEQ])
    rows = [
        {**{name: r[name] for name in schema.names}, "_fidx": int(fidx), "_line": int(line), "_raw": None, "_error": None}
        for r, fidx, line in zip(records.to_pylist(), files, lines)
    ]
    assert set(dead["source_file"].to_pylist()) <= {path.name}
    rows += [
        {
            **dict.fromkeys(schema.names),
            "_fidx": 0,
            "_line": d["line"],
            "_raw": d["raw"],
            "_error": f"{d['reason']}: {d['detail']}",
        }
        for d in dead.to_pylist()
    ]
    return sorted(rows, key=lambda r: r["_line"])


def _parse(path: Path, parser: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    return _read_rows(path, parser)


def _strict_parser(text: str) -> dict[str, Any]:
    if text.startswith("bad"):
        raise RecordError(f"bad record: {text}")
    if text == "empty-reason":
        raise RecordError("")
    if text == "boom":
        raise KeyError("oops")
    if text == "zero":
        return {"n": 1 // 0, "label": ""}
    return {"n": int(text), "label": f"#{text}"}


def test_parse_lines_routes_errors_to_dead_letters(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"1\nbad one\n\n   \n2\r\nboom\nzero\nempty-reason\n3")
    rows = _parse(path, _strict_parser)
    assert rows == [
        {"n": 1, "label": "#1", "_fidx": 0, "_line": 1, "_raw": None, "_error": None},
        {"n": None, "label": None, "_fidx": 0, "_line": 2, "_raw": "bad one", "_error": "invalid_record: bad record: bad one"},
        # lines 3 and 4 are blank: skipped, not records
        {"n": 2, "label": "#2", "_fidx": 0, "_line": 5, "_raw": None, "_error": None},
        {"n": None, "label": None, "_fidx": 0, "_line": 6, "_raw": "boom", "_error": "parser_failed: KeyError: 'oops'"},
        {
            "n": None,
            "label": None,
            "_fidx": 0,
            "_line": 7,
            "_raw": "zero",
            "_error": "parser_failed: ZeroDivisionError: integer division or modulo by zero",
        },
        {"n": None, "label": None, "_fidx": 0, "_line": 8, "_raw": "empty-reason", "_error": "invalid_record: invalid record"},
        {"n": 3, "label": "#3", "_fidx": 0, "_line": 9, "_raw": None, "_error": None},
    ]


def test_what_a_parser_returns_is_checked_against_its_schema_and_the_keys(tmp_path: Path) -> None:
    """A record the parser accepted is still a dead letter if a value is not of its field's type (never
    coerced to null), a non-nullable field is missing, or a key is null or empty."""
    schema = pa.schema([pa.field("n", pa.int64(), nullable=False), pa.field("label", pa.string())])
    returned = {
        "1": {"n": 1, "label": "k"},
        "2": {"n": "lots", "label": "k"},  # not an int64
        "3": {"n": 1.5, "label": "k"},  # would be truncated
        "4": {"n": 10**30, "label": "k"},  # out of range
        "5": {"label": "k"},  # n missing
        "6": {"n": 6},  # key missing
        "7": {"n": 7, "label": ""},  # key empty
        "8": ["not", "a", "mapping"],
    }
    path = tmp_path / "in.jsonl"
    path.write_bytes("\n".join(returned).encode())
    rows = _read_rows(path, returned.__getitem__, schema, {"label": "per_label"})
    assert [(r["_line"], r["n"], r["label"]) for r in rows if r["_error"] is None] == [(1, 1, "k")]
    errors = {r["_line"]: r["_error"] for r in rows if r["_error"] is not None}
    assert errors == {
        2: "wrong_type: n: lots is not int64",
        3: "wrong_type: n: 1.5 is not int64",
        4: f"wrong_type: n: {10**30} is not int64",
        5: "missing_field: required field n is missing or null",
        6: "null_key: key label of operator per_label is missing or null",
        7: "empty_key: key label of operator per_label is empty",
        8: "parser_failed: the parser returned a list, not a mapping",
    }
    assert all(r["_raw"] == str(r["_line"]) for r in rows if r["_error"] is not None)


def test_invalid_utf8_is_a_dead_letter_without_calling_the_parser(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"1\n\xff\xfe2\n")
    calls: list[str] = []

    def parser(text: str) -> dict[str, Any]:
        calls.append(text)
        return {"n": int(text), "label": None}

    rows = _parse(path, parser)
    assert calls == ["1"]
    assert rows[1]["_line"] == 2
    assert rows[1]["_error"].startswith("invalid_utf8: not valid UTF-8")
    assert rows[1]["_raw"] == "\ufffd\ufffd2"
    assert rows[1]["n"] is None


def test_parse_lines_keeps_order(tmp_path: Path) -> None:
    # The old batches of 4 lines are gone (a task parses its split in one go): only the order is left to check.
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f"{i}\n" for i in range(10)))
    src = FileSource("src", str(tmp_path), parser=_strict_parser, parser_schema=_SCHEMA)
    records, _ = src.read(Split(0, (_task(path),)), {})
    assert records["n"].to_pylist() == list(range(10))


def test_empty_line_range_yields_nothing(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("1\n2\n")
    assert _iter_lines(_task(path, from_line=2)) == []
    assert _read_rows(path, _strict_parser, from_line=2) == []


def test_raw_task_strips_cr_skips_blank_lines_and_flags_bad_utf8(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\n  \n\xc3\x28\n{"b": 2}')
    part = _task(path)
    with open_file("src", part) as handle:
        first, data = owned_lines(handle, part)
    texts, numbers, errors = lines_of(data, first)
    rows = [{"_fidx": part.file_index, "_line": n, "_raw": t, "_error": e} for t, n, e in zip(texts, numbers.tolist(), errors)]
    assert [(r["_fidx"], r["_line"], r["_raw"]) for r in rows] == [
        (0, 1, '{"a": 1}'),
        (0, 4, "\ufffd("),
        (0, 5, '{"b": 2}'),
    ]
    assert rows[0]["_error"] is None and rows[2]["_error"] is None
    assert rows[1]["_error"].startswith("invalid_utf8: not valid UTF-8")


def _lines_one_by_one(data: bytes, first_line: int) -> list[tuple[int, str]]:
    """Independent oracle of a task's non-blank lines: (number, text without one trailing \\r), decoded one by one."""
    out = []
    for number, raw in _expected_lines(data):
        text = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
        if text.strip():
            out.append((number + first_line - 1, text))
    return out


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 4096])
def test_vectorised_raw_task_equals_line_by_line(tmp_path: Path, chunk_bytes: int) -> None:
    """The Arrow lines of every chunking equal the lines taken one by one (the old per-line path is now this oracle)."""
    path = tmp_path / "v.jsonl"
    lines = [f'{{"i": {i}, "pad": "{"x" * (i % 13)}"}}' for i in range(200)]
    lines[17] = "   "  # blank: skipped
    lines[40] = '{"crlf": 1}\r'
    path.write_bytes("\n".join(lines).encode())  # no trailing newline on the last line
    size = path.stat().st_size
    fast, slow = [], []
    for start in range(0, size, chunk_bytes):
        part = _task(path, start, min(size, start + chunk_bytes))
        with open_file("src", part) as handle:
            first, data = owned_lines(handle, part)
        texts, numbers, _ = lines_of(data, first)
        fast += list(zip(numbers.tolist(), texts))
        slow += _lines_one_by_one(data, first)
    assert fast == slow
    assert [n for n, _ in fast] == [n for n in range(1, 201) if n != 18]
    assert (41, '{"crlf": 1}') in fast


@pytest.mark.parametrize("policy", ["next_epoch", "dead_letter", "refuse"])
def test_a_file_landing_behind_the_position_is_handled_by_late_files_never_dropped(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path], policy: str
) -> None:
    from barrierflow.core.errors import BlockedInputError

    write_file("b.jsonl", "1\n")
    write_file("c.jsonl", "2\n3\n")
    src = make_source(max_files_per_epoch=1, max_records_per_epoch=1, late_files=policy)
    first = src.plan(None, None, _count_here)
    second = src.plan(first, None, _count_here)  # inside c.jsonl: line 1 of 2
    assert [r[:3] for r in first["files"] + second["files"]] == [["b.jsonl", 0, None], ["c.jsonl", 0, 1]]
    write_file("a.jsonl", "late\n")  # sorts before the position: never read in name order
    assert src.earliest_arrival_ms(second, None) is not None  # the schedule sees it as input
    if policy == "refuse":
        with pytest.raises(
            BlockedInputError, match="file\\(s\\) 'a.jsonl' landed .* before the stream position 'c.jsonl'.*late_files='refuse'"
        ):
            src.plan(second, None, _count_here)
        return
    third = src.plan(second, None, _count_here)
    if policy == "next_epoch":  # read whole, ahead of the rest of c.jsonl
        assert [r[:3] for r in third["files"]] == [["a.jsonl", 0, None], ["c.jsonl", 1, None]]
        assert "late" not in third
    else:  # set aside as one dead letter, never read
        assert [r[:3] for r in third["files"]] == [["c.jsonl", 1, None]]
        assert third["late"] == [["a.jsonl", 5]]
    assert (third["file"], third["line"], third["consumed"], third["recent"]) == (
        "c.jsonl",
        None,
        3,
        ["a.jsonl", "b.jsonl", "c.jsonl"],
    )
    assert src.plan(third, None, _count_here)["files"] == [] and src.earliest_arrival_ms(third, None) is None  # taken once


def test_backlog_is_what_no_barrier_took_with_the_oldest_arrival(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path]
) -> None:
    from barrierflow.connectors.source import Backlog

    write_file("b.jsonl", "1\n2\n", mtime_ms=1_000)
    write_file("c.jsonl", "3\n", mtime_ms=3_000)
    write_file("d.jsonl", "4\n5\n6\n", mtime_ms=2_000)
    write_file(".e.jsonl", "being written\n", mtime_ms=500)  # not input yet
    src = make_source(max_files_per_epoch=1, max_records_per_epoch=1)
    assert src.backlog(None) == Backlog(3, 4 + 2 + 6, 1_000)
    first = src.plan(None, None, _count_here)  # b.jsonl line 1: b stays waiting (counted whole)
    assert src.backlog(first) == Backlog(3, 12, 1_000)
    second = src.plan(first, None, _count_here)  # the rest of b.jsonl
    assert src.backlog(second) == Backlog(2, 8, 2_000) and src.backlog(second).lag_ms(2_500) == 500
    write_file("a.jsonl", "late\n", mtime_ms=5_000)  # behind the position: waiting too
    assert src.backlog(second) == Backlog(3, 13, 2_000)
    assert Backlog().lag_ms(10) == 0 and Backlog(1, 2, 5) + Backlog(3, 4, None) == Backlog(4, 6, 5)


def test_a_late_file_too_far_behind_to_be_named_is_refused_whatever_the_policy(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path]
) -> None:
    from barrierflow.core.errors import BlockedInputError

    for name in ("b.jsonl", "c.jsonl", "d.jsonl"):
        write_file(name, "1\n")
    src = make_source(late_file_window=2)
    end = src.plan(None, None)
    assert end["recent"] == ["c.jsonl", "d.jsonl"]  # the two largest names read
    write_file("a.jsonl", "late\n")  # behind b.jsonl, the last name no longer remembered
    with pytest.raises(BlockedInputError, match="1 file\\(s\\) too far behind .* last 2 names read"):
        src.plan(end, None)
    # Offsets from before names were kept: the count alone tells a file is late.
    with pytest.raises(BlockedInputError, match="too far behind"):
        src.plan({k: v for k, v in end.items() if k != "recent"}, None)


# -- what the driver does before any byte is read -------------------------------
# The unordered read (Spark's JSON reader with a byte check) is gone: every read
# is a Python task's. What its tests protected still holds: names are never
# patterns, and the driver (planning, splitting) never opens an input file.


@pytest.mark.parametrize("name", ["a[1].jsonl", "a*.jsonl", "a?.jsonl", "a{b}.jsonl", "a\\b.jsonl"])
def test_names_with_glob_characters_are_read_as_themselves(
    make_source: Callable[..., FileSource], write_file: Callable[..., Path], name: str
) -> None:
    """A name is a file, never a pattern that could match another (the old glob test's intent)."""
    write_file(name, ['{"x": 1}'])
    write_file("b.jsonl", ['{"x": 2}'])
    src = make_source(parser=None, parser_schema=None, schema=pa.schema([("x", pa.int64())]), max_files_per_epoch=10)
    end = src.plan(None, None)
    assert sorted(r[0] for r in end["files"]) == sorted([name, "b.jsonl"])
    records, dead = src.read(src.splits(end, 0, None)[0], {})
    by_file = dict(zip([r[0] for r in end["files"]], range(len(end["files"]))))
    _, files, _ = seq_parts(records[SEQ])
    assert sorted(zip(files.tolist(), records["x"].to_pylist())) == sorted([(by_file[name], 1), (by_file["b.jsonl"], 2)])
    assert dead.num_rows == 0


def test_splits_read_no_input_file_on_the_driver(
    monkeypatch: pytest.MonkeyPatch, make_source: Callable[..., FileSource], write_file: Callable[..., Path]
) -> None:
    """Splits come from the barrier's offsets alone: nothing opens an input file (the old unordered-read test's intent)."""
    import builtins

    write_file("a.jsonl", ['{"x": 1}'] * 100)
    write_file("b.jsonl", ['{"x": 2}'])
    src = make_source(parser=None, parser_schema=None, schema=pa.schema([("x", pa.int64())]))
    end = src.plan(None, None)
    real_open = builtins.open

    def no_input_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        assert not str(path).endswith(".jsonl"), f"input file {path} read on the driver"
        return real_open(path, *args, **kwargs)

    def no_arrow(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the driver opened a file system to split")

    monkeypatch.setattr(builtins, "open", no_input_open)
    monkeypatch.setattr(file_source.objects, "open_input", no_arrow)
    monkeypatch.setattr(file_source.objects, "arrow_filesystem", no_arrow)
    for split_bytes in (None, 1, 7, 1000):
        assert sum(p.bytes for p in _parts(src.splits(end, 0, split_bytes))) == sum(r[3] for r in end["files"])


# -- how a line parser's input is cut into Python tasks -----------------------


@pytest.mark.parametrize(
    ("sizes", "split_bytes", "splits"),
    [
        ([10 * 2**20], 5 * 2**20, 2),  # one file: still every core parses
        ([5 * 2**20, 5 * 2**20], int(2.5 * 2**20), 4),
        ([100], 2**20, 1),  # tiny epochs: one task per file, not per byte
        ([400 * 2**20], 16 * 2**20, 25),  # bounded above: a task's bytes stay small
    ],
)
def test_parsing_tasks_split_whole_files_into_split_bytes(
    make_source: Callable[..., FileSource], sizes: list[int], split_bytes: int, splits: int
) -> None:
    """How large a split is is the runner's choice now (the epoch's bytes over its parallelism, within 1-16 MiB): a source cuts by it."""
    ranges: list[list[Any]] = [[f"f{i}.jsonl", 0, None, size] for i, size in enumerate(sizes)]
    got = make_source().splits({"files": ranges}, 0, split_bytes)
    assert len(got) == splits
    assert all(s.bytes <= split_bytes for s in got)
    # A line range (a file split by max_records_per_epoch) is read by one task, whatever its file's size.
    more = make_source().splits({"files": [*ranges, ["g.jsonl", 5, 9, 10 * 2**30]]}, 0, split_bytes)
    assert [(p.from_line, p.to_line, p.byte_end) for p in more[-1].files] == [(5, 9, None)]
    assert len(more) == splits + 1


def test_a_file_changed_after_its_epoch_was_planned_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    planned = _task(path)
    assert [n for n, _ in _iter_lines(planned)] == [1, 2]
    with path.open("ab") as fh:
        fh.write(b'{"a": 3}\n')  # appended after the barrier recorded the file
    src = FileSource("src", str(tmp_path), parser=lambda line: {"value": line}, parser_schema=pa.schema([("value", pa.string())]))
    for read in (lambda t: list(_iter_lines(t)), lambda t: src.read(Split(0, (t,)), {})):
        with pytest.raises(SourceError, match="has 27 bytes, 18 when its epoch was planned"):
            read(planned)
        with pytest.raises(SourceError, match="must never change"):
            read(FileRange(planned.name, planned.uri, planned.size, 0, byte_start=0, byte_end=9))
