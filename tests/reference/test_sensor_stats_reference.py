"""Tests of the reference oracle (hand-computed expectations) and of datagen."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from datetime import datetime, timedelta, timezone

import pytest

from barrierflow.demo.datagen import (
    MALFORMED_KINDS,
    SensorStreamSpec,
    generate_sensor_lines,
    write_sensor_files,
)

from .sensor_stats_reference import (
    nearest_rank,
    read_lines,
    run_reference,
    run_reference_on_dir,
    split_epochs,
    validate_line,
)

__all__: list[str] = []

UTC = timezone.utc


def t(minute: int, second: int = 0, micro: int = 0) -> datetime:
    """2024-01-01T00:<minute>:<second>.<micro>Z."""
    return datetime(2024, 1, 1, 0, minute, second, micro, tzinfo=UTC)


def rec(event_id: str, sensor_id: str, ts: object, temperature: object) -> str:
    return json.dumps({"event_id": event_id, "sensor_id": sensor_id, "ts": ts, "temperature": temperature})


def iso(minute: int, second: int = 0) -> str:
    return f"2024-01-01T00:{minute:02d}:{second:02d}Z"


def write(directory: pathlib.Path, name: str, lines: list[str]) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    return path


# --------------------------------------------------------------------------- lines


def test_read_lines_splits_on_newline_strips_cr_and_keeps_unterminated_last(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"a\r\n\nb\rc\r\nlast")
    assert read_lines(path) == [b"a", b"", b"b\rc", b"last"]
    path.write_bytes(b"a\n")
    assert read_lines(path) == [b"a"]  # no empty line after a final newline
    path.write_bytes(b"")
    assert read_lines(path) == []


def test_each_dead_letter_rule(tmp_path: pathlib.Path) -> None:
    ok = {"event_id": "e", "sensor_id": "s", "ts": "2024-01-01T00:00:00Z", "temperature": 20}

    def variant(**changes: object) -> str:
        obj = {**ok, **changes}
        return json.dumps({k: v for k, v in obj.items() if v is not DROP})

    DROP = object()
    huge = "1" + "0" * 400
    cases: list[tuple[bytes, str]] = [
        (b"not json at all", "invalid_json"),
        (b'{"event_id": "e", "sensor_id"', "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b"42", "not_an_object"),
        (b'"a string"', "not_an_object"),
        (b"null", "not_an_object"),
        (variant(event_id=DROP).encode(), "missing_event_id"),
        (variant(event_id="").encode(), "empty_event_id"),
        (variant(event_id=5).encode(), "invalid_event_id"),
        (variant(sensor_id=DROP).encode(), "missing_sensor_id"),
        (variant(sensor_id="").encode(), "empty_sensor_id"),
        (variant(sensor_id=None).encode(), "missing_sensor_id"),
        (variant(ts=DROP).encode(), "missing_ts"),
        (variant(ts="2024-01-01T00:00:00").encode(), "naive_ts"),
        (variant(ts=1704067200000.0).encode(), "invalid_ts_type"),
        (variant(ts=True).encode(), "invalid_ts_type"),
        (variant(ts=None).encode(), "missing_ts"),
        (variant(ts="garbage").encode(), "unparseable_ts"),
        (variant(ts=10**20).encode(), "ts_out_of_range"),
        (variant(ts="0001-01-01T00:00:00+01:00").encode(), "ts_out_of_range"),
        (variant(temperature="21.5").encode(), "invalid_temperature_type"),
        (variant(temperature=True).encode(), "invalid_temperature_type"),
        (variant(temperature=None).encode(), "missing_temperature"),
        (variant(temperature=DROP).encode(), "missing_temperature"),
        (b'{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": NaN}', "non_finite_temperature"),
        (b'{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": Infinity}', "non_finite_temperature"),
        (b'{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": -Infinity}', "non_finite_temperature"),
        (b'{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": 1e400}', "non_finite_temperature"),
        (
            b'{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": ' + huge.encode() + b"}",
            "temperature_out_of_range",
        ),
        (b'{"event_id": "\xff", "sensor_id": "s"}', "invalid_utf8"),
    ]
    for raw, reason in cases:
        assert validate_line(raw) == reason, raw

    # The same lines in one file, with blank lines and CRLF around them.
    body = b"\n".join([b"", b"   ", b"\t"] + [raw for raw, _ in cases]) + b"\r\n"
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "f.jsonl").write_bytes(body)
    result = run_reference_on_dir(landing, 10)
    assert [(d["line"], d["reason"]) for d in result.dead_letter] == [(i + 4, reason) for i, (_, reason) in enumerate(cases)]
    assert all(d["source_file"] == "f.jsonl" and d["epoch"] == 1 for d in result.dead_letter)
    assert result.dead_letter[0]["raw"] == "not json at all"
    assert result.dead_letter[-1]["raw"] == '{"event_id": "\ufffd", "sensor_id": "s"}'  # no "\r"
    assert result.blank_counts == {1: 3}
    assert result.valid_counts == {1: 0}
    assert result.watermarks == {1: None}
    assert result.sensor_totals == {} and result.sensor_minute == [] and result.alerts == []


def test_valid_ts_forms_are_normalised_to_utc() -> None:
    cases = [
        ("2024-01-01T02:00:30.5+02:00", t(0, 30, 500_000)),
        ("2024-01-01T00:00:30.123456Z", t(0, 30, 123_456)),
        ("2023-12-31T19:00:00-05:00", t(0)),
        ("2024-01-01T00:01:00+00:00", t(1)),
        (1704067200123, t(0, 0, 123_000)),
        (1704067260000, t(1)),
    ]
    for ts, expected in cases:
        reading = validate_line(rec("e", "s", ts, 1).encode())
        assert not isinstance(reading, str) and reading is not None
        assert reading.ts == expected and reading.ts.utcoffset() == timedelta(0)
        assert reading.temperature == 1.0 and isinstance(reading.temperature, float)


def test_extra_fields_ignored_and_key_order_irrelevant() -> None:
    line = '{"temperature": 21.5, "unit": "C", "ts": 0, "meta": {"a": [1]}, "sensor_id": "s", "event_id": "e"}'
    reading = validate_line(line.encode())
    assert reading is not None and not isinstance(reading, str)
    assert (reading.event_id, reading.sensor_id, reading.temperature) == ("e", "s", 21.5)
    assert reading.ts == datetime(1970, 1, 1, tzinfo=UTC)


# --------------------------------------------------------------------------- epochs


def test_split_epochs_ignores_in_progress_and_other_files(tmp_path: pathlib.Path) -> None:
    for name in ["b.jsonl", "a.jsonl", ".a.jsonl.tmp", ".c.jsonl", "_d.jsonl", "e.txt", "f.jsonl"]:
        (tmp_path / name).write_text("")
    (tmp_path / "g.jsonl").mkdir()  # a directory is not a file
    assert split_epochs(tmp_path, 2) == [
        [tmp_path / "a.jsonl", tmp_path / "b.jsonl"],
        [tmp_path / "f.jsonl"],
    ]
    assert split_epochs(tmp_path, 5) == [[tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "f.jsonl"]]
    assert split_epochs(tmp_path / "missing", 1) == []
    with pytest.raises(ValueError):
        split_epochs(tmp_path, 0)


def test_dedup_within_and_across_epochs(tmp_path: pathlib.Path) -> None:
    a = write(
        tmp_path,
        "a.jsonl",
        [
            rec("e1", "s1", iso(0, 10), 20.0),
            rec("e1", "s1", iso(0, 11), 99.0),  # duplicate, different values: dropped
            rec("e3", "s1", iso(0, 12), float("nan")),  # dead-lettered: does not claim e3
        ],
    )
    b = write(
        tmp_path,
        "b.jsonl",
        [
            rec("e1", "s2", iso(0, 20), -5.0),  # duplicate of an earlier epoch: dropped
            rec("e2", "s1", iso(0, 30), 21.0),
            rec("e3", "s1", iso(0, 40), 22.5),  # first *valid* e3: kept
            rec("e2", "s1", iso(0, 50), 21.0),  # exact duplicate: dropped
        ],
    )
    result = run_reference([[a], [b]])
    assert result.valid_counts == {1: 1, 2: 2}
    assert result.duplicate_counts == {1: 1, 2: 2}
    assert [d["line"] for d in result.dead_letter] == [3]
    assert result.sensor_totals == {"s1": {"count": 3, "sum": 63.5, "min": 20.0, "max": 22.5}}
    # 20.0 < 21.0 < 22.5 across the epoch boundary
    assert [(x["event_id"], x["epoch"]) for x in result.alerts] == [("e3", 2)]


def test_watermark_lateness_and_window_firing(tmp_path: pathlib.Path) -> None:
    e1 = write(
        tmp_path,
        "1.jsonl",
        [
            rec("a", "s1", iso(0, 10), 10.0),
            rec("b", "s1", "2023-12-31T23:50:00Z", 1.0),  # old, but W(0) is None: not late
            rec("c", "s1", iso(5, 0), 50.0),
        ],
    )
    e2 = write(
        tmp_path,
        "2.jsonl",
        [
            rec("d", "s1", iso(3, 59), 39.0),  # window end 00:04 <= W(1)=00:04:30: late
            rec("e", "s1", iso(4, 10), 41.0),  # window end 00:05 > 00:04:30: on time
            rec("f", "s1", iso(5, 40), 54.0),
        ],
    )
    e3 = write(
        tmp_path,
        "3.jsonl",
        [
            rec("g", "s1", iso(4, 50), 48.0),  # its window fired in epoch 2: late
            rec("h", "s1", iso(6, 31), 61.0),
        ],
    )
    e4 = write(tmp_path, "4.jsonl", ["", "  "])  # no records: watermark holds
    result = run_reference([[e1], [e2], [e3], [e4]])

    assert result.watermarks == {1: t(4, 30), 2: t(5, 10), 3: t(6, 1), 4: t(6, 1)}
    assert [(x["event_id"], x["epoch"], x["ts"], x["temperature"]) for x in result.late_readings] == [
        ("d", 2, t(3, 59), 39.0),
        ("g", 3, t(4, 50), 48.0),
    ]
    summary = [(w["epoch"], w["window_start"], w["window_end"], w["count"], w["avg"]) for w in result.sensor_minute]
    assert summary == [
        (1, datetime(2023, 12, 31, 23, 50, tzinfo=UTC), datetime(2023, 12, 31, 23, 51, tzinfo=UTC), 1, 1.0),
        (1, t(0), t(1), 1, 10.0),
        (2, t(4), t(5), 1, 41.0),
        (3, t(5), t(6), 2, 52.0),
    ]
    assert list(result.open_windows) == [("s1", t(6))]
    # Late readings still count in the totals.
    assert result.sensor_totals["s1"] == {"count": 8, "sum": 304.0, "min": 1.0, "max": 61.0}


def test_no_watermark_until_first_valid_record(tmp_path: pathlib.Path) -> None:
    e1 = write(tmp_path, "1.jsonl", ["garbage", ""])
    e2 = write(tmp_path, "2.jsonl", [rec("a", "s", iso(10), 1.0)])
    e3 = write(tmp_path, "3.jsonl", [rec("b", "s", iso(0), 2.0)])  # end 00:01 <= W(2)=00:09:30
    result = run_reference([[e1], [e2], [e3]])
    assert result.watermarks == {1: None, 2: t(9, 30), 3: t(9, 30)}
    assert [x["event_id"] for x in result.late_readings] == ["b"]
    assert result.sensor_minute == []  # window [00:10, 00:11) is still open


def test_out_of_orderness_parameter(tmp_path: pathlib.Path) -> None:
    e1 = write(tmp_path, "1.jsonl", [rec("a", "s", iso(2, 0), 1.0)])
    e2 = write(tmp_path, "2.jsonl", [rec("b", "s", iso(0, 30), 2.0)])
    # lag 0: W(1)=00:02, window [00:00,00:01) is late; lag 90 s: W(1)=00:00:30, not late.
    assert [x["event_id"] for x in run_reference([[e1], [e2]], 0).late_readings] == ["b"]
    relaxed = run_reference([[e1], [e2]], 90)
    assert relaxed.late_readings == [] and relaxed.watermarks == {1: t(0, 30), 2: t(0, 30)}


def test_window_percentiles_and_ordering(tmp_path: pathlib.Path) -> None:
    f = write(
        tmp_path,
        "f.jsonl",
        [
            rec("1", "s2", iso(0, 1), 22.0),
            rec("2", "s2", iso(0, 2), 20),  # an int temperature
            rec("3", "s2", iso(0, 3), 23.0),
            rec("4", "s2", iso(0, 4), 21.0),
            rec("5", "s1", iso(1, 0), 7.5),
            rec("6", "s1", iso(0, 59), 5.0),
            rec("7", "s1", iso(3, 0), 0.0),  # W(1) = 00:02:30 fires windows ending <= that
        ],
    )
    result = run_reference([[f]])
    rows = [(w["sensor_id"], w["window_start"], w["count"], w["avg"], w["p75"], w["p99"]) for w in result.sensor_minute]
    assert rows == [
        ("s1", t(0), 1, 5.0, 5.0, 5.0),
        ("s1", t(1), 1, 7.5, 7.5, 7.5),
        # sorted 20, 21, 22, 23: p75 is the 3rd, p99 the 4th
        ("s2", t(0), 4, 21.5, 22.0, 23.0),
    ]
    assert all(isinstance(w["p75"], float) for w in result.sensor_minute)


def test_nearest_rank_positions() -> None:
    assert nearest_rank([1.0], 75) == 1.0 and nearest_rank([1.0], 99) == 1.0
    assert nearest_rank([1.0, 2.0], 75) == 2.0  # ceil(1.5) = 2
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], 75) == 3.0
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert nearest_rank([1.0, 2.0, 3.0, 4.0, 5.0], 75) == 4.0  # ceil(3.75) = 4
    hundred = [float(i) for i in range(1, 101)]
    assert nearest_rank(hundred, 75) == 75.0 and nearest_rank(hundred, 99) == 99.0
    assert nearest_rank([float(i) for i in range(1, 201)], 99) == 198.0


def test_alerts_on_rising_triples_across_epochs(tmp_path: pathlib.Path) -> None:
    e1 = write(
        tmp_path,
        "1.jsonl",
        [
            rec("a1", "s1", iso(10), 20.0),
            rec("b1", "s2", iso(10, 1), 30.0),
            rec("a2", "s1", iso(10, 2), 21.0),
            rec("b2", "s2", iso(10, 3), 31.0),
        ],
    )
    e2 = write(
        tmp_path,
        "2.jsonl",
        [
            rec("a3", "s1", iso(10, 4), 22.0),  # 20 < 21 < 22: alert (epoch 2)
            rec("a4", "s1", iso(0, 5), 23.0),  # late, still counts: 21 < 22 < 23
            rec("a5", "s1", iso(10, 6), 23.0),  # equal: no alert
            rec("b3", "s2", iso(10, 7), 30.5),  # s2 fell: no alert
            rec("a6", "s1", iso(10, 8), 24.0),  # 23 == 23: no alert
            rec("a7", "s1", iso(10, 9), 25),  # 23 < 24 < 25: alert
            rec("a7", "s1", iso(10, 9), 26.0),  # duplicate: ignored entirely
            rec("b4", "s2", iso(10, 10), 31.0),
            rec("b5", "s2", iso(10, 11), 31.5),  # 30.5 < 31 < 31.5: alert
        ],
    )
    result = run_reference([[e1], [e2]])
    assert [x["event_id"] for x in result.late_readings] == ["a4"]
    assert [(x["sensor_id"], x["event_id"], x["temperature"], x["epoch"]) for x in result.alerts] == [
        ("s1", "a3", 22.0, 2),
        ("s1", "a4", 23.0, 2),
        ("s1", "a7", 25.0, 2),
        ("s2", "b5", 31.5, 2),
    ]
    assert result.alerts[1]["ts"] == t(0, 5)


def test_files_in_an_epoch_are_read_in_name_order(tmp_path: pathlib.Path) -> None:
    b = write(tmp_path, "b.jsonl", [rec("x", "s", iso(0), 2.0)])
    a = write(tmp_path, "a.jsonl", [rec("x", "s", iso(0), 1.0)])
    result = run_reference([[b, a]])  # a.jsonl comes first, so its "x" wins
    assert result.sensor_totals["s"]["sum"] == 1.0
    assert result.duplicate_counts == {1: 1}


# --------------------------------------------------------------------------- datagen

# Which reference reason each generated malformed kind must produce.
KIND_REASONS = {
    "not_json": "invalid_json",
    "json_array": "not_an_object",
    "json_number": "not_an_object",
    "json_string": "not_an_object",
    "missing_event_id": "missing_event_id",
    "empty_event_id": "empty_event_id",
    "non_string_event_id": "invalid_event_id",
    "missing_sensor_id": "missing_sensor_id",
    "empty_sensor_id": "empty_sensor_id",
    "non_string_sensor_id": "invalid_sensor_id",
    "missing_ts": {"missing_ts", "invalid_ts_type"},
    "naive_ts": "naive_ts",
    "float_ts": "invalid_ts_type",
    "bool_ts": "invalid_ts_type",
    "unparseable_ts": "unparseable_ts",
    "ts_out_of_range": "ts_out_of_range",
    "string_temperature": "invalid_temperature_type",
    "bool_temperature": "invalid_temperature_type",
    "missing_temperature": "missing_temperature",
    "nan_temperature": "non_finite_temperature",
    "infinity_temperature": "non_finite_temperature",
    "huge_temperature": "temperature_out_of_range",
}


def test_datagen_is_deterministic_and_file_independent(tmp_path: pathlib.Path) -> None:
    spec = SensorStreamSpec(n_files=4, records_per_file=50, seed=7)
    first = write_sensor_files(tmp_path / "one", spec)
    second = write_sensor_files(tmp_path / "two", spec)
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    # File k does not depend on how many files are generated or in which call.
    longer = dataclasses.replace(spec, n_files=9)
    piece = write_sensor_files(tmp_path / "three", longer, start_index=2, count=1)
    assert piece[0].name == "readings-000002.jsonl"
    assert piece[0].read_bytes() == first[2].read_bytes()
    assert generate_sensor_lines(spec, 3) == generate_sensor_lines(longer, 3)
    assert generate_sensor_lines(spec, 0) != generate_sensor_lines(dataclasses.replace(spec, seed=8), 0)
    assert all(len(generate_sensor_lines(spec, k)) == 50 for k in range(4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1  # type: ignore[misc]


def test_write_sensor_files_naming_and_atomicity(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SensorStreamSpec(n_files=3, records_per_file=5, file_prefix="temps")
    landing = tmp_path / "deep" / "landing"
    paths = write_sensor_files(landing, spec)
    assert paths == [landing / f"temps-{i:06d}.jsonl" for i in range(3)]
    assert sorted(os.listdir(landing)) == [p.name for p in paths]  # no temp files left
    assert write_sensor_files(landing, spec, start_index=3) == []
    data = paths[0].read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 5

    # A crash before the rename leaves neither a visible nor a temp file.
    seen: list[str] = []

    def failing_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(os.path.basename(src))
        assert os.path.exists(src) and not os.path.exists(dst)
        raise OSError("simulated crash")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_sensor_files(landing, spec, start_index=3, count=1)
    assert seen and seen[0].startswith(".")
    assert sorted(os.listdir(landing)) == [p.name for p in paths]
    assert split_epochs(landing, 2) == [paths[:2], paths[2:]]


def test_datagen_stream_covers_every_rule(tmp_path: pathlib.Path) -> None:
    assert set(KIND_REASONS) == set(MALFORMED_KINDS)
    spec = SensorStreamSpec(n_files=8, records_per_file=60, seed=3, malformed_rate=0.1, duplicate_rate=0.1, blank_line_rate=0.03)
    landing = tmp_path / "landing"
    write_sensor_files(landing, spec)
    (landing / ".readings-000008.jsonl.tmp").write_text("garbage\n")  # in progress: ignored
    result = run_reference_on_dir(landing, 2)

    reasons = {d["reason"] for d in result.dead_letter}
    expected: set[str] = set()
    for value in KIND_REASONS.values():
        expected |= {value} if isinstance(value, str) else value
    assert expected - {"invalid_ts_type", "missing_ts"} <= reasons
    assert {"invalid_ts_type", "missing_ts"} <= reasons
    raws = [d["raw"] for d in result.dead_letter]
    for token in ("NaN", "Infinity", "1" + "0" * 400, "true", "false"):
        assert any(token in raw for raw in raws), token
    assert all(d["source_file"].startswith("readings-") for d in result.dead_letter)

    assert sum(result.duplicate_counts.values()) > 0
    assert sum(result.duplicate_counts[e] for e in (2, 3, 4)) > 0
    assert sum(result.blank_counts.values()) > 0
    assert len(result.alerts) > 10  # random walks produce rising triples often
    assert result.late_readings and result.sensor_minute
    assert result.watermarks[1] is not None
    assert len(result.sensor_totals) == spec.n_sensors

    # Both ts encodings and several offsets occur among valid lines.
    valid_ts = []
    for path in sorted(landing.glob("readings-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            reading = validate_line(line.encode())
            if reading is not None and not isinstance(reading, str):
                valid_ts.append(json.loads(line)["ts"])
    assert any(isinstance(ts, int) for ts in valid_ts)
    strings = [ts for ts in valid_ts if isinstance(ts, str)]
    for suffix in ("Z", "+00:00", "+02:00"):
        assert any(ts.endswith(suffix) for ts in strings), suffix
    assert any("." in ts and len(ts.split(".")[1]) >= 7 for ts in strings)  # microseconds
    assert any("." not in ts for ts in strings)


def test_generated_event_ids_unique_except_duplicates(tmp_path: pathlib.Path) -> None:
    spec = SensorStreamSpec(n_files=5, records_per_file=40, duplicate_rate=0.0, seed=11)
    write_sensor_files(tmp_path, spec)
    result = run_reference_on_dir(tmp_path, 1)
    assert sum(result.duplicate_counts.values()) == 0
    assert sum(result.valid_counts.values()) > 150
