"""The stream API on real Spark and Delta: filter, select, map and flat_map (SQL and Python) and keyword aggregates.

A pipeline splits texts into sentences (a SQL flat_map) and words (a Python
flat_map), filters, maps and aggregates them, and keeps the first use of
each word (a deduplication after two flat_maps: which sentence a word was
first used in depends on the outputs' positions) and its last use (an upsert
sink, which keeps a key's last row in arrival order, the same positions). Two epochs at parallelism
2, and the same input in one epoch at parallelism 1, must both equal a
plain-Python reference. Then Python functions
that raise or return the wrong rows fail their epoch with an error naming
the operator, and nothing is committed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import barrierflow as bf
from barrierflow.checkpointing.coordinator import CheckpointCoordinator

EVENTS = pa.schema([("user", pa.string()), ("text", pa.string()), pa.field("amount", pa.float64(), nullable=False)])
WORDS = pa.schema([("user", pa.string()), ("sentence", pa.string()), ("word", pa.string()), ("cents", pa.int64())])
LOUD = pa.schema([("word", pa.string()), ("user", pa.string()), ("sentence", pa.string()), ("loud", pa.string())])

# Two epochs' files. "x" is first used in the second sentence of u1's first record, after "y x";
# "dup dup" and "w" repeat inside one record; a null text and a negative amount yield nothing.
FILES = [
    {
        "a.jsonl": [
            {"user": "u1", "text": "y x. x z. q", "amount": 1.25},
            {"user": "u2", "text": "z skip w. w", "amount": 2.5},
            {"user": "u2", "text": "neg", "amount": -1.0},
        ],
        "b.jsonl": [{"user": "u3", "text": None, "amount": 3.0}, {"user": "u3", "text": "dup dup.", "amount": 0.75}],
    },
    {"c.jsonl": [{"user": "u1", "text": "new. y", "amount": 10.0}, {"user": "u4", "text": "w new2", "amount": 0.0}]},
]


def split_words(batch: pa.RecordBatch) -> list[list[dict[str, Any]]]:
    """Python flat_map: each sentence's words."""
    assert not any(name.startswith("_") for name in batch.schema.names)  # engine columns stay outside
    return [
        [{"user": u, "sentence": s, "word": w, "cents": c} for w in s.split()]
        for u, s, c in zip(batch["user"].to_pylist(), batch["sentence"].to_pylist(), batch["cents"].to_pylist())
    ]


def not_skipped(batch: pa.RecordBatch) -> pa.Array:
    return pc.not_equal(batch["word"], "skip")


def shout(batch: pa.RecordBatch) -> pa.Table:
    """Python map: one row per record, columns in another order than declared (allowed)."""
    return pa.table(
        {"loud": pc.utf8_upper(batch["word"]), "word": batch["word"], "user": batch["user"], "sentence": batch["sentence"]}
    )


@bf.pipeline("stream_api", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
def stream_api(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS))
    words = (
        events.filter("amount >= 0")
        .map(cents="cast(round(amount * 100) as long)")
        .flat_map(sentence="split(text, '[.]')")
        .flat_map(split_words, schema=WORDS)
        .filter(not_skipped)
        .map(letters="length(word)")
    )
    words.key_by("user").aggregate("per_user", words=bf.Count(), cents=bf.Sum("cents"), letters=bf.Sum("letters")).sink_to(
        bf.DeltaSink.upsert("user_totals", key="user")
    )
    words.select("word", "user", "sentence").sink_to(bf.DeltaSink.upsert("last_uses", key="word"))
    words.deduplicate("first_use", key="word").map(shout, schema=LOUD).select("word", "user", "sentence", "loud").sink_to(
        bf.DeltaSink.append("first_uses")
    )


def reference(
    epochs: list[dict[str, list[dict[str, Any]]]],
) -> tuple[dict[str, tuple[int, float, float]], list[tuple[str, ...]], dict[str, tuple[str, str]]]:
    """Plain Python: records in arrival order (files by name, lines in order), as Spark's split and Python's str.split see them."""
    totals: dict[str, tuple[int, float, float]] = {}
    first: list[tuple[str, ...]] = []
    last: dict[str, tuple[str, str]] = {}
    for files in epochs:
        for name in sorted(files):
            for record in files[name]:
                if record["amount"] < 0 or record["text"] is None:
                    continue
                cents = int(record["amount"] * 100)
                for sentence in re.split(r"[.]", record["text"]):
                    for word in sentence.split():
                        if word == "skip":
                            continue
                        n, c, letters = totals.get(record["user"], (0, 0.0, 0.0))
                        totals[record["user"]] = (n + 1, c + cents, letters + len(word))
                        if all(row[0] != word for row in first):
                            first.append((word, record["user"], sentence, word.upper()))
                        last[word] = (record["user"], sentence)
    return totals, sorted(first), last


