"""What the checkpoints page shows, gathered from the warehouse (no web framework here).

For every pipeline in a warehouse (a subdirectory holding ``_pipeline.json``):

* the epoch history from the checkpoint log, one row per ``(lineage, epoch)``
  at its furthest status, with the metrics of its manifest;
* the lineages (``_lineages/<seq>.json``) and how many epochs each completed;
* the savepoints, from :func:`barrierflow.operations.savepoint.list_savepoints` when that
  module is installed (it is optional: the page says so when it is missing);
* per completed epoch, the **state size**: the total bytes of the live files of
  every state table at the Delta versions that epoch's checkpoint recorded (the
  consistent cut), i.e. what a restore from that epoch reads. The cumulative
  ``state_bytes_written`` is reported alongside.

Two watermark lags are given per epoch, both in milliseconds:

* ``event_time_lag_ms`` = max event time seen - watermark (how far the
  watermark trails the newest data: the out-of-orderness being waited for);
* ``processing_lag_ms`` = commit time of the epoch - watermark (how far event
  time trails the wall clock: the stream's end-to-end delay).

Everything is read-only and tolerant: a pipeline whose log cannot be read is
reported with an ``error`` rather than failing the whole page.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

from barrierflow.airflow.dags.settings import pipeline_dag_id, savepoint_dag_id
from barrierflow.checkpointing.checkpoint import RESTORE_ATTEMPT_PREFIX, CheckpointRecord, EpochStatus
from barrierflow.checkpointing.checkpoint_log import CheckpointLog, iso_us
from barrierflow.checkpointing.coordinator import backlog_report
from barrierflow.operations.query import table_uri
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

__all__ = [
    "WAREHOUSE_ENV",
    "STATE_SIZE_METHOD",
    "EpochRow",
    "LineageInfo",
    "PipelineHistory",
    "resolve_warehouse",
    "discover_pipelines",
    "pipeline_history",
    "warehouse_history",
    "dag_id_for",
    "savepoint_dag_id_for",
    "iso_us",
]

_log = logging.getLogger(__name__)

WAREHOUSE_ENV = "BARRIERFLOW_WAREHOUSE"

STATE_SIZE_METHOD = (
    "live bytes: sum of the sizes of the files of every state table at the Delta versions recorded in the epoch's checkpoint"
)

_SAVEPOINT_MODULE = "barrierflow.operations.savepoint"


def resolve_warehouse(warehouse: str | None = None) -> str:
    """The warehouse to show: ``warehouse``, else ``$BARRIERFLOW_WAREHOUSE``, else ``./warehouse``."""
    return objects.normalize_uri(warehouse or os.environ.get(WAREHOUSE_ENV) or "./warehouse")


def dag_id_for(pipeline: str) -> str:
    """The Airflow DAG id that runs a pipeline's epochs (``barrierflow_<pipeline>``)."""

    return pipeline_dag_id(pipeline)


def savepoint_dag_id_for(pipeline: str) -> str:
    """The Airflow DAG id that takes a pipeline's savepoints."""

    return savepoint_dag_id(pipeline)


@dataclass(frozen=True)
class EpochRow:
    """One epoch of one lineage at its furthest status."""

    lineage_id: str
    epoch: int
    status: str
    attempt_id: str
    recorded_at: str | None  # when the furthest status was first recorded
    recorded_at_us: int
    duration_ms: int | None
    rows_in: int | None
    rows_out: int | None
    dead_letters: int | None
    bytes_written: int | None
    state_bytes_written: int | None
    watermark: str | None
    watermark_us: int | None
    max_event_time: str | None
    event_time_lag_ms: int | None  # max event time - watermark
    processing_lag_ms: int | None  # commit (record) time - watermark
    state_bytes: int | None  # live bytes of the state tables at this epoch's versions
    state_bytes_cumulative: int | None  # running sum of state_bytes_written in this lineage
    table_versions: Mapping[str, int] = field(default_factory=dict)
    message: str = ""
    arrival_cutoff: str | None = None  # the epoch took input that arrived by then (None: all that had)
    backlog_files: int | None = None  # input its barrier left waiting (None: not measured)
    backlog_bytes: int | None = None
    input_lag_ms: int | None = None  # how long the oldest waiting input had waited when it was planned
    input_files: tuple[str, ...] = ()  # the files its barrier took (file sources)
    restore_point: bool = False  # the epoch a restore started this lineage from: recorded, not computed
    rewound: bool = False  # a completed epoch of an older lineage after the point a restore went back to
    planned_by: str = ""  # the Airflow run (dag_id:run_id) or command that planned it
    phase_ms: Mapping[str, int | None] = field(default_factory=dict)  # barrier, process, wait, stage, commit

    @property
    def completed(self) -> bool:
        return self.status == EpochStatus.COMPLETED.value

    @property
    def computed(self) -> bool:
        """A completed epoch that the engine computed (not a restore point)."""
        return self.completed and not self.restore_point

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["table_versions"] = dict(self.table_versions)
        doc["input_files"] = list(self.input_files)
        doc["phase_ms"] = dict(self.phase_ms)
        return doc


