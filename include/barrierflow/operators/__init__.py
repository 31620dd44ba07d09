"""Operators: stateless transformations, unions, deduplication, watermarks, running aggregates, windows, process functions (keyed, and non-keyed with operator state)."""

from barrierflow.operators.aggregate import Aggregation, Avg, Count, Max, Min, Percentile, RunningAggregate, Sum
from barrierflow.operators.base import Node
from barrierflow.operators.co_process import KeyedCoProcess, KeyedCoProcessFunction
from barrierflow.operators.dedup import Deduplicate
from barrierflow.operators.operator_state import OperatorContext, OperatorProcess, ProcessFunction
from barrierflow.operators.process import KeyedContext, KeyedProcess, KeyedProcessFunction
from barrierflow.operators.stateless import Filter, FlatMapColumn, FlatMapFunction, MapColumns, MapFunction, Select
from barrierflow.operators.union import Union
from barrierflow.operators.watermark import WatermarkAssigner
from barrierflow.operators.window import (
    AlignedWindow,
    EventTimeSessionWindows,
    SessionWindow,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingWindow,
)

__all__ = [
    "Aggregation", "AlignedWindow", "Avg", "Count", "Deduplicate", "EventTimeSessionWindows", "Filter", "FlatMapColumn",
    "FlatMapFunction", "KeyedCoProcess", "KeyedCoProcessFunction", "KeyedContext", "KeyedProcess", "KeyedProcessFunction", "MapColumns", "MapFunction", "Max", "Min",
    "Node", "OperatorContext", "OperatorProcess", "Percentile", "ProcessFunction", "RunningAggregate", "Select", "SessionWindow", "SlidingEventTimeWindows", "Sum",
    "TumblingEventTimeWindows", "TumblingWindow", "Union", "WatermarkAssigner",
]
