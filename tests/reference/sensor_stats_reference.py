"""Plain-Python oracle for the ``sensor_stats`` pipeline.

Written to be obviously correct rather than fast: one pass over the records in
arrival order (epoch, file name, line), with ordinary dicts as "state". The
Spark engine's outputs are compared against :class:`ReferenceResult`.

Semantics (see the project brief):

1. Blank/whitespace-only lines are skipped. Every other line is dead-lettered
   with a reason unless it is UTF-8, a JSON object, has non-empty string
   ``event_id``/``sensor_id``, a valid ``ts`` (offset-aware ISO-8601 string or
   int epoch milliseconds) and a finite int/float (non-bool) ``temperature``.
2. A valid record whose ``event_id`` was already seen is dropped entirely.
3. ``W(n) = max ts of epochs 1..n - out_of_orderness``; ``W(0) = None``.
4. Per-sensor count/sum/min/max over all kept records (late ones included).
5. One-minute tumbling windows; a record of epoch n is late iff
   ``window_end <= W(n-1)``. Windows with ``window_end <= W(n)`` fire once at
   the end of epoch n with count/avg/p75/p99 (nearest rank).
6. Alerts: a record hotter than the previous one of its sensor, which was hotter
   than the one before (late records included, across epochs).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

__all__ = [
    "Reading",
    "ReferenceResult",
    "split_epochs",
    "read_lines",
    "validate_line",
    "parse_ts",
    "nearest_rank",
    "run_reference",
    "run_reference_on_dir",
]

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Reading:
    """A valid record, normalised: ``ts`` is aware UTC, ``temperature`` a float."""

    event_id: str
    sensor_id: str
    ts: datetime
    temperature: float


@dataclass
class ReferenceResult:
    """Everything the reference pipeline produces.

    Lists are in arrival order, except ``sensor_minute`` which is sorted by
    ``(epoch, sensor_id, window_start)``.
    """

    dead_letter: list[dict[str, Any]] = field(default_factory=list)
    sensor_totals: dict[str, dict[str, Any]] = field(default_factory=dict)
    sensor_minute: list[dict[str, Any]] = field(default_factory=list)
    late_readings: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    watermarks: dict[int, datetime | None] = field(default_factory=dict)
    # Per epoch: kept (valid, non-duplicate) records, dropped duplicates, skipped blank lines.
    valid_counts: dict[int, int] = field(default_factory=dict)
    duplicate_counts: dict[int, int] = field(default_factory=dict)
    blank_counts: dict[int, int] = field(default_factory=dict)
    # Windows still open (not fired) after the last epoch: (sensor_id, window_start) -> temps.
    open_windows: dict[tuple[str, datetime], list[float]] = field(default_factory=dict)


def split_epochs(landing_dir: str | os.PathLike[str], max_files_per_epoch: int) -> list[list[pathlib.Path]]:
    """Visible ``*.jsonl`` files of ``landing_dir`` by name, chunked into epochs.

    Names starting with ``.`` or ``_`` are in-progress files and ignored. A
    missing directory yields no epochs.
    """
    if max_files_per_epoch < 1:
        raise ValueError("max_files_per_epoch must be >= 1")
    directory = pathlib.Path(landing_dir)
    if not directory.is_dir():
        return []
    names = sorted(
        p.name for p in directory.iterdir() if p.is_file() and p.name.endswith(".jsonl") and not p.name.startswith((".", "_"))
    )
    files = [directory / name for name in names]
    return [files[i : i + max_files_per_epoch] for i in range(0, len(files), max_files_per_epoch)]


def read_lines(path: str | os.PathLike[str]) -> list[bytes]:
    """Lines of a file as bytes: split on ``\\n``, one trailing ``\\r`` stripped.

    A last line without newline counts; the empty segment after a final
    newline does not.
    """
    data = pathlib.Path(path).read_bytes()
    if not data:
        return []
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return [p[:-1] if p.endswith(b"\r") else p for p in parts]


def parse_ts(value: Any) -> datetime | str:
    """Aware UTC datetime for a valid ``ts`` value, else a reason string."""
    if isinstance(value, bool):  # bool is an int subclass: check first
        return "invalid_ts_type"
    if isinstance(value, int):
        try:
            return _EPOCH + timedelta(milliseconds=value)
        except OverflowError:
            return "ts_out_of_range"
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return "unparseable_ts"
        if parsed.utcoffset() is None:
            return "naive_ts"
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00
            return "ts_out_of_range"
    return "invalid_ts_type"  # float, null, list, object


def _check_id(obj: dict[str, Any], key: str) -> str | None:
    if obj.get(key) is None:  # absent or null
        return f"missing_{key}"
    if not isinstance(obj[key], str):
        return f"invalid_{key}"
    if len(obj[key]) == 0:
        return f"empty_{key}"
    return None


def validate_line(raw: bytes) -> Reading | str | None:
    """``None`` for a blank line, a :class:`Reading` if valid, else a reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    if text.strip() == "":
        return None
    try:
        obj = json.loads(text)
    except ValueError:  # JSONDecodeError is a ValueError
        return "invalid_json"
    if not isinstance(obj, dict):
        return "not_an_object"
    for key in ("event_id", "sensor_id"):
        reason = _check_id(obj, key)
        if reason is not None:
            return reason
    if obj.get("ts") is None:
        return "missing_ts"
    ts = parse_ts(obj["ts"])
    if isinstance(ts, str):
        return ts
    if obj.get("temperature") is None:
        return "missing_temperature"
    temp = obj["temperature"]
    if isinstance(temp, bool) or not isinstance(temp, (int, float)):
        return "invalid_temperature_type"
    try:
        value = float(temp)
    except OverflowError:  # ints like 10**400
        return "temperature_out_of_range"
    if not math.isfinite(value):  # NaN / Infinity tokens
        return "non_finite_temperature"
    return Reading(obj["event_id"], obj["sensor_id"], ts, value)