@dataclass(frozen=True)
class Failure:
    """A failed attempt (an ABORTED row of the checkpoint log)."""

    lineage_id: str
    epoch: int
    recorded_at: str | None
    message: str


@dataclass(frozen=True)
class LineageInfo:
    """One lineage of a pipeline (created, or started by a restore)."""

    lineage_id: str
    seq: str  # the document name without .json: lineages sort by it
    start_epoch: int | None
    started_at: str | None
    reason: str | None
    current: bool
    epochs_completed: int
    last_completed_epoch: int | None
    document: Mapping[str, Any] = field(default_factory=dict)  # the whole lineage document

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["document"] = dict(self.document)
        return doc


@dataclass(frozen=True)
class PipelineHistory:
    """Everything the checkpoints page shows about one pipeline."""

    pipeline: str
    warehouse: str
    dag_id: str
    savepoint_dag_id: str
    key_groups: int | None
    created_at: str | None
    current_lineage_id: str | None
    last_completed_epoch: int | None
    lineages: tuple[LineageInfo, ...]
    epochs: tuple[EpochRow, ...]  # in the order they were first recorded
    savepoints: tuple[Mapping[str, Any], ...]  # SavepointMetadata.to_json(), newest first
    savepoints_available: bool
    savepoints_error: str | None
    error: str | None
    stopped: Mapping[str, Any] | None = None  # the stop marker while stopped with a savepoint
    blocked: Mapping[str, Any] | None = None  # what blocks the pipeline (coordinator.blocked_state)
    backlog: Mapping[str, Any] | None = None  # measured now (coordinator.backlog_report); None: not asked for
    failures: tuple[Failure, ...] = ()  # every failed attempt, newest first
    state_size_method: str = STATE_SIZE_METHOD
    generated_at: str = ""

    def summary(self, recent: int = 20) -> dict[str, Any]:
        """Counts, as Flink's checkpoint history shows them, and min/avg/max over the ``recent`` newest computed epochs."""
        current = [e for e in self.epochs if e.lineage_id == self.current_lineage_id]
        computed = sorted((e for e in self.epochs if e.computed and not e.rewound), key=lambda e: e.recorded_at_us)[-recent:]

        def spread(values: list[int | None]) -> dict[str, float | None]:
            known = [v for v in values if v is not None]
            if not known:
                return {"min": None, "avg": None, "max": None}
            return {"min": min(known), "avg": sum(known) / len(known), "max": max(known)}

        return {
            "completed": sum(1 for e in current if e.computed),
            "in_progress": sum(1 for e in current if not e.completed),
            "failed": len(self.failures),
            "restored": max(0, len(self.lineages) - 1),  # every lineage after the first began with a restore
            "recent": len(computed),
            "duration_ms": spread([e.duration_ms for e in computed]),
            "bytes_written": spread([e.bytes_written for e in computed]),
            "rows_in": spread([e.rows_in for e in computed]),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "warehouse": self.warehouse,
            "dag_id": self.dag_id,
            "savepoint_dag_id": self.savepoint_dag_id,
            "key_groups": self.key_groups,
            "created_at": self.created_at,
            "current_lineage_id": self.current_lineage_id,
            "last_completed_epoch": self.last_completed_epoch,
            "lineages": [lin.to_json() for lin in self.lineages],
            "epochs": [e.to_json() for e in self.epochs],
            "savepoints": [dict(s) for s in self.savepoints],
            "savepoints_available": self.savepoints_available,
            "savepoints_error": self.savepoints_error,
            "error": self.error,
            "stopped": dict(self.stopped) if self.stopped is not None else None,
            "blocked": dict(self.blocked) if self.blocked is not None else None,
            "backlog": dict(self.backlog) if self.backlog is not None else None,
            "failures": [asdict(f) for f in self.failures],
            "summary": self.summary(),
            "state_size_method": self.state_size_method,
            "watermark_lag": {
                "event_time_lag_ms": "max event time seen - watermark",
                "processing_lag_ms": "commit time of the epoch - watermark",
            },
            "generated_at": self.generated_at,
        }


