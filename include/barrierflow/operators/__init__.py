"""Operators: deduplication, watermarks, running aggregates, windows, process functions."""

from barrierflow.operators.aggregate import Aggregation, Avg, Count, Max, Min, Percentile, RunningAggregate, Sum
from barrierflow.operators.base import Node
from barrierflow.operators.dedup import Deduplicate
from barrierflow.operators.process import KeyedContext, KeyedProcess, KeyedProcessFunction
from barrierflow.operators.watermark import WatermarkAssigner
from barrierflow.operators.window import TumblingEventTimeWindows, TumblingWindow

__all__ = [
    "Aggregation", "Avg", "Count", "Deduplicate", "KeyedContext", "KeyedProcess", "KeyedProcessFunction",
    "Max", "Min", "Node", "Percentile", "RunningAggregate", "Sum", "TumblingEventTimeWindows",
    "TumblingWindow", "WatermarkAssigner",
]
