"""Replayable sources."""

from barrierflow.sources.base import POSITION_COLUMNS, Source, SourceBatch
from barrierflow.sources.delta_source import DeltaSource
from barrierflow.sources.file_source import FileSource, LineParser, RecordError

__all__ = ["DeltaSource", "FileSource", "LineParser", "POSITION_COLUMNS", "RecordError", "Source", "SourceBatch"]
