"""What is not a record of the pipeline is a dead letter with a reason code, never a coerced or dropped record.

The README's ``clicks`` pipeline (deduplicate by ``event_id``, running totals
per ``user_id``; the README's code itself) runs over lines a producer gets wrong; its totals are
compared with a plain-Python model that keeps only the well-formed records,
and each bad line must come back once in ``dead_letter`` with the reason code
the model gives it. A fuzz test then feeds adversarial bytes to both JSON
Lines paths (a Spark ``schema``, a Python line ``parser``): every non-blank
line is a record or a dead letter, exactly once, and the read never fails;
another feeds Parquet files of wrong schemas, broken bytes and rows with bad
keys (each file whole or each row once).
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from barrierflow import Count, Sum
from barrierflow.api.params import Param
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.connectors import DeltaSink, FileSource, RecordError
from barrierflow.core.columns import SEQ
from barrierflow.operations.query import run_query
from barrierflow.plan.pipeline import PipelineBuilder, pipeline
from readme_example import readme_pipeline

pytestmark = pytest.mark.slow

EVENT_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string()),
        pa.field("user_id", pa.string()),
        pa.field("amount", pa.float64(), nullable=False),
    ]
)


@pipeline("clicks_unordered", params=[Param("landing_dir", str)])
def clicks_unordered(p: PipelineBuilder, params: dict[str, Any]) -> None:
    """Without deduplication: read by Spark's JSON reader first, then again with numbered lines."""
    events = p.source(FileSource("events", params["landing_dir"], schema=EVENT_SCHEMA))
    events.key_by("user_id").aggregate("per_user", Count(), Sum("amount", "total")).sink_to(
        DeltaSink.upsert("user_totals", key="user_id")
    )


# (line, reason code or None for a record). A producer's mistakes, one per line.
LINES: list[tuple[str, str | None]] = [
    ('{"event_id": "a1", "user_id": "u1", "amount": 1.5}', None),
    ("garbage", "not_json"),
    ('{"event_id": "a2", "user_id": "u1"', "not_json"),
    ("[1,2,3]", "not_an_object"),
    ('"a string"', "not_an_object"),
    ("42", "not_an_object"),
    ("{}", "missing_field"),
    ('{"event_id": "b1", "user_id": "u1", "amount": "lots"}', "wrong_type"),
    ('{"event_id": "b2", "user_id": "u2", "amount": true}', "wrong_type"),
    ('{"event_id": "b3", "user_id": "u2", "amount": null}', "missing_field"),
    ('{"event_id": "b4", "user_id": null, "amount": 2}', "null_key"),
    ('{"event_id": "b5", "amount": 2}', "null_key"),
    ('{"event_id": "b6", "user_id": "", "amount": 2}', "empty_key"),
    ('{"event_id": null, "user_id": "u2", "amount": 2}', "null_key"),
    ('{"event_id": "", "user_id": "u2", "amount": 2}', "empty_key"),
    ('{"event_id": "a3", "user_id": "u2", "amount": 4}', None),
    ('{"event_id": "a4", "user_id": "u1", "amount": 2.25, "extra": [1, {"x": 2}]}', None),
    ('{"event_id": "a1", "user_id": "u1", "amount": 100}', None),  # a duplicate: dropped by dedup, not dead
]


# Lines whose only fault is their event_id: records of a pipeline that does not deduplicate by it.
EVENT_ID_FAULTS = {14, 15}


def _reasons(dedup: bool) -> dict[int, str]:
    """Line number -> reason code of every dead letter."""
    return {
        n: reason for n, (_, reason) in enumerate(LINES, start=1) if reason is not None and (dedup or n not in EVENT_ID_FAULTS)
    }


def _totals(dedup: bool) -> dict[str, tuple[int, float]]:
    """The model: well-formed records only (first of each event_id when deduplicating), per user."""
    seen: set[str] = set()
    totals: dict[str, tuple[int, float]] = {}
    dead = _reasons(dedup)
    for n, (text, _) in enumerate(LINES, start=1):
        if n in dead:
            continue
        obj = json.loads(text)
        if dedup and obj["event_id"] in seen:
            continue
        seen.add(obj["event_id"])
        count, total = totals.get(obj["user_id"], (0, 0.0))
        totals[obj["user_id"]] = (count + 1, total + obj["amount"])
    return totals


