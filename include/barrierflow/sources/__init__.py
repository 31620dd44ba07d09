"""Replayable sources."""

from barrierflow.sources.base import SEQ, Source, SourceBatch
from barrierflow.sources.dead_letters import DeadLetterReason
from barrierflow.sources.delta_source import DeltaSource
from barrierflow.sources.file_source import FileSource, LateFiles, LineParser, RecordError

__all__ = ["DeadLetterReason", "DeltaSource", "FileSource", "LateFiles", "LineParser", "SEQ", "RecordError", "Source", "SourceBatch"]
