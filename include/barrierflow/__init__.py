"""barrierflow: Flink's checkpointed, exactly-once stream processing on Airflow, PySpark and Delta Lake.

``import barrierflow as bf`` gives what a pipeline author needs::

    @bf.pipeline("clicks", params=[bf.Param("landing_dir", str)])
    def clicks(p: bf.PipelineBuilder, params: dict) -> None:
        events = p.source(bf.FileSource("events", params["landing_dir"], schema=SCHEMA))
        (events.filter("amount > 0")
               .key_by("user_id")
               .aggregate("per_user", count=bf.Count(), total=bf.Sum("amount"))
               .sink_to(bf.DeltaSink.upsert("user_totals", key="user_id")))

Names load on first use (PEP 562): DAG files import this package, and
importing it must cost nothing (no PySpark, no Delta) until a name is used.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# Public name -> the module defining it.
_EXPORTS: dict[str, str] = {
    # declaring a pipeline
    "pipeline": "barrierflow.plan.pipeline",
    "Pipeline": "barrierflow.plan.pipeline",
    "PipelineBuilder": "barrierflow.plan.pipeline",
    "PipelineDefinition": "barrierflow.plan.pipeline",
    "DataStream": "barrierflow.plan.pipeline",
    "KeyedStream": "barrierflow.plan.pipeline",
    "ConnectedKeyedStreams": "barrierflow.plan.pipeline",
    "IntervalJoinedStreams": "barrierflow.plan.pipeline",
    "JoinedStreams": "barrierflow.plan.pipeline",
    "Param": "barrierflow.api.params",
    # sources and sinks
    "FileSource": "barrierflow.connectors.file_source",
    "DeltaSource": "barrierflow.connectors.delta_source",
    "LateFiles": "barrierflow.connectors.file_source",
    "LineParser": "barrierflow.connectors.file_source",
    "RecordError": "barrierflow.connectors.file_source",
    "DeadLetterReason": "barrierflow.core.dead_letters",
    "DeltaSink": "barrierflow.connectors.delta_sink",
    # aggregations and windows
    "Aggregation": "barrierflow.api.aggregations",
    "Count": "barrierflow.api.aggregations",
    "Sum": "barrierflow.api.aggregations",
    "Min": "barrierflow.api.aggregations",
    "Max": "barrierflow.api.aggregations",
    "Avg": "barrierflow.api.aggregations",
    "Percentile": "barrierflow.api.aggregations",
    "TumblingEventTimeWindows": "barrierflow.api.windows",
    "SlidingEventTimeWindows": "barrierflow.api.windows",
    "EventTimeSessionWindows": "barrierflow.api.windows",
    # process functions and keyed state
    "KeyedProcessFunction": "barrierflow.api.functions",
    "KeyedBroadcastProcessFunction": "barrierflow.api.functions",
    "BroadcastContext": "barrierflow.api.functions",
    "BroadcastStream": "barrierflow.plan.pipeline",
    "KeyedContext": "barrierflow.api.functions",
    "ProcessFunction": "barrierflow.api.functions",
    "OperatorContext": "barrierflow.api.functions",
    "KeyedCoProcessFunction": "barrierflow.api.functions",
    "TimeDomain": "barrierflow.api.timers",
    "TimerService": "barrierflow.api.timers",
    "ValueStateDescriptor": "barrierflow.api.state",
    "ListStateDescriptor": "barrierflow.api.state",
    "MapStateDescriptor": "barrierflow.api.state",
    "ReducingStateDescriptor": "barrierflow.api.state",
    "AggregatingStateDescriptor": "barrierflow.api.state",
    "AggregateFunction": "barrierflow.api.state",
    "StateTtlConfig": "barrierflow.api.state",
    "ValueState": "barrierflow.api.keyed_state",
    "ListState": "barrierflow.api.keyed_state",
    "MapState": "barrierflow.api.keyed_state",
    "ReducingState": "barrierflow.api.keyed_state",
    "AggregatingState": "barrierflow.api.keyed_state",
    # evolving state and sink schemas
    "field_with_default": "barrierflow.core.schema_evolution",
    # reading results
    "run_query": "barrierflow.operations.query",
    # errors
    "BarrierflowError": "barrierflow.core.errors",
    "ConfigurationError": "barrierflow.core.errors",
    "EngineUnavailableError": "barrierflow.core.errors",
    "PipelineDefinitionError": "barrierflow.core.errors",
    "UserFunctionError": "barrierflow.core.errors",
    "UnknownPipelineError": "barrierflow.core.errors",
    "ParameterError": "barrierflow.core.errors",
    "StorageError": "barrierflow.core.errors",
    "CheckpointError": "barrierflow.core.errors",
    "EpochInProgressError": "barrierflow.core.errors",
    "CommitConflictError": "barrierflow.core.errors",
    "FencedError": "barrierflow.core.errors",
    "LeaseLostError": "barrierflow.core.errors",
    "PipelineStoppedError": "barrierflow.core.errors",
    "SavepointError": "barrierflow.core.errors",
    "IncompatibleSavepointError": "barrierflow.core.errors",
    "SchemaEvolutionError": "barrierflow.core.errors",
    "QueryError": "barrierflow.core.errors",
    "SourceError": "barrierflow.core.errors",
    "BlockedInputError": "barrierflow.core.errors",
}

# Literal, for linters and type checkers; a unit test checks it against _EXPORTS.
__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "Aggregation",
    "Avg",
    "BarrierflowError",
    "BlockedInputError",
    "BroadcastContext",
    "BroadcastStream",
    "CheckpointError",
    "CommitConflictError",
    "ConfigurationError",
    "ConnectedKeyedStreams",
    "Count",
    "DataStream",
    "DeadLetterReason",
    "DeltaSink",
    "DeltaSource",
    "EngineUnavailableError",
    "EpochInProgressError",
    "EventTimeSessionWindows",
    "FencedError",
    "FileSource",
    "IncompatibleSavepointError",
    "IntervalJoinedStreams",
    "JoinedStreams",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedContext",
    "KeyedProcessFunction",
    "KeyedStream",
    "LateFiles",
    "LeaseLostError",
    "LineParser",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "Max",
    "Min",
    "OperatorContext",
    "Param",
    "ParameterError",
    "Percentile",
    "Pipeline",
    "PipelineBuilder",
    "PipelineDefinition",
    "PipelineDefinitionError",
    "PipelineStoppedError",
    "ProcessFunction",
    "QueryError",
    "RecordError",
    "ReducingState",
    "ReducingStateDescriptor",
    "SavepointError",
    "SchemaEvolutionError",
    "SlidingEventTimeWindows",
    "SourceError",
    "StateTtlConfig",
    "StorageError",
    "Sum",
    "TimeDomain",
    "TimerService",
    "TumblingEventTimeWindows",
    "UnknownPipelineError",
    "UserFunctionError",
    "ValueState",
    "ValueStateDescriptor",
    "field_with_default",
    "pipeline",
    "run_query",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads them
    from barrierflow.api.aggregations import Aggregation, Avg, Count, Max, Min, Percentile, Sum
    from barrierflow.api.functions import (
        BroadcastContext,
        KeyedBroadcastProcessFunction,
        KeyedContext,
        KeyedCoProcessFunction,
        KeyedProcessFunction,
        OperatorContext,
        ProcessFunction,
    )
    from barrierflow.api.keyed_state import AggregatingState, ListState, MapState, ReducingState, ValueState
    from barrierflow.api.params import Param
    from barrierflow.api.state import (
        AggregateFunction,
        AggregatingStateDescriptor,
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        StateTtlConfig,
        ValueStateDescriptor,
    )
    from barrierflow.api.timers import TimeDomain, TimerService
    from barrierflow.api.windows import EventTimeSessionWindows, SlidingEventTimeWindows, TumblingEventTimeWindows
    from barrierflow.connectors.delta_sink import DeltaSink
    from barrierflow.connectors.delta_source import DeltaSource
    from barrierflow.connectors.file_source import FileSource, LateFiles, LineParser, RecordError
    from barrierflow.core.dead_letters import DeadLetterReason
    from barrierflow.core.errors import (
        BarrierflowError,
        BlockedInputError,
        CheckpointError,
        CommitConflictError,
        ConfigurationError,
        EngineUnavailableError,
        EpochInProgressError,
        FencedError,
        IncompatibleSavepointError,
        LeaseLostError,
        ParameterError,
        PipelineDefinitionError,
        PipelineStoppedError,
        QueryError,
        SavepointError,
        SchemaEvolutionError,
        SourceError,
        StorageError,
        UnknownPipelineError,
        UserFunctionError,
    )
    from barrierflow.core.schema_evolution import field_with_default
    from barrierflow.operations.query import run_query
    from barrierflow.plan.pipeline import (
        BroadcastStream,
        ConnectedKeyedStreams,
        DataStream,
        IntervalJoinedStreams,
        JoinedStreams,
        KeyedStream,
        Pipeline,
        PipelineBuilder,
        PipelineDefinition,
        pipeline,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'barrierflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # loaded once; later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """This package, keeping its public names when a submodule of the same name loads.

    ``bf.pipeline`` is the decorator, yet ``barrierflow.plan.pipeline`` is also
    the module defining it: loading that module (``from barrierflow.plan.pipeline
    import ...`` anywhere) would set the package's attribute ``pipeline`` to
    the module. The decorator stays; the module is in ``sys.modules``.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Pickled by name, as any module: a user function that says ``bf.X``
        # refers to this package, and cloudpickle (shipping it to executors)
        # recognises modules by their exact type, not this subclass.
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _Package
