"""Connectors: replayable sources, the Delta sink (two-phase commit) and dead letters."""

from barrierflow.connectors.dead_letters import DeadLetterReason
from barrierflow.connectors.delta_sink import DEAD_LETTER_SCHEMA, DeltaSink, SinkNode
from barrierflow.connectors.delta_source import DeltaSource
from barrierflow.connectors.file_source import FileSource, LateFiles, LineParser, RecordError
from barrierflow.connectors.source import SEQ, Source, SourceBatch

__all__ = [
    "DEAD_LETTER_SCHEMA", "DeadLetterReason", "DeltaSink", "DeltaSource", "FileSource", "LateFiles", "LineParser", "SEQ",
    "RecordError", "SinkNode", "Source", "SourceBatch",
]