# -- discovery -----------------------------------------------------------------


def discover_pipelines(warehouse: str) -> list[str]:
    """Names of the pipelines in ``warehouse``: subdirectories holding ``_pipeline.json``."""
    root = objects.normalize_uri(warehouse)
    names = []
    for name in objects.list_dir(root):
        if name.startswith((".", "_")):
            continue
        if objects.exists(PipelineLayout.of(root, name).pipeline_meta):
            names.append(name)
    return names


# -- state size ----------------------------------------------------------------

# (table uri, version) -> live bytes. Committed versions never change, so the
# cache is only ever extended; it is bounded to keep a long-lived server small.
_SIZE_CACHE: dict[tuple[str, int], int] = {}
_SIZE_CACHE_MAX = 200_000
_SIZE_LOCK = threading.Lock()


def _live_bytes(uri: str, versions: Sequence[int]) -> dict[int, int]:
    """Live-file bytes of the Delta table at ``uri`` at each of ``versions``.

    Opens the table once at the smallest missing version and moves forward
    (delta-rs applies only the new commits), so the cost is one log replay per
    table rather than one per epoch. Versions that cannot be loaded (log
    cleaned up by retention) are left out.
    """
    out: dict[int, int] = {}
    with _SIZE_LOCK:
        missing = sorted({v for v in versions if (uri, v) not in _SIZE_CACHE})
        out.update({v: _SIZE_CACHE[(uri, v)] for v in versions if (uri, v) in _SIZE_CACHE})
    if not missing:
        return out
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table: Any = None
    computed: dict[int, int] = {}
    for version in missing:
        try:
            if table is None:
                table = DeltaTable(uri, version=version)
            else:
                table.load_as_version(version)
            adds = pa.table(table.get_add_actions(flatten=False))
            computed[version] = int(pc.sum(adds.column("size_bytes")).as_py() or 0)
        except Exception as exc:  # noqa: BLE001 - a missing version must not break the page
            _log.debug("cannot size %s at version %s: %s", uri, version, exc)
            table = None
    with _SIZE_LOCK:
        if len(_SIZE_CACHE) + len(computed) > _SIZE_CACHE_MAX:
            _SIZE_CACHE.clear()
        _SIZE_CACHE.update({(uri, v): n for v, n in computed.items()})
    out.update(computed)
    return out


def _state_sizes(layout: PipelineLayout, rows: Iterable[tuple[Any, Mapping[str, int]]]) -> dict[Any, int]:
    """Live state bytes per key of ``rows`` ((key, table_versions) of completed epochs)."""

    rows = list(rows)
    per_table: dict[str, set[int]] = {}
    for _, versions in rows:
        for name, version in versions.items():
            if "__" in name:  # state tables are <operator>__<state>; sinks and dead_letter are not
                per_table.setdefault(name, set()).add(int(version))
    sizes = {name: _live_bytes(table_uri(layout, name), sorted(vs)) for name, vs in per_table.items()}
    out: dict[Any, int] = {}
    for key, versions in rows:
        state = {n: int(v) for n, v in versions.items() if "__" in n}
        if not state or any(v not in sizes[n] for n, v in state.items()):
            continue
        out[key] = sum(sizes[n][v] for n, v in state.items())
    return out


# -- the history ---------------------------------------------------------------


def _furthest(records: Iterable[CheckpointRecord]) -> list[tuple[CheckpointRecord, int]]:
    """Per (lineage, epoch): the record of where it stands (:meth:`CheckpointLog.current_status`), and when it first appeared."""
    records = list(records)
    first_seen: dict[tuple[str, int], int] = {}
    for r in records:
        ident = (r.lineage_id, r.epoch)
        first_seen[ident] = min(first_seen.get(ident, r.recorded_at_us), r.recorded_at_us)
    ordered = sorted(CheckpointLog.current_status(records).items(), key=lambda kv: (first_seen[kv[0]], kv[0][1]))
    return [(rec, first_seen[ident]) for ident, rec in ordered]


def _lag(later_us: int | None, watermark_us: int | None) -> int | None:
    if later_us is None or watermark_us is None:
        return None
    return (later_us - watermark_us) // 1000


