"""barrierflow: Flink's checkpointed, exactly-once stream processing on Airflow, PySpark and Delta Lake.

``import barrierflow as bf`` gives what a pipeline author needs (README "Declare a pipeline"). Names load on first use (PEP 562):
DAG files and Spark's Python workers import this package, which must cost nothing (no PySpark, no Delta) until a name is used."""

from __future__ import annotations

import ast
import functools
import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# Literal, for linters and type checkers; a unit test checks it against the imports below.
__all__ = [
    "AggregateFunction", "AggregatingState", "AggregatingStateDescriptor", "Aggregation", "Avg", "BarrierflowError",
    "BlockedInputError", "BroadcastContext", "BroadcastStream", "CheckpointError", "CommitConflictError", "ConfigurationError",
    "ConnectedKeyedStreams", "Count", "DataStream", "DeadLetterReason", "DeltaSink", "DeltaSource", "EngineUnavailableError",
    "EpochInProgressError", "EventTimeSessionWindows", "FencedError", "FileSource", "IncompatibleSavepointError",
    "IntervalJoinedStreams", "JoinedStreams", "KeyedBroadcastProcessFunction", "KeyedCoProcessFunction", "KeyedContext",
    "KeyedProcessFunction", "KeyedStream", "LateFiles", "LeaseLostError", "LineParser", "ListState", "ListStateDescriptor",
    "MapState", "MapStateDescriptor", "Max", "Min", "OperatorContext", "Param", "ParameterError", "Percentile", "Pipeline",
    "PipelineBuilder", "PipelineDefinition", "PipelineDefinitionError", "PipelineStoppedError", "ProcessFunction", "QueryError",
    "RecordError", "ReducingState", "ReducingStateDescriptor", "SavepointError", "SchemaEvolutionError",
    "SlidingEventTimeWindows", "SourceError", "StateTtlConfig", "StorageError", "Sum", "TimeDomain", "TimerService",
    "TumblingEventTimeWindows", "UnknownPipelineError", "UserFunctionError", "ValueState", "ValueStateDescriptor",
    "field_with_default", "pipeline", "run_query",
]  # fmt: skip

if TYPE_CHECKING:  # what type checkers see, and the one list of where each name lives (read by _exports)
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


@functools.cache
def _exports() -> dict[str, str]:
    """Public name -> its module, read from the ``if TYPE_CHECKING:`` imports above (once, on first use)."""
    source = __spec__.loader.get_source(__name__)  # type: ignore[union-attr]
    block = next(n for n in ast.parse(source).body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    return {alias.name: str(node.module) for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'barrierflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(_exports()[name]), name)
    globals()[name] = value  # loaded once; later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """This package, keeping its public names when a submodule of the same name loads. ``bf.pipeline`` is the decorator, yet
    loading the module ``barrierflow.plan.pipeline`` would set the package's attribute ``pipeline`` to that module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in __all__ and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Pickled by name like any module: cloudpickle (shipping a user function that says ``bf.X``) knows modules by exact type.
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _Package