def _land(landing: Path, files: dict[str, list[dict[str, Any]]]) -> None:
    for name, records in files.items():
        (landing / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_stateless_operators_and_keyword_aggregates_match_the_reference_at_any_parallelism(
    spark: Any, tmp_path: Path, store_root: str
) -> None:
    """Two epochs at parallelism 2, and the same input as one epoch at parallelism 1 (three epochs keep CI time down)."""
    totals, first, last = reference(FILES)
    assert first[0] == ("dup", "u3", "dup dup", "DUP") and ("x", "u1", "y x", "X") in first  # the data covers the cases
    assert last["x"] == ("u1", " x z") and last["w"] == ("u4", "w new2")  # a later sentence of one record; a later epoch
    for parallelism, epochs in ((2, FILES), (1, [{name: rows for files in FILES for name, rows in files.items()}])):
        landing, warehouse = tmp_path / f"landing{parallelism}", f"{store_root}/wh{parallelism}"
        landing.mkdir()
        params = {"landing_dir": str(landing), "parallelism": parallelism}
        for files in epochs:
            _land(landing, files)
            coordinator = CheckpointCoordinator(stream_api, params, warehouse, spark_factory=lambda: spark)
            assert len(coordinator.run(until_caught_up=True)) == 1
        got = bf.run_query(warehouse, "stream_api", "select * from user_totals").to_pylist()
        assert {r["user"]: (r["words"], r["cents"], r["letters"]) for r in got} == totals
        uses = bf.run_query(warehouse, "stream_api", "select * from first_uses").to_pylist()
        assert sorted((r["word"], r["user"], r["sentence"], r["loud"]) for r in uses) == first
        latest = bf.run_query(warehouse, "stream_api", "select * from last_uses").to_pylist()
        assert {r["word"]: (r["user"], r["sentence"]) for r in latest} == last and len(latest) == len(last)
        columns = bf.run_query(warehouse, "stream_api", "select * from first_uses limit 0").column_names
        assert columns[:4] == ["word", "user", "sentence", "loud"] and not [c for c in columns if c.startswith("_seq_")]
        assert {r["_epoch"] for r in uses if r["word"] in ("new", "new2")} == {len(epochs)}


def _broken(batch: pa.RecordBatch) -> Any:
    raise ZeroDivisionError("no amounts today")


def test_a_bad_python_function_fails_the_epoch_naming_the_operator(spark: Any, tmp_path: Path, warehouse: str) -> None:
    message = r"MapFunction map-1 \(_broken\) raised ZeroDivisionError: no amounts today"

    @bf.pipeline("bad_map", params=[bf.Param("landing_dir", str)])
    def bad_map(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS))
        events.map(_broken, schema=pa.schema([("user", pa.string())])).sink_to(bf.DeltaSink.append("out"))

    landing = tmp_path / "landing"
    landing.mkdir()
    _land(landing, FILES[1])
    coordinator = CheckpointCoordinator(bad_map, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark)
    with pytest.raises(Exception, match=message):
        coordinator.run(until_caught_up=True)
    assert coordinator.recover().last_completed_epoch == 0  # nothing committed


# Keys computed by a map: the first word of the text. A null text gives a null key, a text
# starting with a space (or empty) an empty one; both must be dead letters, never a NULL or "" group.
KEYED_FILES = {
    "a.jsonl": [
        {"user": "u1", "text": "y x", "amount": 1.0},
        {"user": "u2", "text": None, "amount": 2.0},
        {"user": "u3", "text": " lead", "amount": 3.0},
        {"user": "u1", "text": "y z", "amount": 4.0},
    ],
    "b.jsonl": [{"user": "u4", "text": "z", "amount": 5.0}, {"user": "u5", "text": "", "amount": 6.0}],
    "c.jsonl": [{"user": "u6", "text": None, "amount": 7.0}, {"user": "u1", "text": "z y", "amount": 8.0}],
}


@bf.pipeline("computed_keys", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
def computed_keys(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    """Only a running aggregate consumes the source: read unordered first, without line numbers."""
    events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS))
    events.map(topic="element_at(split(text, ' '), 1)").key_by("topic").aggregate("per_topic", n=bf.Count()).sink_to(
        bf.DeltaSink.upsert("topics", key="topic")
    )


def test_null_or_empty_keys_computed_by_a_map_are_dead_letters_with_file_and_line(
    spark: Any, tmp_path: Path, warehouse: str
) -> None:
    """One epoch: its unordered read meets bad keys without line numbers, so it is computed again with ordered reads."""
    counts: dict[str, int] = {}
    dead: list[tuple[str, int, dict[str, Any], str]] = []
    for name in sorted(KEYED_FILES):
        for line, record in enumerate(KEYED_FILES[name], start=1):
            topic = None if record["text"] is None else record["text"].split(" ")[0]
            if topic:
                counts[topic] = counts.get(topic, 0) + 1
            else:
                row = {k: v for k, v in {**record, "topic": topic}.items() if v is not None}  # to_json leaves out nulls
                dead.append((name, line, row, "null_key" if topic is None else "empty_key"))
    assert {d[3] for d in dead} == {"null_key", "empty_key"} and counts == {"y": 2, "z": 2}  # the data covers the cases
    landing = tmp_path / "landing"
    landing.mkdir()
    _land(landing, KEYED_FILES)
    coordinator = CheckpointCoordinator(computed_keys, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark)
    (result,) = coordinator.run(until_caught_up=True)
    # Rows read from the source are unchanged; the refused ones count as dead letters.
    assert (result.record.rows_in, result.record.dead_letters) == (8, len(dead))
    got = bf.run_query(warehouse, "computed_keys", "select * from topics").to_pylist()
    assert {r["topic"]: r["n"] for r in got} == counts and len(got) == len(counts)
    letters = bf.run_query(warehouse, "computed_keys", "select * from dead_letter").to_pylist()
    assert sorted((r["source_file"], r["line"], json.loads(r["raw"]), r["reason"]) for r in letters) == dead
    assert {(r["source"], r["_epoch"]) for r in letters} == {("events", 1)}
    for r in letters:
        what = "is missing or null" if r["reason"] == "null_key" else "is empty"
        assert r["detail"] == f"key topic of operator per_topic {what} (computed by map-1)", r["detail"]
