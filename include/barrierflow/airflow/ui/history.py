"""What the checkpoints page shows, gathered from the warehouse (no web framework here).

Per pipeline of a warehouse (a subdirectory holding ``_pipeline.json``): one row per ``(lineage, epoch)`` of the
checkpoint log at its furthest status, with its manifest's metrics; the lineages; the savepoints; and per completed
epoch the **state size**, the live bytes of every state table at the Delta versions its checkpoint recorded (what a
restore from it reads). Watermark lags per epoch, in ms: ``event_time_lag_ms`` = max event time seen - watermark (the
out-of-orderness waited for); ``processing_lag_ms`` = commit time - watermark (the end-to-end delay). Read-only and
tolerant: a pipeline whose log cannot be read is reported with an ``error`` rather than failing the page.

A DAG run's "Checkpoint" tab (:func:`run_view`) shows the epochs that run planned (barriers record ``planned_by`` =
``<dag_id>:<run_id>``), their failed attempts and the pipeline's state now, which a run's failure may cause or show."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow.compute as pc
from deltalake import DeltaTable

from barrierflow.airflow.dags.operations import xcom_json
from barrierflow.airflow.dags.settings import WAREHOUSE_ENV, pipeline_dag_id, reprocess_dag_id, restore_dag_id, savepoint_dag_id
from barrierflow.checkpointing.checkpoint import RESTORE_ATTEMPT_PREFIX, CheckpointRecord, EpochStatus
from barrierflow.checkpointing.checkpoint_log import CheckpointLog, iso_us
from barrierflow.checkpointing.coordinator import backlog_report
from barrierflow.checkpointing.intervals import airflow_owner
from barrierflow.operations.query import table_uri
from barrierflow.operations.savepoint import list_savepoints
from barrierflow.storage import objects
from barrierflow.storage.delta import add_actions
from barrierflow.storage.layout import PipelineLayout

__all__ = ["EpochRow", "PipelineHistory", "RunView", "resolve_warehouse", "discover_pipelines", "pipeline_history", "run_view"]

_log = logging.getLogger(__name__)

STATE_SIZE_METHOD = (
    "live bytes: sum of the sizes of the files of every state table at the Delta versions recorded in the epoch's checkpoint"
)


def resolve_warehouse(warehouse: str | None = None) -> str:
    """The warehouse to show: ``warehouse``, else ``$BARRIERFLOW_WAREHOUSE``, else ``./warehouse``."""
    return objects.normalize_uri(warehouse or os.environ.get(WAREHOUSE_ENV) or "./warehouse")


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
    savepoints_available: bool  # False: not listed (not asked for)
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
        watermark_lag = {
            "event_time_lag_ms": "max event time seen - watermark",
            "processing_lag_ms": "commit time of the epoch - watermark",
        }
        return {**xcom_json(asdict(self)), "summary": self.summary(), "watermark_lag": watermark_lag}


def discover_pipelines(warehouse: str) -> list[str]:
    """Names of the pipelines in ``warehouse``: subdirectories holding ``_pipeline.json``."""
    root = objects.normalize_uri(warehouse)
    names = [name for name in objects.list_dir(root) if not name.startswith((".", "_"))]
    return [name for name in names if objects.exists(PipelineLayout.of(root, name).pipeline_meta)]


# (table uri, version) -> live bytes. Committed versions never change: the cache only grows, bounded for a long-lived server.
_SIZE_CACHE: dict[tuple[str, int], int] = {}
_SIZE_CACHE_MAX = 200_000
_SIZE_LOCK = threading.Lock()


def _live_bytes(uri: str, versions: Sequence[int]) -> dict[int, int]:
    """Live-file bytes of the Delta table at ``uri`` at each of ``versions`` (left out: versions retention removed). Opens the
    table once at the smallest missing version and moves forward (delta-rs applies only new commits): one log replay per table."""
    with _SIZE_LOCK:
        out = {v: _SIZE_CACHE[(uri, v)] for v in versions if (uri, v) in _SIZE_CACHE}
    table: Any = None
    computed: dict[int, int] = {}
    for version in sorted(set(versions) - set(out)):
        try:
            if table is None:
                table = DeltaTable(uri, version=version)
            else:
                table.load_as_version(version)
            computed[version] = int(pc.sum(add_actions(table).column("size_bytes")).as_py() or 0)
        except Exception as exc:  # noqa: BLE001 - a missing version must not break the page
            _log.debug("cannot size %s at version %s: %s", uri, version, exc)
            table = None
    with _SIZE_LOCK:
        if len(_SIZE_CACHE) + len(computed) > _SIZE_CACHE_MAX:
            _SIZE_CACHE.clear()
        _SIZE_CACHE.update({(uri, v): n for v, n in computed.items()})
    return out | computed


def _state_sizes(layout: PipelineLayout, completed: Sequence[CheckpointRecord]) -> dict[tuple[str, int], int]:
    """Live state bytes per (lineage, epoch) of ``completed`` epochs; state tables are ``<operator>__<state>``."""
    states = {(r.lineage_id, r.epoch): {n: int(v) for n, v in r.versions().items() if "__" in n} for r in completed}
    tables = {name for state in states.values() for name in state}
    sizes = {n: _live_bytes(table_uri(layout, n), sorted({s[n] for s in states.values() if n in s})) for n in tables}
    return {
        key: sum(sizes[n][v] for n, v in state.items())
        for key, state in states.items()
        if state and all(v in sizes[n] for n, v in state.items())
    }


def _furthest(records: list[CheckpointRecord]) -> list[CheckpointRecord]:
    """Per (lineage, epoch) in the order they first appeared: the record of where it stands (``CheckpointLog.current_status``)."""
    first_seen = {(r.lineage_id, r.epoch): r.recorded_at_us for r in sorted(records, key=lambda r: -r.recorded_at_us)}
    ordered = sorted(CheckpointLog.current_status(records).items(), key=lambda kv: (first_seen[kv[0]], kv[0][1]))
    return [rec for _, rec in ordered]


def _lag(later_us: int | None, watermark_us: int | None) -> int | None:
    return None if later_us is None or watermark_us is None else (later_us - watermark_us) // 1000


def _input_files(offsets: Mapping[str, Any]) -> tuple[str, ...]:
    """The files an epoch's end offsets took, over its file sources (late files set aside included)."""
    ends = [end for end in offsets.values() if isinstance(end, Mapping)]
    return tuple(
        f[0] for end in ends for key in ("files", "late") for f in end.get(key) or [] if isinstance(f, (list, tuple)) and f
    )