@pytest.mark.parametrize("variant", ["readme", "unordered-first"])
def test_the_readme_pipeline_dead_letters_each_bad_line_with_its_reason(
    spark: Any, tmp_path: Path, warehouse: str, variant: str
) -> None:
    """The README's own code (its "Declare a pipeline" block), and a variant without deduplication."""
    definition = readme_pipeline(tmp_path / "user_code") if variant == "readme" else clicks_unordered
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "part-0.jsonl").write_text("\n".join(text for text, _ in LINES) + "\n")
    coordinator = CheckpointCoordinator(definition, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark)
    assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [1]

    rows = run_query(warehouse, definition.name, "select user_id, count, total from user_totals").to_pylist()
    dedup = variant == "readme"
    assert {r["user_id"]: (r["count"], r["total"]) for r in rows} == _totals(dedup)
    dead = run_query(warehouse, definition.name, "select line, raw, reason, detail from dead_letter").to_pylist()
    want = {n: (LINES[n - 1][0], reason) for n, reason in _reasons(dedup).items()}
    assert {r["line"]: (r["raw"], r["reason"]) for r in dead} == want
    assert all(r["detail"] for r in dead)
    details = {r["line"]: r["detail"] for r in dead}
    assert details[8] == "amount: lots is not double"
    assert details[11] == "key user_id of operator per_user is missing or null"
    if dedup:
        assert details[14] == "key event_id of operator dedup is missing or null"
    by_reason = run_query(warehouse, definition.name, "select reason, count(*) as n from dead_letter group by reason")
    assert {r["reason"]: r["n"] for r in by_reason.to_pylist()} == {
        reason: list(_reasons(dedup).values()).count(reason) for reason in set(_reasons(dedup).values())
    }


def _adversarial_line(rng: random.Random) -> bytes:
    good = {"event_id": f"e{rng.randrange(10**6)}", "user_id": rng.choice(["u1", "u2", ""]), "amount": rng.uniform(-5, 5)}
    text = json.dumps(good)
    kind = rng.randrange(12)
    if kind == 0:
        return text.encode()[: rng.randrange(1, len(text))]  # truncated
    if kind == 1:
        raw = bytearray(text.encode())
        raw[rng.randrange(len(raw))] = rng.choice([0xFF, 0xC0, 0x80, 0xED])  # invalid UTF-8
        return bytes(raw)
    if kind == 2:
        return text.encode().replace(b'"u', b'"\x00u', 1)  # a NUL byte
    if kind == 3:
        return json.dumps({**good, "pad": "x" * rng.choice([10_000, 300_000])}).encode()  # huge line
    if kind == 4:
        depth = rng.choice([5, 200, 2_000])
        return (text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}").encode()  # deep nesting
    if kind == 5:
        return (text[:-1] + f', "amount": {rng.choice(["1", chr(34) + "x" + chr(34), "null"])}}}').encode()  # duplicate key
    if kind == 6:
        return text.replace(str(good["amount"]), rng.choice(["1e400", "-1e400", "9" * 400, "NaN", "Infinity"])).encode()
    if kind == 7:
        return rng.choice([b"[]", b"{}", b"null", b"true", b'"s"', b"[{}]", b"\xef\xbb\xbf" + text.encode()])
    if kind == 8:  # noise (never a line break or a blank line)
        return b"~" + bytes(rng.choice([*range(0x20, 0x7F), *range(0x80, 0x100)]) for _ in range(rng.randrange(40)))
    if kind == 9:
        return b"  \t  "  # blank: neither a record nor a dead letter
    return text.encode() + (b"\r" if kind == 10 else b"")


