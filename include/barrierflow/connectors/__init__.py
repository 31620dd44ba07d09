"""Connectors: replayable sources (files landing in a directory, a Delta table's versions) and the Delta sink."""

from barrierflow.connectors.delta_sink import DeltaSink, SinkNode
from barrierflow.connectors.delta_source import DeltaSource
from barrierflow.connectors.file_source import FileSource, LateFiles, LineParser, RecordError
from barrierflow.connectors.source import FileRange, Source, Split

__all__ = [
    "DeltaSink", "DeltaSource", "FileRange", "FileSource", "LateFiles", "LineParser", "RecordError", "SinkNode", "Source", "Split",
]  # fmt: skip
