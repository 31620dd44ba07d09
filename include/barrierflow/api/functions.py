"""The process functions a pipeline author subclasses, and the contexts they are called with.

Each declares its state as class attributes (state descriptors) and its emitted rows' ``output_schema`` (a pyarrow
schema); ``out(row)`` emits a row, a dict of the schema's columns. README "Connected streams", "Broadcast state",
"Operator state" and "Timers" show each in use; :mod:`barrierflow.operators.process` and its siblings run them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, ClassVar, Iterator, Mapping

import pyarrow as pa

from barrierflow.api.keyed_state import ListState, State
from barrierflow.api.state import EVEN_SPLIT, UNION, ListStateDescriptor, MapStateDescriptor, StateDescriptor
from barrierflow.api.timers import TimeDomain, TimerService
from barrierflow.core.errors import PipelineDefinitionError

__all__ = [
    "Emit", "declared_states", "KeyedContext", "KeyedFunction", "KeyedProcessFunction", "KeyedCoProcessFunction",
    "KeyedBroadcastProcessFunction", "ReadOnlyBroadcastState", "BroadcastState", "BroadcastContext",
    "OperatorContext", "ProcessFunction",
]  # fmt: skip

Emit = Callable[[dict[str, Any]], None]  # ``out``: emits one row (a dict of the function's output_schema columns)


def declared_states(cls: type) -> tuple[StateDescriptor, ...]:
    """The state descriptors of a function class: its ``state_descriptors`` tuple, then its attributes', then its bases'.

    State names (tables) are the descriptors', not the attributes'; one name declared twice differently is an error (one table).
    """
    listed = tuple(cls.__dict__.get("state_descriptors", ()))
    wrong = [d for d in listed if not isinstance(d, StateDescriptor)]
    if wrong:
        raise PipelineDefinitionError(f"{cls.__qualname__}.state_descriptors holds {wrong!r}: give StateDescriptor objects")
    # Bases first: a subclass's attribute overrides its base's.
    attributes = {a: v for klass in reversed(cls.__mro__) for a, v in vars(klass).items() if isinstance(v, StateDescriptor)}
    inherited = [d for base in cls.__mro__[1:] for d in getattr(base, "state_descriptors", ())]
    by_name: dict[str, tuple[str, StateDescriptor]] = {}
    for where, descriptor in [
        *((f"state_descriptors[{i}]", d) for i, d in enumerate(listed)),
        *((f"attribute {a}", d) for a, d in attributes.items()),
        *(("an inherited state_descriptors", d) for d in inherited),
    ]:
        seen = by_name.setdefault(descriptor.name, (where, descriptor))
        if seen[1] != descriptor:
            raise PipelineDefinitionError(
                f"{cls.__qualname__}: state {descriptor.name!r} is declared twice, differently ({seen[0]}: "
                f"{seen[1].signature()}, {where}: {descriptor.signature()}); a state name is one state table: "
                "give each state its own name, or declare it once"
            )
    return tuple(d for _, d in by_name.values())


class _Function:
    """What every process function shares: ``output_schema`` and its state (:func:`declared_states`, collected for you)."""

    state_descriptors: ClassVar[tuple[StateDescriptor, ...]] = ()
    output_schema: pa.Schema = pa.schema([])

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.state_descriptors = declared_states(cls)


class KeyedContext:
    """What a keyed process function sees for the current key; ``time_domain``: the firing timer's (None outside ``on_timer``)."""

    def __init__(
        self,
        key: tuple[Any, ...],
        epoch: int,
        processing_time_ms: int,
        states: Mapping[str, State],
        timers: TimerService | None = None,
        broadcast: Mapping[str, Any] | None = None,
    ) -> None:
        self.key = key
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self._states = states
        self._timers = timers or TimerService(None, processing_time_ms, enabled=False)
        self._broadcast = broadcast or {}
        self.time_domain: TimeDomain | None = None

    def timer_service(self) -> TimerService:
        """The current key's timers, the watermark and the epoch's processing time."""
        return self._timers

    def get_broadcast_state(self, descriptor: StateDescriptor) -> Any:
        """A broadcast state, read-only (a :class:`KeyedBroadcastProcessFunction`'s)."""
        try:
            return self._broadcast[descriptor.name]
        except KeyError:
            raise PipelineDefinitionError(
                f"broadcast state {descriptor.name!r} is not one this function's broadcast stream carries "
                f"(broadcast here: {sorted(self._broadcast) or 'none'}); broadcast a stream with it: "
                "rules.broadcast(descriptor), then keyed.connect(that).process(...)"
            ) from None

    def get_state(self, descriptor: StateDescriptor) -> Any:
        try:
            return self._states[descriptor.name]
        except KeyError:
            raise PipelineDefinitionError(
                f"state {descriptor.name!r} is not declared by the process function: declare it as a class "
                f"attribute, e.g. {descriptor.name} = {type(descriptor).__name__}({descriptor.name!r}, ...)"
            ) from None