def _read_lineages(layout: PipelineLayout) -> list[tuple[str, dict[str, Any]]]:
    names = [n for n in objects.list_dir(layout.lineages) if n.endswith(".json") and not n.startswith((".", "_"))]
    return [(name.removesuffix(".json"), objects.read_json(objects.join_uri(layout.lineages, name)) or {}) for name in names]


def _load_savepoints(
    pipeline: str, warehouse: str, lister: Callable[[str, str], Sequence[Any]]
) -> tuple[tuple[Mapping[str, Any], ...], str | None]:
    """(savepoints as JSON, newest first; error)."""
    try:
        found = list(lister(pipeline, warehouse))
    except Exception as exc:  # noqa: BLE001 - one broken savepoint must not break the page
        _log.warning("cannot list savepoints of %s: %s", pipeline, exc)
        return (), f"{type(exc).__name__}: {exc}"
    docs = [dict(sp.to_json()) if hasattr(sp, "to_json") else dict(sp) for sp in found]
    return tuple(sorted(docs, key=lambda d: str(d.get("created_at") or ""), reverse=True)), None


def _backlog(warehouse: str, pipeline: str) -> dict[str, Any]:
    try:
        return backlog_report(warehouse, pipeline)
    except Exception as exc:  # noqa: BLE001 - show what is wrong instead of a 500
        return {"error": f"{type(exc).__name__}: {exc}"}