def _input_files(offsets: Mapping[str, Any]) -> tuple[str, ...]:
    """The files an epoch's end offsets took, over its file sources (late files set aside included)."""
    names: list[str] = []
    for end in offsets.values():
        if isinstance(end, Mapping):
            names += [f[0] for f in end.get("files") or [] if isinstance(f, (list, tuple)) and f]
            names += [f[0] for f in end.get("late") or [] if isinstance(f, (list, tuple)) and f]
    return tuple(names)


def _read_lineages(layout: PipelineLayout) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name in objects.list_dir(layout.lineages):
        if not name.endswith(".json") or name.startswith((".", "_")):
            continue
        doc = objects.read_json(objects.join_uri(layout.lineages, name)) or {}
        out.append((name[: -len(".json")], doc))
    return out


def _load_savepoints(
    pipeline: str, warehouse: str, lister: Callable[[str, str], Sequence[Any]] | None
) -> tuple[tuple[Mapping[str, Any], ...], bool, str | None]:
    """(savepoints as JSON, whether savepoint support is installed, error)."""
    if lister is None:
        try:
            module = importlib.import_module(_SAVEPOINT_MODULE)
        except ImportError:
            return (), False, None
        lister = getattr(module, "list_savepoints", None)
        if lister is None:
            return (), False, None
    try:
        found = list(lister(pipeline, warehouse))
    except Exception as exc:  # noqa: BLE001 - one broken savepoint must not break the page
        _log.warning("cannot list savepoints of %s: %s", pipeline, exc)
        return (), True, f"{type(exc).__name__}: {exc}"
    docs = [dict(sp.to_json()) if hasattr(sp, "to_json") else dict(sp) for sp in found]
    docs.sort(key=lambda d: str(d.get("created_at") or ""), reverse=True)
    return tuple(docs), True, None


