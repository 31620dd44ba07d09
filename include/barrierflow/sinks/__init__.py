"""Two-phase-commit sinks."""

from barrierflow.sinks.delta_sink import DEAD_LETTER_SCHEMA, DeltaSink, SinkNode

__all__ = ["DEAD_LETTER_SCHEMA", "DeltaSink", "SinkNode"]
