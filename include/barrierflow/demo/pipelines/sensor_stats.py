"""The reference pipeline ``sensor_stats``.

Input: JSON Lines files ``{"event_id", "sensor_id", "ts", "temperature"}`` in ``landing_dir``. Dedup by ``event_id``; watermark =
max ts - out-of-orderness; outputs ``sensor_totals`` (upsert), ``sensor_minute`` (one-minute windows with count, avg, p75, p99),
``late_readings`` and ``alerts`` (three rising temperatures in a row per sensor, via a keyed process function)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pyarrow as pa

from barrierflow import (
    Avg,
    Count,
    DeadLetterReason,
    DeltaSink,
    FileSource,
    KeyedContext,
    KeyedProcessFunction,
    LateFiles,
    ListStateDescriptor,
    Max,
    Min,
    Param,
    Percentile,
    PipelineBuilder,
    RecordError,
    Sum,
    TumblingEventTimeWindows,
    pipeline,
)

__all__ = ["sensor_stats", "parse_reading", "RisingTemperatureAlert", "READING_SCHEMA", "PARALLELISM", "LATE_FILES"]

TS = pa.timestamp("us", tz="UTC")
READING_SCHEMA = pa.schema([("event_id", pa.string()), ("sensor_id", pa.string()), ("ts", TS), ("temperature", pa.float64())])
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
WRONG_TYPE = DeadLetterReason.WRONG_TYPE
# Parameters orders_payments takes too.
PARALLELISM = Param("parallelism", int, 2, "Spark shuffle partitions for this epoch", minimum=1)
LATE_FILES = Param(
    "late_files",
    str,
    LateFiles.NEXT_EPOCH.value,
    "a file landing behind the stream position: read it next epoch, dead-letter it, or refuse (block)",
    choices=tuple(p.value for p in LateFiles),
)


def _parse_ts(value: Any) -> datetime:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        kind = "a boolean" if isinstance(value, bool) else type(value).__name__
        raise RecordError(
            f"ts must be an ISO-8601 string with a UTC offset or integer epoch milliseconds, not {kind}", WRONG_TYPE
        )
    if isinstance(value, int):
        try:
            return _EPOCH + timedelta(milliseconds=value)
        except OverflowError:
            raise RecordError(f"ts {value} epoch milliseconds is out of range", WRONG_TYPE) from None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise RecordError(f"ts {value!r} is not an ISO-8601 timestamp", WRONG_TYPE) from None
    if parsed.utcoffset() is None:
        raise RecordError(f"ts {value!r} has no UTC offset", WRONG_TYPE)
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:
        raise RecordError(f"ts {value!r} is out of range in UTC", WRONG_TYPE) from None


def parse_reading(line: str) -> dict[str, Any]:
    """Validate one line of ``sensor_stats`` input; RecordError says why it is bad."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise RecordError(f"not JSON: {exc}", DeadLetterReason.NOT_JSON) from None
    if not isinstance(obj, dict):
        raise RecordError(f"not a JSON object but a {type(obj).__name__}", DeadLetterReason.NOT_AN_OBJECT)
    # event_id keys the deduplication, sensor_id the per-sensor operators.
    for field in ("event_id", "sensor_id"):
        value = obj.get(field)
        if value is None:
            raise RecordError(f"key {field} is missing or null", DeadLetterReason.NULL_KEY)
        if not isinstance(value, str):
            raise RecordError(f"{field} must be a string, got {value!r}"[:200], WRONG_TYPE)
        if not value:
            raise RecordError(f"key {field} is empty", DeadLetterReason.EMPTY_KEY)
    if obj.get("ts") is None:
        raise RecordError("required field ts is missing or null", DeadLetterReason.MISSING_FIELD)
    ts = _parse_ts(obj["ts"])
    temperature = obj.get("temperature")
    if temperature is None:
        raise RecordError("required field temperature is missing or null", DeadLetterReason.MISSING_FIELD)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise RecordError(f"temperature must be a JSON number, got {temperature!r}"[:200], WRONG_TYPE)
    try:
        value = float(temperature)
    except OverflowError:
        raise RecordError("temperature is out of the range of a double", WRONG_TYPE) from None
    if not math.isfinite(value):
        raise RecordError(f"temperature must be finite, got {temperature!r}", WRONG_TYPE)
    return {"event_id": obj["event_id"], "sensor_id": obj["sensor_id"], "ts": ts, "temperature": value}


class RisingTemperatureAlert(KeyedProcessFunction):
    """Alert on a reading strictly above the previous one, itself above the one before."""

    last_two = ListStateDescriptor("last_two", pa.float64())
    output_schema = pa.schema([("sensor_id", pa.string()), ("event_id", pa.string()), ("ts", TS), ("temperature", pa.float64())])

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        state = ctx.get_state(self.last_two)
        previous = state.get()
        temperature = record["temperature"]
        if len(previous) == 2 and temperature > previous[1] > previous[0]:
            out({k: record[k] for k in ("sensor_id", "event_id", "ts", "temperature")})
        state.update([*previous[-1:], temperature])


@pipeline(
    "sensor_stats",
    params=[
        Param("landing_dir", str, description="directory where *.jsonl reading files land"),
        Param("max_files_per_epoch", int, 20, "files per epoch at most (bounds an epoch after a backlog)", minimum=1),
        PARALLELISM,
        Param("out_of_orderness_seconds", int, 30, "watermark bound", minimum=0),
        LATE_FILES,
    ],
    description=__doc__ or "",
)
def sensor_stats(p: PipelineBuilder, params: dict[str, Any]) -> None:
    readings = p.source(
        FileSource(
            "readings",
            params["landing_dir"],
            format="jsonl",
            parser=parse_reading,
            parser_schema=READING_SCHEMA,
            max_files_per_epoch=params["max_files_per_epoch"],
            suffixes=(".jsonl",),
            late_files=LateFiles(params["late_files"]),
        )
    )
    valid = readings.deduplicate("dedup", key="event_id").with_watermark(
        "ts", timedelta(seconds=params["out_of_orderness_seconds"])
    )
    by_sensor = valid.key_by("sensor_id")
    by_sensor.aggregate("totals", count=Count(), sum=Sum("temperature"), min=Min("temperature"), max=Max("temperature")).sink_to(
        DeltaSink.upsert("sensor_totals", key="sensor_id")
    )
    by_sensor.window(
        "minute_windows",
        TumblingEventTimeWindows.of(timedelta(minutes=1), "ts"),
        count=Count(),
        avg=Avg("temperature"),
        p75=Percentile("temperature", q=0.75),
        p99=Percentile("temperature", q=0.99),
        late_output="late_readings",
    ).sink_to(DeltaSink.append("sensor_minute"))
    by_sensor.process("rising_alerts", RisingTemperatureAlert()).sink_to(DeltaSink.append("alerts"))