# The EpochRow fields a checkpoint record holds as they are.
_AS_RECORDED = (
    "lineage_id epoch attempt_id recorded_at_us duration_ms rows_in rows_out dead_letters bytes_written"
    " state_bytes_written watermark_us backlog_files backlog_bytes input_lag_ms planned_by"
).split()


def _epoch_row(r: CheckpointRecord, state_bytes: int | None, cumulative: int | None, rewound_after: int | None) -> EpochRow:
    done = r.status is EpochStatus.COMPLETED
    return EpochRow(
        **{name: getattr(r, name) for name in _AS_RECORDED},
        status=r.status.value,
        recorded_at=iso_us(r.recorded_at_us),
        watermark=iso_us(r.watermark_us),
        max_event_time=iso_us(r.max_event_time_us),
        event_time_lag_ms=_lag(r.max_event_time_us, r.watermark_us),
        processing_lag_ms=_lag(r.recorded_at_us, r.watermark_us) if done else None,
        state_bytes=state_bytes,
        state_bytes_cumulative=cumulative,
        table_versions=r.versions() if done else {},
        message=r.message or "",
        arrival_cutoff=iso_us(r.arrival_cutoff_ms * 1000) if r.arrival_cutoff_ms is not None else None,
        input_files=_input_files(r.offsets_json()),
        restore_point=r.attempt_id.startswith(RESTORE_ATTEMPT_PREFIX),
        rewound=done and rewound_after is not None and r.epoch > rewound_after,
        phase_ms=r.phases(),
    )


def pipeline_history(
    warehouse: str,
    pipeline: str,
    *,
    state_size: bool = True,
    savepoint_lister: Callable[[str, str], Sequence[Any]] | None = None,
    backlog: bool = True,
    savepoints: bool = True,
) -> PipelineHistory:
    """The checkpoint history, lineages and savepoints of one pipeline. ``state_size=False`` skips opening the state tables (only
    the cumulative bytes written are reported); ``savepoint_lister`` replaces ``list_savepoints`` (tests); ``backlog`` measures
    the input waiting now (it needs the pipeline's code); ``savepoints=False`` skips listing the savepoints."""
    warehouse = objects.normalize_uri(warehouse)
    layout = PipelineLayout.of(warehouse, pipeline)
    generated_at = iso_us(int(datetime.now(timezone.utc).timestamp() * 1e6)) or ""
    listed, sp_error = _load_savepoints(pipeline, warehouse, savepoint_lister or list_savepoints) if savepoints else ((), None)
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
    sizes: dict[tuple[str, int], int] = {}
    if state_size:
        try:
            sizes = _state_sizes(layout, [r for r in furthest if r.status is EpochStatus.COMPLETED])
        except Exception as exc:  # noqa: BLE001
            _log.warning("cannot compute state sizes of %s: %s", pipeline, exc)

    # A lineage's completed epochs after the point the next lineage was restored to are rewound.
    rewound_after = {
        older["lineage_id"]: int(newer["start_epoch"])
        for (_, older), (_, newer) in zip(lineage_docs, lineage_docs[1:])
        if newer.get("start_epoch") is not None and older.get("lineage_id")
    }
    cumulative: dict[str, int] = {}
    rows: list[EpochRow] = []
    for r in furthest:
        if r.status is EpochStatus.COMPLETED:
            cumulative[r.lineage_id] = cumulative.get(r.lineage_id, 0) + (r.state_bytes_written or 0)
        cum = cumulative[r.lineage_id] if r.status is EpochStatus.COMPLETED else None
        rows.append(_epoch_row(r, sizes.get((r.lineage_id, r.epoch)), cum, rewound_after.get(r.lineage_id)))

    def completed_in(lineage_id: str | None) -> list[int]:
        return [row.epoch for row in rows if row.lineage_id == lineage_id and row.completed]

    current_lineage = lineage_docs[-1][1].get("lineage_id") if lineage_docs else None
    lineages = tuple(
        LineageInfo(
            lineage_id=doc.get("lineage_id", ""),
            seq=seq,
            start_epoch=doc.get("start_epoch"),
            started_at=doc.get("started_at"),
            reason=doc.get("reason"),
            current=doc.get("lineage_id", "") == current_lineage,
            epochs_completed=len(completed_in(doc.get("lineage_id", ""))),
            last_completed_epoch=max(completed_in(doc.get("lineage_id", "")), default=None),
            document=doc,
        )
        for seq, doc in lineage_docs
    )
    return PipelineHistory(
        pipeline=pipeline,
        warehouse=warehouse,
        dag_id=pipeline_dag_id(pipeline),
        savepoint_dag_id=savepoint_dag_id(pipeline),
        key_groups=meta.get("key_groups"),
        created_at=meta.get("created_at"),
        current_lineage_id=current_lineage,
        last_completed_epoch=max(completed_in(current_lineage), default=None),
        lineages=lineages,
        epochs=tuple(rows),
        savepoints=listed,
        savepoints_available=savepoints,
        savepoints_error=sp_error,
        error=error,
        stopped=stopped,
        blocked=blocked,
        backlog=_backlog(warehouse, pipeline) if backlog and meta else None,
        failures=tuple(
            Failure(r.lineage_id, r.epoch, iso_us(r.recorded_at_us), r.message)
            for r in sorted(records, key=lambda r: r.recorded_at_us, reverse=True)
            if r.status is EpochStatus.ABORTED
        ),
        generated_at=generated_at,
    )


