"""barrierflow.demo.pipelines.sensor_stats: the line parser and the rising-temperature alert."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable

import pytest

import barrierflow as bf
from barrierflow.api.keyed_state import HANDLES
from barrierflow.demo.pipelines.sensor_stats import READING_SCHEMA, RisingTemperatureAlert, parse_reading


def _line(**overrides: Any) -> str:
    doc: dict[str, Any] = {"event_id": "e-1", "sensor_id": "s-1", "ts": "2024-03-01T12:00:00Z", "temperature": 21.5}
    doc.update(overrides)
    return json.dumps(doc)


# -- parse_reading: valid input ---------------------------------------------------


def test_valid_reading_with_z_suffix() -> None:
    assert parse_reading(_line()) == {
        "event_id": "e-1",
        "sensor_id": "s-1",
        "ts": datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc),
        "temperature": 21.5,
    }


def test_offset_timestamp_is_converted_to_utc() -> None:
    ts = parse_reading(_line(ts="2024-03-01T12:00:00.250+02:00"))["ts"]
    assert ts == datetime(2024, 3, 1, 10, 0, 0, 250_000, tzinfo=timezone.utc)
    assert ts.utcoffset().total_seconds() == 0
    assert ts.tzinfo == timezone.utc


@pytest.mark.parametrize(
    ("millis", "expected"),
    [
        (0, datetime(1970, 1, 1, tzinfo=timezone.utc)),
        (1_709_294_400_123, datetime(2024, 3, 1, 12, 0, 0, 123_000, tzinfo=timezone.utc)),
        (-1000, datetime(1969, 12, 31, 23, 59, 59, tzinfo=timezone.utc)),
    ],
)
def test_integer_epoch_millis(millis: int, expected: datetime) -> None:
    assert parse_reading(_line(ts=millis))["ts"] == expected


def test_integer_temperature_becomes_float_and_extra_fields_are_dropped() -> None:
    out = parse_reading(_line(temperature=20, humidity=0.4))
    assert out["temperature"] == 20.0 and isinstance(out["temperature"], float)
    assert set(out) == set(READING_SCHEMA.names)


def test_surrounding_whitespace_is_fine() -> None:
    assert parse_reading("  " + _line() + "  ")["event_id"] == "e-1"


# -- parse_reading: invalid input -------------------------------------------------


W, NULL, EMPTY, MISSING = "wrong_type", "null_key", "empty_key", "missing_field"


@pytest.mark.parametrize(
    ("line", "reason", "message"),
    [
        (_line(ts="2024-03-01T12:00:00"), W, "ts '2024-03-01T12:00:00' has no UTC offset"),
        (_line(ts="yesterday"), W, "ts 'yesterday' is not an ISO-8601 timestamp"),
        (_line(ts=1.7e12), W, "ts must be an ISO-8601 string with a UTC offset or integer epoch milliseconds, not float"),
        (_line(ts=True), W, "ts must be an ISO-8601 string with a UTC offset or integer epoch milliseconds, not a boolean"),
        (_line(ts=None), MISSING, "required field ts is missing or null"),
        (_line(ts=[1]), W, "not list"),
        (_line(ts=10**20), W, "ts 100000000000000000000 epoch milliseconds is out of range"),
        (_line(ts="9999-12-31T23:59:59-05:00"), W, "is out of range in UTC"),
        (_line(temperature=True), W, "temperature must be a JSON number, got True"),
        (_line(temperature="21.5"), W, "temperature must be a JSON number, got '21.5'"),
        (_line(temperature=None), MISSING, "required field temperature is missing or null"),
        ('{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": NaN}', W, "temperature must be finite, got nan"),
        ('{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": Infinity}', W, "temperature must be finite, got inf"),
        ('{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": -Infinity}', W, "temperature must be finite, got -inf"),
        ('{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": 1e400}', W, "temperature must be finite, got inf"),
        (
            '{"event_id": "e", "sensor_id": "s", "ts": 0, "temperature": 1' + "0" * 400 + "}",
            W,
            "temperature is out of the range of a double",
        ),
        (_line(event_id=""), EMPTY, "key event_id is empty"),
        (_line(event_id=None), NULL, "key event_id is missing or null"),
        (_line(sensor_id=42), W, "sensor_id must be a string, got 42"),
        ('{"event_id": "e", "ts": 0, "temperature": 1}', NULL, "key sensor_id is missing or null"),
        ('{"event_id": "e", "sensor_id": "s", "temperature": 1}', MISSING, "required field ts is missing or null"),
        ("[1, 2, 3]", "not_an_object", "not a JSON object but a list"),
        ('"just a string"', "not_an_object", "not a JSON object but a str"),
        ("null", "not_an_object", "not a JSON object but a NoneType"),
        ("{not json", "not_json", "not JSON: "),
        ('{"event_id": "e"', "not_json", "not JSON: "),
    ],
)
def test_invalid_readings_raise_record_error_saying_why(line: str, reason: str, message: str) -> None:
    with pytest.raises(bf.RecordError) as info:
        parse_reading(line)
    assert info.value.reason.value == reason and message in str(info.value)


def test_record_error_message_is_truncated_for_huge_values() -> None:
    with pytest.raises(bf.RecordError) as info:
        parse_reading(_line(sensor_id=["x" * 10_000]))
    assert str(info.value).startswith("sensor_id must be a string")
    assert len(str(info.value)) <= 200


def test_record_error_is_a_value_error() -> None:
    # _parse_task relies on the type to tell bad input from parser bugs.
    assert issubclass(bf.RecordError, ValueError)


# -- RisingTemperatureAlert -------------------------------------------------------


@pytest.fixture
def alert_run() -> Callable[..., tuple[list[dict[str, Any]], bf.ListState]]:
    """Feed temperatures for one key through the process function; returns (alerts, state handle)."""

    def _run(temperatures: list[float], stored: list[float] | None = None) -> tuple[list[dict[str, Any]], bf.ListState]:
        fn = RisingTemperatureAlert()
        handles = {d.name: HANDLES[type(d)](d, stored) for d in fn.state_descriptors}
        ctx = bf.KeyedContext(("s-1",), epoch=1, processing_time_ms=0, states=handles)
        alerts: list[dict[str, Any]] = []
        for i, temperature in enumerate(temperatures):
            record = {
                "event_id": f"e-{i}",
                "sensor_id": "s-1",
                "ts": datetime(2024, 1, 1, 0, 0, i, tzinfo=timezone.utc),
                "temperature": temperature,
            }
            fn.process_element(record, ctx, alerts.append)
        handle = handles["last_two"]
        assert isinstance(handle, bf.ListState)
        return alerts, handle

    return _run


def test_three_rising_readings_alert_once(alert_run: Callable[..., Any]) -> None:
    alerts, state = alert_run([10.0, 11.0, 12.0])
    assert alerts == [
        {
            "sensor_id": "s-1",
            "event_id": "e-2",
            "ts": datetime(2024, 1, 1, 0, 0, 2, tzinfo=timezone.utc),
            "temperature": 12.0,
        }
    ]
    assert set(alerts[0]) == set(RisingTemperatureAlert.output_schema.names)
    assert state.get() == [11.0, 12.0]
    assert state.dirty


@pytest.mark.parametrize(
    ("temperatures", "alerting_events"),
    [
        ([10.0, 11.0, 12.0, 13.0], ["e-2", "e-3"]),
        ([12.0, 11.0, 10.0], []),
        ([10.0, 11.0], []),
        ([10.0, 10.0, 11.0, 12.0], ["e-3"]),  # equal is not rising
        ([10.0, 11.0, 11.0, 12.0], []),
        ([10.0, 11.0, 9.0, 10.0, 11.0], ["e-4"]),
        ([], []),
    ],
)
def test_alert_sequences(alert_run: Callable[..., Any], temperatures: list[float], alerting_events: list[str]) -> None:
    alerts, _ = alert_run(temperatures)
    assert [a["event_id"] for a in alerts] == alerting_events


def test_alert_resumes_from_stored_state(alert_run: Callable[..., Any]) -> None:
    alerts, state = alert_run([3.0], stored=[1.0, 2.0])
    assert [a["temperature"] for a in alerts] == [3.0]
    assert state.stored == [2.0, 3.0]


def test_no_readings_leave_state_untouched(alert_run: Callable[..., Any]) -> None:
    _, state = alert_run([], stored=[1.0, 2.0])
    assert not state.dirty
    assert state.stored == [1.0, 2.0]


def test_state_keeps_only_the_last_two_readings(alert_run: Callable[..., Any]) -> None:
    _, state = alert_run([5.0, 4.0, 3.0, 2.0, 1.0])
    assert state.stored == [2.0, 1.0]


def test_undeclared_state_is_a_definition_error() -> None:
    last_two = RisingTemperatureAlert.last_two
    ctx = bf.KeyedContext(("k",), 0, 0, {"last_two": HANDLES[type(last_two)](last_two, None)})
    with pytest.raises(bf.PipelineDefinitionError, match="'other' is not declared"):
        ctx.get_state(bf.ValueStateDescriptor("other"))
    assert ctx.get_state(bf.ListStateDescriptor("last_two")) is ctx._states["last_two"]