def nearest_rank(sorted_values: list[float], k: int) -> float:
    """k-th percentile (1..100) by nearest rank: 1-based position ceil(k*n/100)."""
    n = len(sorted_values)
    return sorted_values[(k * n + 99) // 100 - 1]


def _window_start(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def run_reference(epochs: list[list[pathlib.Path]], out_of_orderness_seconds: int = 30) -> ReferenceResult:
    """Run the reference ``sensor_stats`` pipeline over ``epochs`` (numbered from 1)."""
    res = ReferenceResult()
    lag = timedelta(seconds=out_of_orderness_seconds)
    seen_ids: set[str] = set()
    max_ts: datetime | None = None
    watermark: datetime | None = None  # W(n-1) while processing epoch n
    windows: dict[tuple[str, datetime], list[float]] = {}  # open windows -> temps in arrival order
    history: dict[str, list[float]] = {}  # per sensor: last two temperatures

    for epoch, files in enumerate(epochs, start=1):
        res.valid_counts[epoch] = res.duplicate_counts[epoch] = res.blank_counts[epoch] = 0
        for path in sorted(files, key=lambda p: pathlib.Path(p).name):
            name = pathlib.Path(path).name
            for number, raw in enumerate(read_lines(path), start=1):
                outcome = validate_line(raw)
                if outcome is None:
                    res.blank_counts[epoch] += 1
                    continue
                if isinstance(outcome, str):
                    res.dead_letter.append(
                        {
                            "source_file": name,
                            "line": number,
                            "raw": raw.decode("utf-8", errors="replace"),
                            "reason": outcome,
                            "epoch": epoch,
                        }
                    )
                    continue
                r = outcome
                if r.event_id in seen_ids:
                    res.duplicate_counts[epoch] += 1
                    continue
                seen_ids.add(r.event_id)
                res.valid_counts[epoch] += 1
                max_ts = r.ts if max_ts is None else max(max_ts, r.ts)

                totals = res.sensor_totals.setdefault(
                    r.sensor_id, {"count": 0, "sum": 0.0, "min": r.temperature, "max": r.temperature}
                )
                totals["count"] += 1
                totals["sum"] += r.temperature
                totals["min"] = min(totals["min"], r.temperature)
                totals["max"] = max(totals["max"], r.temperature)

                start = _window_start(r.ts)
                if watermark is not None and start + _MINUTE <= watermark:
                    res.late_readings.append(
                        {
                            "event_id": r.event_id,
                            "sensor_id": r.sensor_id,
                            "ts": r.ts,
                            "temperature": r.temperature,
                            "epoch": epoch,
                        }
                    )
                else:
                    windows.setdefault((r.sensor_id, start), []).append(r.temperature)

                prev = history.setdefault(r.sensor_id, [])
                if len(prev) == 2 and prev[0] < prev[1] < r.temperature:
                    res.alerts.append(
                        {
                            "sensor_id": r.sensor_id,
                            "event_id": r.event_id,
                            "ts": r.ts,
                            "temperature": r.temperature,
                            "epoch": epoch,
                        }
                    )
                history[r.sensor_id] = (prev + [r.temperature])[-2:]

        # End of epoch: advance the watermark, then fire every complete window once.
        watermark = None if max_ts is None else max_ts - lag
        res.watermarks[epoch] = watermark
        if watermark is None:
            continue
        fired: list[dict[str, Any]] = []
        for key in sorted(windows):
            sensor_id, start = key
            end = start + _MINUTE
            if end > watermark:
                continue
            temps = windows.pop(key)
            ordered = sorted(temps)
            fired.append(
                {
                    "sensor_id": sensor_id,
                    "window_start": start,
                    "window_end": end,
                    "count": len(temps),
                    "avg": sum(temps) / len(temps),
                    "p75": nearest_rank(ordered, 75),
                    "p99": nearest_rank(ordered, 99),
                    "epoch": epoch,
                }
            )
        res.sensor_minute.extend(fired)  # already sorted by (sensor_id, window_start)

    res.open_windows = windows
    return res


def run_reference_on_dir(
    landing_dir: str | os.PathLike[str],
    max_files_per_epoch: int,
    out_of_orderness_seconds: int = 30,
) -> ReferenceResult:
    """``run_reference(split_epochs(landing_dir, max_files_per_epoch), ...)``."""
    return run_reference(split_epochs(landing_dir, max_files_per_epoch), out_of_orderness_seconds)