def _read(source: FileSource, end: dict[str, Any], keys: dict[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The records and dead letters of a planned range, as the epoch's tasks read them (here in splits of 4 KiB)."""
    records: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    for split in source.splits(end, 0, 4096):
        good, bad = source.read(split, keys)
        records += good.to_pylist()
        dead += bad.to_pylist()
    return records, dead


@pytest.mark.parametrize("path", ["schema", "parser"])
def test_fuzzed_lines_are_each_a_record_or_a_dead_letter_exactly_once(tmp_path: Path, path: str) -> None:
    rng = random.Random(20261126)
    landing = tmp_path / "landing"
    landing.mkdir()
    expected: set[tuple[str, int]] = set()
    for f in range(3):
        lines = [_adversarial_line(rng) for _ in range(150)]
        name = f"part-{f}.jsonl"
        (landing / name).write_bytes(b"\n".join(lines) + rng.choice([b"", b"\n"]))
        for number, raw in enumerate(lines, start=1):
            try:
                blank = not raw.decode("utf-8").removesuffix("\r").strip()
            except UnicodeDecodeError:
                blank = False
            if not blank:
                expected.add((name, number))

    def parse_event(line: str) -> dict[str, Any]:
        """A lenient line parser (the Python path's counterpart of ``EVENT_SCHEMA``): the schema checks the rest.

        Defined here, as a user's function is: shipped by value to the executors.
        """
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise RecordError(f"not JSON: {exc}"[:200]) from None
        if not isinstance(obj, dict):
            raise RecordError("not an object")
        return {"event_id": obj.get("event_id"), "user_id": obj.get("user_id"), "amount": obj.get("amount")}

    if path == "schema":
        source = FileSource("events", str(landing), schema=EVENT_SCHEMA, max_files_per_epoch=3)
    else:
        source = FileSource("events", str(landing), parser=parse_event, parser_schema=EVENT_SCHEMA, max_files_per_epoch=3)
    end = source.plan(None, None)
    keys = {"event_id": "dedup", "user_id": "per_user"}
    records, dead = _read(source, end, keys)
    names = [name for name, *_ in end["files"]]
    got_records = [(names[(r[SEQ] >> 36) & (2**20 - 1)], r[SEQ] & (2**36 - 1)) for r in records]
    got_dead = [(r["source_file"], r["line"]) for r in dead]
    # Each line once, as one or the other.
    assert len(got_records) == len(set(got_records)) and len(got_dead) == len(set(got_dead))
    assert set(got_records).isdisjoint(got_dead)
    assert set(got_records) | set(got_dead) == expected
    # Records are records of the schema: keys present and non-empty, amount a number.
    assert all(r["event_id"] and r["user_id"] and r["amount"] is not None for r in records)
    assert {r["reason"] for r in dead} <= {
        "invalid_utf8", "not_json", "not_an_object", "wrong_type", "missing_field", "null_key", "empty_key",
        "invalid_record", "parser_failed",
    }  # fmt: skip
    assert all(r["detail"] and r["raw"] is not None for r in dead)


def _parquet_bytes(table: pa.Table, **kw: Any) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **kw)
    return buffer.getvalue()


def test_fuzzed_parquet_files_are_each_read_or_dead_lettered_whole_exactly_once(store_root: str) -> None:
    """Parquet landing files a producer gets wrong: each row is a record or a dead letter, each bad file one dead letter.

    From a local directory and from S3: tasks read either through pyarrow's file systems.
    """
    from barrierflow.storage import objects

    rng = random.Random(20261126)
    landing = f"{store_root}/landing"

    def rows(n: int, **types: pa.DataType) -> pa.Table:
        values = {
            "event_id": [rng.choice([f"e{i}", None, ""]) for i in range(n)],
            "user_id": [rng.choice(["u1", "u2", "", None, "\x00", "ü" * 3]) for _ in range(n)],
            "amount": [rng.choice([1.5, -2.0, float("nan"), float("inf"), 1e308, None]) for _ in range(n)],
        }
        schema = pa.schema([pa.field(k, types.get(k, EVENT_SCHEMA.field(k).type)) for k in values])
        if "amount" in types:  # values that the narrower type holds
            values["amount"] = [None if v is None else rng.randrange(0, 100) for v in values["amount"]]
        return pa.table(values, schema=schema)

    good = _parquet_bytes(rows(300), row_group_size=64)
    files: dict[str, bytes | None] = {  # content, and None where the whole file is refused
        "a-good.parquet": good,
        "b-narrower-types.parquet": _parquet_bytes(rows(40, amount=pa.int32())),
        "c-extra-column.parquet": _parquet_bytes(rows(20).append_column("extra", pa.array([[1, 2]] * 20))),
        "d-no-event-id.parquet": _parquet_bytes(rows(10).drop_columns(["event_id"])),  # nullable: read as null
        "e-amount-as-text.parquet": _parquet_bytes(rows(10).set_column(2, "amount", pa.array(["1.5"] * 10))),
        "f-no-amount.parquet": _parquet_bytes(rows(10).drop_columns(["amount"])),
        "g-unsigned.parquet": _parquet_bytes(rows(10, amount=pa.uint64())),
        "h-truncated.parquet": good[: rng.randrange(10, len(good) - 10)],
        "i-noise.parquet": bytes(rng.randrange(256) for _ in range(500)),
        "j-empty.parquet": b"",
        "k-footer-only-magic.parquet": b"PAR1" + bytes(40) + b"PAR1",
    }
    refused = {"e-amount-as-text.parquet", "f-no-amount.parquet", "g-unsigned.parquet", "h-truncated.parquet",
               "i-noise.parquet", "j-empty.parquet", "k-footer-only-magic.parquet"}  # fmt: skip
    for name, content in files.items():
        assert objects.put_if_absent(objects.join_uri(landing, name), content or b"")

    source = FileSource("events", landing, format="parquet", schema=EVENT_SCHEMA, max_files_per_epoch=20)
    end = source.plan(None, None)
    records, dead = _read(source, end, {"event_id": "dedup", "user_id": "per_user"})
    names = [name for name, *_ in end["files"]]
    assert names == sorted(files)

    # Each bad file once, whole, with the reason; nothing of it among the records.
    whole = {r["source_file"]: r for r in dead if r["line"] is None}
    assert set(whole) == refused
    assert {whole[n]["reason"] for n in ("e-amount-as-text.parquet", "f-no-amount.parquet", "g-unsigned.parquet")} == {
        "incompatible_schema"
    }
    assert whole["e-amount-as-text.parquet"]["detail"] == "column amount is string, not double"
    assert whole["f-no-amount.parquet"]["detail"] == "column amount (double) is missing"
    assert all(whole[n]["reason"] == "unreadable_file" for n in refused if n[0] in "hijk")
    # Each row of the other files once, as a record or a dead letter, by a plain-Python reference.
    expected_records, expected_dead = set(), {}
    for name in sorted(set(files) - refused):
        table = pq.read_table(pa.BufferReader(files[name]))
        for line, row in enumerate(table.to_pylist(), start=1):
            if row.get("amount") is None:
                expected_dead[name, line] = "missing_field"
            elif row.get("event_id") is None:
                expected_dead[name, line] = "null_key"
            elif row["event_id"] == "":
                expected_dead[name, line] = "empty_key"
            elif row["user_id"] is None:
                expected_dead[name, line] = "null_key"
            elif row["user_id"] == "":
                expected_dead[name, line] = "empty_key"
            else:
                expected_records.add((name, line, row["event_id"], row["user_id"], float(row["amount"])))
    # The reference meets every case: widened, extra-column and key-less rows, each row check.
    assert {"a-good.parquet", "b-narrower-types.parquet", "c-extra-column.parquet"} <= {r[0] for r in expected_records}
    assert set(expected_dead.values()) == {"missing_field", "null_key", "empty_key"}
    got_records = [
        (names[(r[SEQ] >> 36) & (2**20 - 1)], r[SEQ] & (2**36 - 1), r["event_id"], r["user_id"], r["amount"]) for r in records
    ]
    got_dead = {(r["source_file"], r["line"]): r["reason"] for r in dead if r["line"] is not None}
    assert len(got_dead) == len(dead) - len(whole)
    # NaN never equals itself: compare its text.
    assert sorted(map(repr, got_records)) == sorted(map(repr, expected_records))
    assert got_dead == expected_dead
    assert all(r["detail"] and r["raw"] for r in dead if r["line"] is not None)
