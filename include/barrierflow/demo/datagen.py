"""Deterministic, messy sensor streams for tests, demos and benchmarks.

Each landing file ``<prefix>-<index:06d>.jsonl`` holds one JSON reading per
line, mixed with blank lines, malformed lines, duplicates of earlier event ids,
out-of-order and late readings. File ``k`` depends only on ``(seed, k)`` and the
spec, never on how many files are generated, so a stream can be extended or
regenerated piecewise and still be byte-identical.

A valid reading looks like::

    {"event_id": "3-17", "sensor_id": "sensor-02",
     "ts": "2023-11-14T22:13:20.125+02:00" | 1699999999125,
     "temperature": 21.37}

Files are published atomically, so that readers never see part of one: written
under a temporary name starting with ``.`` (readers skip those as "in progress"),
then renamed into place.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import pathlib
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Iterator

from barrierflow.storage import objects

__all__ = [
    "SensorStreamSpec", "MALFORMED_KINDS", "generate_sensor_lines", "write_sensor_files", "sensor_files", "file_count",
    "publish_files",
]  # fmt: skip

# Every way a line can be malformed. Files cycle through these in order (see
# ``_malformed_offset``) so a modest stream is guaranteed to contain each kind.
MALFORMED_KINDS: tuple[str, ...] = (
    "not_json", "json_array", "json_number", "json_string",
    "missing_event_id", "empty_event_id", "non_string_event_id",
    "missing_sensor_id", "empty_sensor_id", "non_string_sensor_id",
    "missing_ts", "naive_ts", "float_ts", "bool_ts", "unparseable_ts", "ts_out_of_range",
    "string_temperature", "bool_temperature", "missing_temperature", "nan_temperature", "infinity_temperature",
    "huge_temperature",
)  # fmt: skip

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# (suffix, minutes east of UTC); "Z" and "+00:00" both appear on purpose.
_OFFSETS = (("Z", 0), ("+00:00", 0), ("+02:00", 120), ("-05:00", -300), ("+05:30", 330))
_BLANKS: tuple[str, ...] = ("", "   ", "\t", " \t ")
_HUGE_SENTINEL = "__barrierflow_huge_int__"
_HUGE_LITERAL = "1" + "0" * 400  # json.loads -> int that float() cannot hold

_UNPARSEABLE_TS = ["yesterday at noon", "2023-13-45T25:61:00Z", "not-a-time", "", "1700000000000"]
_DELETE = object()  # a _BREAKS value: remove the field
# Malformed kind -> (field, its broken value from (rng, ts_us)); the draws and their order make the stream's bytes.
_BREAKS: dict[str, tuple[str, Callable[[random.Random, int], Any]]] = {
    "missing_event_id": ("event_id", lambda rng, ts_us: _DELETE),
    "empty_event_id": ("event_id", lambda rng, ts_us: ""),
    "non_string_event_id": ("event_id", lambda rng, ts_us: rng.choice([12345, None, 3.5, ["a"], True])),
    "missing_sensor_id": ("sensor_id", lambda rng, ts_us: _DELETE),
    "empty_sensor_id": ("sensor_id", lambda rng, ts_us: ""),
    "non_string_sensor_id": ("sensor_id", lambda rng, ts_us: rng.choice([7, None, {"id": "s"}, False])),
    "missing_ts": ("ts", lambda rng, ts_us: _DELETE if rng.random() < 0.7 else None),
    "naive_ts": ("ts", lambda rng, ts_us: (_EPOCH + timedelta(microseconds=ts_us)).strftime("%Y-%m-%dT%H:%M:%S")),
    # Including an integral float: 1.7e12 written as "1700000000000.0" is still a float.
    "float_ts": ("ts", lambda rng, ts_us: rng.choice([ts_us / 1000 + 0.5, float(ts_us // 1000)])),
    "bool_ts": ("ts", lambda rng, ts_us: rng.choice([True, False])),
    "unparseable_ts": ("ts", lambda rng, ts_us: rng.choice(_UNPARSEABLE_TS)),
    "ts_out_of_range": ("ts", lambda rng, ts_us: rng.choice([10**20, -(10**20)])),  # epoch ms beyond datetime's range
    "string_temperature": ("temperature", lambda rng, ts_us: "21.5"),
    "bool_temperature": ("temperature", lambda rng, ts_us: rng.choice([True, False])),
    "missing_temperature": ("temperature", lambda rng, ts_us: _DELETE),
    "nan_temperature": ("temperature", lambda rng, ts_us: float("nan")),  # json.dumps writes the bare token NaN
    "infinity_temperature": ("temperature", lambda rng, ts_us: rng.choice([float("inf"), float("-inf")])),  # Infinity / -Infinity
}

# Slot kinds of a file's plan.
_VALID, _DUP, _BAD, _BLANK = "valid", "duplicate", "malformed", "blank"


@dataclass(frozen=True)
class SensorStreamSpec:
    """Shape of a generated sensor stream: ``records_per_file`` lines (slots) per file, each a blank, malformed,
    duplicate or fresh valid reading according to the rates."""

    n_files: int
    records_per_file: int
    n_sensors: int = 5
    seed: int = 0
    start_ms: int = 1_700_000_000_000
    step_ms: int = 1_000  # mean event-time advance per record
    duplicate_rate: float = 0.05  # re-emit an earlier event_id
    malformed_rate: float = 0.03
    out_of_order_ms: int = 20_000  # max backwards jitter of out-of-order readings
    late_rate: float = 0.02  # readings several minutes in the past
    blank_line_rate: float = 0.01
    file_prefix: str = "readings"

    def __post_init__(self) -> None:
        if self.n_files < 0 or self.records_per_file < 0:
            raise ValueError("n_files and records_per_file must be >= 0")
        if self.n_sensors < 1:
            raise ValueError("n_sensors must be >= 1")
        if self.step_ms < 0 or self.out_of_order_ms < 0:
            raise ValueError("step_ms and out_of_order_ms must be >= 0")
        rates = (self.duplicate_rate, self.malformed_rate, self.late_rate, self.blank_line_rate)
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError("rates must lie in [0, 1]")
        if self.duplicate_rate + self.malformed_rate + self.blank_line_rate > 1.0:
            raise ValueError("duplicate_rate + malformed_rate + blank_line_rate must be <= 1")
        if not self.file_prefix or self.file_prefix[0] in "._" or "/" in self.file_prefix:
            raise ValueError("file_prefix must be non-empty, not start with '.'/'_', and hold no '/'")


def _event_id(file_index: int, slot: int) -> str:
    # Globally unique per slot; only duplicate slots reuse an earlier one.
    return f"{file_index}-{slot}"


def _plan(spec: SensorStreamSpec, file_index: int) -> list[str]:
    """Kind of every slot of a file, from its own RNG stream: a later file learns which event ids an earlier
    one emitted validly without generating its content."""
    rng = random.Random(f"{spec.seed}:{file_index}:plan")
    # Cumulative rate bounds: a draw below the first is blank, then malformed, then duplicate, else valid.
    bounds = (b := spec.blank_line_rate, b + spec.malformed_rate, b + spec.malformed_rate + spec.duplicate_rate)
    kinds: list[str] = []
    for _ in range(spec.records_per_file):
        kind = (_BLANK, _BAD, _DUP, _VALID)[bisect.bisect_right(bounds, rng.random())]
        # A duplicate needs an earlier id; the very first ids of the stream cannot be one.
        if kind == _DUP and file_index == 0 and _VALID not in kinds:
            kind = _VALID
        kinds.append(kind)
    return kinds


def _malformed_offset(spec: SensorStreamSpec, file_index: int) -> int:
    # Each file continues the malformed-kind cycle about where the previous file
    # (at its expected malformed count) stopped, without depending on it.
    per_file = max(1, round(spec.records_per_file * spec.malformed_rate))
    return (file_index * per_file) % len(MALFORMED_KINDS)


def _format_ts(rng: random.Random, ts_us: int) -> str | int:
    """``ts_us`` as integer epoch milliseconds or (half the time) ISO-8601 with an offset, cut to 0, 3 or 6
    fractional digits (the emitted string is the truth)."""
    if rng.random() >= 0.5:
        return ts_us // 1000
    suffix, minutes = rng.choice(_OFFSETS)
    local = _EPOCH + timedelta(microseconds=ts_us, minutes=minutes)
    digits = rng.choice((0, 3, 6))
    fraction = f".{local.microsecond:06d}"[: 1 + digits] if digits else ""
    return local.strftime("%Y-%m-%dT%H:%M:%S") + fraction + suffix


def _extra_fields(rng: random.Random) -> dict[str, Any]:
    """Fields a reader must ignore; some non-ASCII to exercise UTF-8 handling."""
    pool: list[tuple[str, Any]] = [
        ("unit", "C"),
        ("battery", round(rng.uniform(0.05, 1.0), 3)),
        ("location", rng.choice(["Zürich", "São Paulo", "Kraków", "lab-1"])),
        ("tags", ["indoor", "calibrated"]),
        ("meta", {"fw": "1.4.2", "rssi": rng.randint(-90, -30)}),
        ("seq", rng.randint(0, 10**6)),
        ("note", None),
    ]
    return dict(rng.sample(pool, rng.randint(1, 3)))


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)  # non-ASCII text as raw UTF-8


def _malformed_line(kind: str, rng: random.Random, base: dict[str, Any], ts_us: int) -> str:
    """Render a would-be valid record ``base`` broken in the way ``kind`` names."""
    rec = dict(base)
    if kind == "not_json":
        return rng.choice(
            [
                _dump(rec)[:-7],  # truncated object
                "sensor-01,21.5,2023-11-14T22:13:20Z",  # CSV sneaked in
                "{'event_id': 'x', 'sensor_id': 'y'}",  # single quotes
                "<<<garbage>>>",
                '{"event_id": "a" "sensor_id": "b"}',  # missing comma
            ]
        )
    if kind == "json_array":
        return rng.choice([_dump([rec]), "[1, 2, 3]", "[]"])
    if kind == "json_number":
        return rng.choice(["42", "-3.5", "1e3"])
    if kind == "json_string":
        return _dump(rng.choice(["hello", _dump(rec)]))
    if kind == "huge_temperature":
        rec["temperature"] = _HUGE_SENTINEL
        return _dump(rec).replace(f'"{_HUGE_SENTINEL}"', _HUGE_LITERAL)
    field, value = _BREAKS[kind]
    broken = value(rng, ts_us)
    if broken is _DELETE:
        del rec[field]
    else:
        rec[field] = broken
    return _dump(rec)


def generate_sensor_lines(spec: SensorStreamSpec, file_index: int) -> list[str]:
    """Lines (without newlines) of landing file ``file_index``, deterministic in ``(spec, file_index)`` alone;
    a duplicate reuses an id validly emitted earlier in this file or in one of the three previous files."""
    if file_index < 0:
        raise ValueError("file_index must be >= 0")
    rng = random.Random(f"{spec.seed}:{file_index}")
    plan = _plan(spec, file_index)
    # Duplicates from earlier files pick among those files' valid slots.
    earlier_files = range(max(0, file_index - 3), file_index)
    earlier_ids = {k: [_event_id(k, s) for s, kind in enumerate(_plan(spec, k)) if kind == _VALID] for k in earlier_files}
    earlier_ids = {k: ids for k, ids in earlier_ids.items() if ids}

    sensors = [f"sensor-{s:02d}" for s in range(spec.n_sensors)]
    # Per-sensor random walk restarted per file (file independence); the upward
    # drift makes "three rising in a row" frequent.
    walk = {s: round(rng.uniform(15.0, 25.0), 2) for s in sensors}
    base_ms = spec.start_ms + file_index * spec.records_per_file * spec.step_ms
    malformed_seq = _malformed_offset(spec, file_index)
    emitted: list[tuple[str, str]] = []  # (event_id, line) of valid lines in this file
    lines: list[str] = []

    for slot, kind in enumerate(plan):
        if kind == _BLANK:
            lines.append(rng.choice(_BLANKS))
            continue

        # Event time: steady advance, sometimes jittered back, rarely minutes late.
        ts_ms = base_ms + slot * spec.step_ms + (rng.randrange(spec.step_ms) if spec.step_ms else 0)
        if rng.random() < 0.25 and spec.out_of_order_ms:
            ts_ms -= rng.randint(0, spec.out_of_order_ms)
        if rng.random() < spec.late_rate:
            ts_ms -= rng.randint(3 * 60_000, 10 * 60_000)
        ts_us = ts_ms * 1000 + rng.randrange(1000)

        sensor = rng.choice(sensors)
        # Mostly upward near the bottom of the band, mostly downward near the
        # top: mean-reverting, yet long enough climbs for rising triples.
        current = walk[sensor]
        up_prob = 0.65 if current < 22.0 else 0.5 if current < 27.0 else 0.2
        step = rng.choice((0.1, 0.2, 0.3, 0.5, 0.8))
        if rng.random() >= up_prob:
            step = -step
        temperature: float | int = round(walk[sensor] + step, 2)
        if rng.random() < 0.15:
            temperature = int(round(temperature))  # JSON ints are valid temperatures too

        record: dict[str, Any] = {
            "event_id": _event_id(file_index, slot),
            "sensor_id": sensor,
            "ts": _format_ts(rng, ts_us),
            "temperature": temperature,
        }
        if rng.random() < 0.2:
            record.update(_extra_fields(rng))
        if rng.random() < 0.1:
            items = list(record.items())
            rng.shuffle(items)  # key order must not matter
            record = dict(items)

        if kind == _BAD:
            bad = MALFORMED_KINDS[malformed_seq % len(MALFORMED_KINDS)]
            malformed_seq += 1
            lines.append(_malformed_line(bad, rng, record, ts_us))
            continue

        if kind == _DUP:
            choices = ["same_file"] * bool(emitted) + ["earlier_file"] * bool(earlier_ids)
            if rng.choice(choices) == "earlier_file":
                record["event_id"] = rng.choice(earlier_ids[rng.choice(sorted(earlier_ids))])
            elif rng.random() < 0.5:
                lines.append(rng.choice(emitted)[1])  # exact replay of an earlier line
                continue
            else:
                record["event_id"] = rng.choice(emitted)[0]
            # Different values under a seen id; the walk is not advanced because
            # a deduplicating reader drops this line.
            lines.append(_dump(record))
            continue

        walk[sensor] = float(temperature)
        line = _dump(record)
        emitted.append((record["event_id"], line))
        lines.append(line)
    return lines


def write_sensor_files(
    landing_dir: str | os.PathLike[str], spec: SensorStreamSpec, start_index: int = 0, count: int | None = None
) -> list[pathlib.Path]:
    """Publish files ``start_index ..`` (``count`` of them, default up to ``spec.n_files``) into ``landing_dir``."""
    return publish_files(landing_dir, sensor_files(spec, start_index, file_count(spec.n_files, start_index, count)))


def sensor_files(spec: SensorStreamSpec, start_index: int, count: int) -> Iterator[tuple[str, str]]:
    """The name and text of files ``start_index .. start_index+count-1``, for a writer of any store."""
    for index in range(start_index, start_index + count):
        lines = generate_sensor_lines(spec, index)
        yield f"{spec.file_prefix}-{index:06d}.jsonl", "".join(line + "\n" for line in lines)  # names sort in index order


def file_count(n_files: int, start_index: int, count: int | None) -> int:
    """``count``, by default the files from ``start_index`` up to ``n_files``; ValueError when negative."""
    count = max(0, n_files - start_index) if count is None else count
    if start_index < 0 or count < 0:
        raise ValueError("start_index and count must be >= 0")
    return count


def publish_files(landing_dir: str | os.PathLike[str], files: Iterable[tuple[str, str]]) -> list[pathlib.Path]:
    """Write each ``(path, text)`` under the local ``landing_dir`` (a path or ``file://`` URI) as described above;
    a StorageError refuses an object-store URI, never taken for a local directory called ``s3:``."""
    given = os.fspath(landing_dir)
    # A plain path stays as given (relative stays relative).
    root = pathlib.Path(given if objects.is_local(given) and not given.startswith("file:") else objects.local_path(given))
    root.mkdir(parents=True, exist_ok=True)
    return [_publish(root / path, text) for path, text in files]


def _publish(final: pathlib.Path, text: str) -> pathlib.Path:
    """A ``.``-prefixed temporary name, fsynced, renamed to ``final``, the rename fsynced."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # Make the rename itself durable; not every platform can open a directory.
    with contextlib.suppress(OSError):
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return final