class KeyedFunction(_Function):
    """What keyed process functions share: ``output_schema``, ``on_timer`` and per-key state, its
    :class:`StateDescriptor` class attributes (``total = ValueStateDescriptor("total", pa.int64())``).

    Implement :meth:`on_timer` to use timers: it is called for each timer that fires (README "Timers") with its
    timestamp as a UTC datetime, and may emit, use state and (un)register timers.
    """

    def on_timer(self, timestamp: datetime, ctx: KeyedContext, out: Emit) -> None:
        raise NotImplementedError

    @classmethod
    def uses_timers(cls) -> bool:
        """Whether the function implements ``on_timer`` (then its operator keeps a timer state table)."""
        return cls.on_timer is not KeyedFunction.on_timer


class KeyedProcessFunction(KeyedFunction):
    """Subclass and implement :meth:`process_element`; emit rows with ``out`` (see :class:`KeyedFunction`)."""

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Emit) -> None:
        raise NotImplementedError


class KeyedCoProcessFunction(KeyedFunction):
    """Subclass and implement :meth:`process_element1` and :meth:`process_element2`, as a :class:`KeyedProcessFunction`."""

    def process_element1(self, record: dict[str, Any], ctx: KeyedContext, out: Emit) -> None:
        raise NotImplementedError

    def process_element2(self, record: dict[str, Any], ctx: KeyedContext, out: Emit) -> None:
        raise NotImplementedError


class ReadOnlyBroadcastState:
    """A broadcast map state as the keyed side sees it: read, never written."""

    def __init__(self, values: Mapping[Any, Any]) -> None:
        self._values = values

    def get(self, key: Any) -> Any:
        return self._values.get(key)

    def contains(self, key: Any) -> bool:
        return key in self._values

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(dict(self._values).items())

    def keys(self) -> Iterator[Any]:
        return iter(list(self._values))


class BroadcastState(ReadOnlyBroadcastState):
    """A broadcast map state as the broadcast side sees it: ``put``, ``remove``, ``clear``."""

    _values: dict[Any, Any]

    def put(self, key: Any, value: Any) -> None:
        self._values[key] = value

    def remove(self, key: Any) -> None:
        self._values.pop(key, None)

    def clear(self) -> None:
        self._values.clear()

    def snapshot(self) -> dict[Any, Any]:
        """Its entries now (a copy)."""
        return dict(self._values)


class BroadcastContext:
    """What ``process_broadcast_element`` sees: the broadcast states (writable) and the epoch's clocks."""

    def __init__(
        self, states: Mapping[str, BroadcastState], epoch: int, processing_time_ms: int, watermark_us: int | None
    ) -> None:
        self._states = states
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self._watermark_us = watermark_us

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        state = self._states.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if state is None:
            raise PipelineDefinitionError(
                f"broadcast state {getattr(descriptor, 'name', descriptor)!r} is not one the stream was broadcast with: "
                f"declare it in rules.broadcast(...); broadcast here: {sorted(self._states)}"
            )
        return state

    def current_watermark(self) -> int | None:
        """W(n-1) in microseconds (None before any event time), as the keyed records of the epoch see it."""
        return self._watermark_us

    def current_processing_time(self) -> int:
        return self.processing_time_ms


class KeyedBroadcastProcessFunction(KeyedFunction):
    """Subclass and implement :meth:`process_element` (as a :class:`KeyedProcessFunction`'s) and :meth:`process_broadcast_element`.

    ``ctx.get_broadcast_state(descriptor)`` is read-only in the first, writable in the second (a :class:`BroadcastContext`).
    """

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Emit) -> None:
        raise NotImplementedError

    def process_broadcast_element(self, record: dict[str, Any], ctx: BroadcastContext, out: Emit) -> None:
        raise NotImplementedError


class OperatorContext:
    """What a :class:`ProcessFunction` sees: its subtask, the epoch's clocks and its list states."""

    def __init__(
        self, subtask_index: int, parallelism: int, epoch: int, processing_time_ms: int, states: Mapping[str, ListState]
    ) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self._states = states

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """This subtask's list of an even-split state."""
        return self._state(descriptor, EVEN_SPLIT, "get_union_list_state")

    def get_union_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """This subtask's list of a union state."""
        return self._state(descriptor, UNION, "get_list_state")

    def _state(self, descriptor: ListStateDescriptor, redistribution: str, other: str) -> ListState:
        state = self._states.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if state is None:
            name = getattr(descriptor, "name", descriptor)
            raise PipelineDefinitionError(
                f"operator state {name!r} is not declared by the process function: declare it as a class "
                f"attribute, e.g. {name} = bf.ListStateDescriptor({name!r}, pa.int64())"
            )
        declared = state.descriptor
        assert isinstance(declared, ListStateDescriptor)
        if declared.redistribution != redistribution:
            raise PipelineDefinitionError(
                f"operator state {declared.name!r} is declared redistribution={declared.redistribution!r}: "
                f"read it with ctx.{other}(...), or declare it redistribution={redistribution!r}"
            )
        return state


class ProcessFunction(_Function):
    """Subclass and implement :meth:`process_element`; its state: the :class:`ListStateDescriptor` class attributes."""

    def process_element(self, record: dict[str, Any], ctx: OperatorContext, out: Emit) -> None:
        raise NotImplementedError
