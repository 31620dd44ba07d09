"""The savepoint format: ``<warehouse>/_savepoints/<pipeline>/<name>/``, outside every table (vacuum never touches it)::

    _savepoint.json                                    metadata, written last: the savepoint exists once it does
    <attempt>/state/<operator>/<state>/part-*.parquet  compacted state: one live row per key
    <attempt>/sinks/<name>/part-*.parquet              upsert sinks' rows at the cut (for rewinds)

It holds all a restore needs (state with the sources' offsets, watermark, key groups, operator ids, state schemas), so it can be
copied to another warehouse. The metadata's ``offsets`` copy the checkpoint record's (see ``restore`` step 2)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.core.errors import SavepointError
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

__all__ = [
    "SavepointMetadata", "StateSnapshot", "SinkSnapshot", "snapshot_chunks", "snapshot_schema", "load_savepoint",
    "list_savepoints", "check_name", "read_savepoint", "FORMAT_VERSION", "METADATA_FILE",
]  # fmt: skip

FORMAT_VERSION = 1
METADATA_FILE = "_savepoint.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class StateSnapshot:
    """One state table in a savepoint: where its rows are and what they look like."""

    operator_id: str
    state: str
    schema: tuple[tuple[str, str], ...]  # (column, Arrow type) of the table's rows
    rows: int
    files: tuple[str, ...]  # relative to the savepoint directory

    @property
    def name(self) -> str:
        return f"{self.operator_id}/{self.state}"


@dataclass(frozen=True)
class SinkSnapshot:
    """A sink at the savepoint's cut: its mode, and for upserts a copy of its rows."""

    name: str
    mode: str  # append | upsert | dead_letter
    rows: int
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class SavepointMetadata:
    name: str
    pipeline: str
    uri: str
    epoch: int
    lineage_id: str
    created_at: str
    description: str
    key_groups: int
    offsets: Mapping[str, Any]
    watermark_us: int | None
    max_event_time_us: int | None
    params: Mapping[str, Any]
    operators: tuple[str, ...]
    states: tuple[StateSnapshot, ...]
    sinks: tuple[SinkSnapshot, ...]
    size_bytes: int
    stopped: bool = False
    format_version: int = FORMAT_VERSION
    # Input that arrived after the restore point's cut-off is what a restore replays (None: all had arrived).
    arrival_cutoff_ms: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], uri: str | None = None) -> "SavepointMetadata":
        fields = dict(doc)
        if fields.get("format_version") != FORMAT_VERSION:
            raise SavepointError(
                f"savepoint {fields.get('name')!r} has format version {fields.get('format_version')}; "
                f"this release reads version {FORMAT_VERSION}"
            )
        fields["states"] = tuple(
            StateSnapshot(**{**s, "schema": tuple(tuple(c) for c in s["schema"]), "files": tuple(s["files"])})
            for s in doc["states"]
        )
        fields["sinks"] = tuple(SinkSnapshot(**{**s, "files": tuple(s["files"])}) for s in doc["sinks"])
        fields["operators"] = tuple(doc["operators"])
        if uri is not None:
            fields["uri"] = uri  # where it is now, if it was copied
        return cls(**fields)


def snapshot_chunks(metadata: SavepointMetadata, files: tuple[str, ...]) -> Iterator[pa.Table]:
    """The rows of a state or sink snapshot, one file at a time (nothing for no files)."""
    for f in files:
        try:
            filesystem, path = objects.arrow_filesystem(objects.join_uri(metadata.uri, f))
            yield pq.read_table(path, filesystem=filesystem)
        except OSError as exc:
            raise SavepointError(f"savepoint {metadata.name!r} is incomplete: {exc}") from exc


def snapshot_schema(metadata: SavepointMetadata, files: tuple[str, ...]) -> pa.Schema | None:
    """The schema of a state or sink snapshot (of its first file); None for no files."""
    if not files:
        return None
    filesystem, path = objects.arrow_filesystem(objects.join_uri(metadata.uri, files[0]))
    return pq.read_schema(path, filesystem=filesystem)


def load_savepoint(pipeline: str, warehouse: str, savepoint: str) -> SavepointMetadata:
    """A savepoint by name (in this warehouse) or by the path of its directory."""
    layout = PipelineLayout.of(warehouse, pipeline)
    candidates = [layout.savepoint(savepoint)] if _NAME.match(savepoint) else []
    if "/" in savepoint or savepoint.startswith("file:"):
        candidates.append(objects.normalize_uri(savepoint))
    for metadata in filter(None, map(read_savepoint, candidates)):
        if metadata.pipeline != pipeline:
            raise SavepointError(f"savepoint {savepoint!r} belongs to pipeline {metadata.pipeline}, not {pipeline}")
        return metadata
    known = ", ".join(m.name for m in list_savepoints(pipeline, warehouse)) or "none"
    raise SavepointError(
        f"no savepoint {savepoint!r} for pipeline {pipeline} (give a name from {layout.savepoints} "
        f"or the path of a savepoint directory; known: {known})"
    )


def list_savepoints(pipeline: str, warehouse: str) -> list[SavepointMetadata]:
    """Every complete savepoint of ``pipeline`` in the warehouse, oldest first."""
    layout = PipelineLayout.of(warehouse, pipeline)
    # A name starting with "." is a savepoint being written, or the debris of a crashed one.
    uris = [layout.savepoint(entry) for entry in objects.list_dir(layout.savepoints) if not entry.startswith(".")]
    return sorted(filter(None, map(read_savepoint, uris)), key=lambda m: (m.created_at, m.name))


def read_savepoint(uri: str) -> SavepointMetadata | None:
    """The savepoint in directory ``uri``, or None if it has no metadata (no complete savepoint)."""
    doc = objects.read_json(objects.join_uri(uri, METADATA_FILE))
    return SavepointMetadata.from_json(doc, uri=uri) if doc is not None else None


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise SavepointError(
            f"savepoint name {name!r} is invalid: use 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