def pipeline_history(
    warehouse: str,
    pipeline: str,
    *,
    state_size: bool = True,
    savepoint_lister: Callable[[str, str], Sequence[Any]] | None = None,
    backlog: bool = True,
    savepoints: bool = True,
) -> PipelineHistory:
    """The checkpoint history, lineages and savepoints of one pipeline.

    ``state_size=False`` skips opening the state tables (only the cumulative
    bytes written are reported). ``savepoint_lister`` replaces
    ``barrierflow.operations.savepoint.list_savepoints`` (tests). ``backlog`` measures
    the input waiting now (it lists the sources' input; it needs the
    pipeline's code). ``savepoints=False`` skips listing the savepoints.
    """
    warehouse = objects.normalize_uri(warehouse)
    layout = PipelineLayout.of(warehouse, pipeline)
    generated_at = iso_us(int(datetime.now(timezone.utc).timestamp() * 1e6)) or ""
    listed, available, sp_error = _load_savepoints(pipeline, warehouse, savepoint_lister) if savepoints else ((), False, None)
    error: str | None = None
    meta: dict[str, Any] = {}
    records: list[CheckpointRecord] = []
    lineage_docs: list[tuple[str, dict[str, Any]]] = []
    stopped: dict[str, Any] | None = None
    blocked: dict[str, Any] | None = None
    try:
        meta = objects.read_json(layout.pipeline_meta) or {}
        stopped = objects.read_json(layout.stopped)
        blocked = objects.read_json(layout.blocked)
        lineage_docs = _read_lineages(layout)
        records = CheckpointLog.shared(layout).records()
    except Exception as exc:  # noqa: BLE001 - show what is wrong instead of a 500
        error = f"{type(exc).__name__}: {exc}"

    furthest = _furthest(records)
    completed_keys = [((r.lineage_id, r.epoch), r.versions()) for r, _ in furthest if r.status is EpochStatus.COMPLETED]
    sizes: dict[Any, int] = {}
    if state_size and completed_keys:
        try:
            sizes = _state_sizes(layout, completed_keys)
        except Exception as exc:  # noqa: BLE001
            _log.warning("cannot compute state sizes of %s: %s", pipeline, exc)

    # A lineage's completed epochs after the point the next lineage was restored to are rewound.
    rewound_after: dict[str, int] = {}
    for (_, older), (_, newer) in zip(lineage_docs, lineage_docs[1:]):
        if newer.get("start_epoch") is not None and older.get("lineage_id"):
            rewound_after[older["lineage_id"]] = int(newer["start_epoch"])
    failures = tuple(
        Failure(r.lineage_id, r.epoch, iso_us(r.recorded_at_us), r.message)
        for r in sorted(records, key=lambda r: r.recorded_at_us, reverse=True)
        if r.status is EpochStatus.ABORTED
    )
    cumulative: dict[str, int] = {}
    rows: list[EpochRow] = []
    for r, first_us in furthest:
        done = r.status is EpochStatus.COMPLETED
        cum = None
        if done:
            cumulative[r.lineage_id] = cumulative.get(r.lineage_id, 0) + (r.state_bytes_written or 0)
            cum = cumulative[r.lineage_id]
        rows.append(
            EpochRow(
                lineage_id=r.lineage_id,
                epoch=r.epoch,
                status=r.status.value,
                attempt_id=r.attempt_id,
                recorded_at=iso_us(r.recorded_at_us),
                recorded_at_us=r.recorded_at_us,
                duration_ms=r.duration_ms,
                rows_in=r.rows_in,
                rows_out=r.rows_out,
                dead_letters=r.dead_letters,
                bytes_written=r.bytes_written,
                state_bytes_written=r.state_bytes_written,
                watermark=iso_us(r.watermark_us),
                watermark_us=r.watermark_us,
                max_event_time=iso_us(r.max_event_time_us),
                event_time_lag_ms=_lag(r.max_event_time_us, r.watermark_us),
                processing_lag_ms=_lag(r.recorded_at_us, r.watermark_us) if done else None,
                state_bytes=sizes.get((r.lineage_id, r.epoch)),
                state_bytes_cumulative=cum,
                table_versions=r.versions() if done else {},
                message=r.message or "",
                arrival_cutoff=iso_us(r.arrival_cutoff_ms * 1000) if r.arrival_cutoff_ms is not None else None,
                backlog_files=r.backlog_files,
                backlog_bytes=r.backlog_bytes,
                input_lag_ms=r.input_lag_ms,
                input_files=_input_files(r.offsets_json()),
                restore_point=r.attempt_id.startswith(RESTORE_ATTEMPT_PREFIX),
                rewound=done and r.epoch > rewound_after.get(r.lineage_id, r.epoch),
                planned_by=r.planned_by,
                phase_ms=r.phases(),
            )
        )

    current_lineage = lineage_docs[-1][1].get("lineage_id") if lineage_docs else None
    lineages = []
    for seq, doc in lineage_docs:
        lid = doc.get("lineage_id", "")
        done_epochs = [row.epoch for row in rows if row.lineage_id == lid and row.completed]
        lineages.append(
            LineageInfo(
                lineage_id=lid,
                seq=seq,
                start_epoch=doc.get("start_epoch"),
                started_at=doc.get("started_at"),
                reason=doc.get("reason"),
                current=lid == current_lineage,
                epochs_completed=len(done_epochs),
                last_completed_epoch=max(done_epochs) if done_epochs else None,
                document=doc,
            )
        )
    current_done = [row.epoch for row in rows if row.lineage_id == current_lineage and row.completed]
    return PipelineHistory(
        pipeline=pipeline,
        warehouse=warehouse,
        dag_id=dag_id_for(pipeline),
        savepoint_dag_id=savepoint_dag_id_for(pipeline),
        key_groups=meta.get("key_groups"),
        created_at=meta.get("created_at"),
        current_lineage_id=current_lineage,
        last_completed_epoch=max(current_done) if current_done else None,
        lineages=tuple(lineages),
        epochs=tuple(rows),
        savepoints=listed,
        savepoints_available=available,
        savepoints_error=sp_error,
        error=error,
        stopped=stopped,
        blocked=blocked,
        backlog=_backlog(warehouse, pipeline) if backlog and meta else None,
        failures=failures,
        generated_at=generated_at,
    )


def _backlog(warehouse: str, pipeline: str) -> dict[str, Any]:

    try:
        return backlog_report(warehouse, pipeline)
    except Exception as exc:  # noqa: BLE001 - show what is wrong instead of a 500
        return {"error": f"{type(exc).__name__}: {exc}"}


def warehouse_history(
    warehouse: str | None = None,
    *,
    pipelines: Iterable[str] | None = None,
    state_size: bool = True,
    savepoint_lister: Callable[[str, str], Sequence[Any]] | None = None,
) -> list[PipelineHistory]:
    """:func:`pipeline_history` of every pipeline in the warehouse (or of ``pipelines``)."""
    root = resolve_warehouse(warehouse)
    names = list(pipelines) if pipelines is not None else discover_pipelines(root)
    return [pipeline_history(root, name, state_size=state_size, savepoint_lister=savepoint_lister) for name in names]