# What each barrierflow DAG does for its pipeline: role -> its DAG id.
ROLES = {"pipeline": pipeline_dag_id, "savepoint": savepoint_dag_id, "restore": restore_dag_id, "reprocess": reprocess_dag_id}


def find_pipeline(dag_id: str, pipelines: Iterable[str]) -> tuple[str, str] | None:
    """(pipeline, role) of the barrierflow DAG ``dag_id`` among ``pipelines``; None for any other DAG."""
    return next(((name, role) for name in pipelines for role, dag_id_of in ROLES.items() if dag_id_of(name) == dag_id), None)


@dataclass(frozen=True)
class RunView:
    """The epochs one DAG run planned, at their furthest status."""

    dag_id: str
    run_id: str
    pipeline: str | None  # None: not a DAG of a pipeline in this warehouse
    role: str | None
    epochs: tuple[EpochRow, ...] = ()  # by lineage order of recording, then epoch
    failures: tuple[Failure, ...] = ()  # failed attempts of those epochs, newest first
    blocked: Mapping[str, Any] | None = None  # the pipeline's blocked state now (coordinator.blocked_state)
    stopped: Mapping[str, Any] | None = None  # the stop marker now, while stopped with a savepoint
    current_lineage_id: str | None = None
    error: str | None = None  # the pipeline's history could not be read

    def to_json(self) -> dict[str, Any]:
        return xcom_json(asdict(self))


def run_view(dag_id: str, run_id: str, found: tuple[str, str] | None, history: PipelineHistory | None) -> RunView:
    """What run ``run_id`` of ``dag_id`` did to its pipeline (``found`` by :func:`find_pipeline`)."""
    if found is None or history is None:
        return RunView(dag_id, run_id, None, None)
    owner = airflow_owner(dag_id, run_id)
    epochs = tuple(sorted((e for e in history.epochs if e.planned_by == owner), key=lambda e: e.recorded_at_us))
    planned = {(e.lineage_id, e.epoch) for e in epochs}
    failures = tuple(f for f in history.failures if (f.lineage_id, f.epoch) in planned)
    return RunView(
        dag_id, run_id, *found, epochs, failures, history.blocked, history.stopped, history.current_lineage_id, history.error
    )
