"""barrierflow.api.keyed_state: per-key state handles and their dirty flags."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest

from barrierflow.api.keyed_state import (
    HANDLES,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from barrierflow.api.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)


def state_for(descriptor: Any, stored: Any) -> Any:
    """The handle the runtime scopes to a key whose stored value is ``stored``."""
    return HANDLES[type(descriptor)](descriptor, stored)


class MeanAggregate:
    """A small AggregateFunction: accumulator [sum, count] -> mean."""

    def create_accumulator(self) -> list[float]:
        return [0.0, 0]

    def add(self, value: float, accumulator: list[float]) -> list[float]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[float]) -> float:
        return accumulator[0] / accumulator[1]


VALUE = ValueStateDescriptor("v", pa.int64())
LIST = ListStateDescriptor("l", pa.string())
MAP = MapStateDescriptor("m", pa.string(), pa.int64())
REDUCE = ReducingStateDescriptor("r", lambda a, b: max(a, b), pa.float64())
AGG = AggregatingStateDescriptor("a", MeanAggregate(), pa.list_(pa.float64()))


@pytest.mark.parametrize(
    ("descriptor", "handle_type"),
    [(VALUE, ValueState), (LIST, ListState), (MAP, MapState), (REDUCE, ReducingState), (AGG, AggregatingState)],
)
def test_state_for_picks_the_handle_and_starts_clean(descriptor: Any, handle_type: type) -> None:
    handle = state_for(descriptor, None)
    assert type(handle) is handle_type
    assert handle.descriptor is descriptor
    assert handle.dirty is False
    assert handle.stored is None


@pytest.mark.parametrize(
    ("descriptor", "stored"),
    [(VALUE, 5), (LIST, ["a"]), (MAP, [("k", 1)]), (REDUCE, 2.0), (AGG, [3.0, 1])],
)
def test_clear_deletes_and_marks_dirty(descriptor: Any, stored: Any) -> None:
    handle = state_for(descriptor, stored)
    assert handle.stored is not None
    handle.clear()
    assert handle.stored is None
    assert handle.dirty


def test_value_state() -> None:
    handle = state_for(VALUE, 7)
    assert isinstance(handle, ValueState)
    assert handle.value() == 7
    assert not handle.dirty  # reading does not dirty
    handle.update(8)
    assert handle.value() == 8 and handle.stored == 8 and handle.dirty


def test_value_state_update_to_none_is_a_delete() -> None:
    handle = state_for(VALUE, 7)
    handle.update(None)
    assert handle.stored is None and handle.dirty


def test_list_state() -> None:
    handle = state_for(LIST, None)
    assert isinstance(handle, ListState)
    assert handle.get() == []
    assert not handle.dirty
    handle.add("a")
    handle.add("b")
    assert handle.get() == ["a", "b"]
    assert handle.stored == ["a", "b"]
    assert handle.dirty


def test_list_state_get_returns_a_copy() -> None:
    handle = state_for(LIST, ["a"])
    got = handle.get()
    got.append("mutated")
    assert handle.get() == ["a"]
    assert not handle.dirty


def test_list_state_add_does_not_mutate_the_stored_input() -> None:
    stored = ["a"]
    handle = state_for(LIST, stored)
    handle.add("b")
    assert stored == ["a"]


def test_list_state_update() -> None:
    handle = state_for(LIST, ["x"])
    handle.update(("p", "q"))
    assert handle.stored == ["p", "q"]
    handle.update([])
    assert handle.stored is None  # an empty list is stored as a delete
    assert handle.get() == []
    assert handle.dirty


def test_map_state_from_arrow_pairs() -> None:
    handle = state_for(MAP, [("a", 1), ("b", 2)])
    assert isinstance(handle, MapState)
    assert handle.get("a") == 1
    assert handle.get("zzz") is None
    assert handle.contains("b") and not handle.contains("c")
    assert dict(handle.items()) == {"a": 1, "b": 2}
    assert not handle.dirty
    assert handle.stored == [("a", 1), ("b", 2)]


def test_a_handle_loaded_for_the_next_key_holds_its_value_and_is_clean() -> None:
    # The runtime keeps one handle per state and scopes it to each key in turn (as Flink's).
    handle = state_for(MAP, [("a", 1)])
    handle.put("b", 2)
    assert handle.dirty
    handle.load([("c", 3)])
    assert not handle.dirty and handle.get("c") == 3 and handle.get("a") is None
    handle.load(None)
    assert not handle.dirty and handle.stored is None and list(handle.items()) == []


def test_map_state_put_and_remove() -> None:
    handle = state_for(MAP, None)
    assert list(handle.items()) == []
    handle.put("a", 1)
    handle.put("b", 2)
    handle.put("a", 3)
    assert handle.dirty
    assert sorted(handle.stored) == [("a", 3), ("b", 2)]
    handle.remove("a")
    assert handle.stored == [("b", 2)]
    handle.remove("b")
    assert handle.stored is None  # empty map is a delete


def test_map_state_remove_of_absent_key_is_not_a_change() -> None:
    handle = state_for(MAP, [("a", 1)])
    handle.remove("zzz")
    assert not handle.dirty
    assert handle.stored == [("a", 1)]
    empty = state_for(MAP, None)
    empty.remove("a")
    assert not empty.dirty


def test_map_state_items_is_a_snapshot() -> None:
    handle = state_for(MAP, [("a", 1)])
    items = handle.items()
    handle.put("b", 2)
    assert list(items) == [("a", 1)]


def test_reducing_state() -> None:
    handle = state_for(REDUCE, None)
    assert isinstance(handle, ReducingState)
    assert handle.get() is None
    handle.add(3.0)
    assert handle.get() == 3.0  # the first value is taken as is
    handle.add(1.0)
    handle.add(5.0)
    assert handle.get() == 5.0
    assert handle.stored == 5.0 and handle.dirty


def test_reducing_state_continues_from_stored() -> None:
    handle = state_for(ReducingStateDescriptor("sum", lambda a, b: a + b), 10.0)
    handle.add(2.5)
    assert handle.get() == 12.5


def test_aggregating_state() -> None:
    handle = state_for(AGG, None)
    assert isinstance(handle, AggregatingState)
    assert handle.get() is None
    assert not handle.dirty
    for v in (1.0, 2.0, 6.0):
        handle.add(v)
    assert handle.get() == 3.0
    assert handle.stored == [9.0, 3]  # the accumulator is what is persisted
    assert handle.dirty


def test_aggregating_state_continues_from_stored_accumulator() -> None:
    handle = state_for(AGG, [10.0, 2])
    assert handle.get() == 5.0
    handle.add(4.0)
    assert handle.stored == [14.0, 3]
    assert handle.get() == pytest.approx(14.0 / 3)


def test_descriptor_kinds_types_and_signatures() -> None:
    assert [d.kind for d in (VALUE, LIST, MAP, REDUCE, AGG)] == ["value", "list", "map", "reducing", "aggregating"]
    assert VALUE.signature() == "value<int64>"
    assert LIST.value_type == pa.list_(pa.string())
    assert MAP.value_type == pa.map_(pa.string(), pa.int64())
    assert AGG.value_type == pa.list_(pa.float64())


def test_descriptor_ttl() -> None:
    ttl = StateTtlConfig(timedelta(minutes=2))
    assert ttl.ttl_ms == 120_000
    assert ValueStateDescriptor("v", ttl_config=ttl).ttl == ttl
    assert ListStateDescriptor("l").ttl is None
