"""Server-rendered HTML of the checkpoints page: Jinja2 templates in ``ui/templates`` (inline CSS and SVG, no script).

Pure functions of :class:`~barrierflow.airflow.ui.history.PipelineHistory` values, tested without a web server. The
templates are autoescaped: every value from the warehouse is HTML-escaped unless it is markup built here (the chart,
whose module escapes its own labels); auto-refresh is a meta refresh."""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping, Sequence
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from barrierflow.airflow.ui.chart import chart_points, format_bytes, format_ms, render_epoch_chart
from barrierflow.airflow.ui.history import EpochRow, PipelineHistory, RunView, iso_us
from barrierflow.checkpointing.intervals import airflow_run_of

__all__ = ["render_page", "render_pipeline", "render_run", "epoch_anchor", "DEFAULT_EPOCH_ROWS"]

DEFAULT_EPOCH_ROWS = 100
AUTO_REFRESH_S = 15

_PHASES = (("barrier", "b"), ("process", "p"), ("wait", "w"), ("stage", "s"), ("commit", "c"))
# What each role's runs do, and why such a run may have planned no epoch.
_ROLES = {
    "pipeline": ("epoch run", " (no new input up to its arrival cut-off, or it has not reached its barrier yet)"),
    "reprocess": ("reprocess run", " (nothing to replay, or it has not replayed one yet)"),
    "savepoint": ("savepoint run", ": savepoints copy the last completed epoch; see the checkpoints page"),
    "restore": ("restore run", ": a restore starts a new lineage from a savepoint; see the checkpoints page"),
}


def _render(template: str, **values: Any) -> str:
    return _templates().get_template(template).render(**values)


@functools.lru_cache(maxsize=1)
def _templates() -> Environment:
    """The page's Jinja2 templates (``ui/templates``), autoescaped, strict about undefined names."""
    env = Environment(
        loader=PackageLoader("barrierflow.airflow.ui", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html", "j2"), default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ms=format_ms,
        bytes=format_bytes,
        num=lambda value: "" if value is None else f"{round(value):,}",
        short_time=_short_time,
        cutoff_iso=lambda ms: iso_us(int(ms) * 1000) if isinstance(ms, int) else None,
        urlquote=lambda value: quote(str(value), safe=""),
    )
    env.globals.update(run_of=airflow_run_of, phases=_phases, lineage_details=_lineage_details, epoch_anchor=epoch_anchor)
    return env


def epoch_anchor(pipeline: str, row: EpochRow) -> str:
    """The id of an epoch's row on the checkpoints page (the run page links to it)."""
    return f"epoch-{pipeline}-{row.lineage_id}-{row.epoch}"


def _short_time(iso: str, compact: bool = False) -> str:
    """``2024-01-02T03:04:05.678901Z`` -> ``2024-01-02 03:04:05Z``, or ``01-02 03:04:05`` when ``compact``."""
    head, dot, tail = iso.replace("T", " ").partition(".")
    text = head + ("Z" if dot and tail.endswith("Z") else "")
    if compact and len(text) >= 19 and text[4] == "-":
        text = text[5:19]  # the epochs table: month-day time, UTC (its headers say so)
    return text


def _phases(phase_ms: Mapping[str, int | None]) -> list[tuple[str, str, int]]:
    """(name, short name, ms) of the phases an epoch recorded, as Flink splits a checkpoint's time."""
    return [(name, short, ms) for name, short in _PHASES if (ms := phase_ms.get(name)) is not None]


def _lineage_details(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The lineage document's other fields, each as readable text (nested values as JSON, long ones cut)."""

    def text(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, default=str)

    out = []
    for key, value in sorted(document.items()):
        if key not in ("lineage_id", "start_epoch", "started_at", "reason"):
            shown = ", ".join(f"{k} = {text(v)}" for k, v in sorted(value.items())) if isinstance(value, Mapping) else text(value)
            out.append((key, shown if len(shown) <= 120 else shown[:117] + "..."))
    return out


def render_pipeline(history: PipelineHistory, *, epoch_rows: int = DEFAULT_EPOCH_ROWS) -> str:
    """The ``<section>`` of one pipeline (``templates/pipeline.html.j2``)."""
    completed = [e for e in history.epochs if e.completed]
    if history.stopped:
        state = f"stopped with savepoint {history.stopped.get('savepoint', '')}"
    else:
        state = "blocked" if history.blocked else "running" if completed else "not started"
    points, size_label = chart_points(history.epochs)
    title = f"{history.pipeline}: epoch durations and {size_label}"
    # The chart module builds its SVG from numbers and escaped labels.
    chart = Markup(render_epoch_chart(points, chart_id=f"epoch-chart-{history.pipeline}", title=title, size_label=size_label))
    size_note = (
        "State size: the total bytes of the live files of every state table at the Delta versions the "
        "epoch's checkpoint recorded (what a restore from that epoch reads)."
        if size_label == "state size"
        else "State bytes written (cumulative): the running sum of the state bytes each epoch committed."
    )
    newest = sorted(history.epochs, key=lambda r: r.recorded_at_us, reverse=True)
    return _render(
        "pipeline.html.j2",
        history=history,
        state=state,
        last=max(completed, key=lambda e: e.recorded_at_us, default=None),
        counts=history.summary(),
        chart=chart,
        size_label=size_label,
        size_note=size_note,
        epochs=newest[:epoch_rows],
        hidden=max(0, len(newest) - epoch_rows),
    )


def render_page(
    histories: Sequence[PipelineHistory],
    *,
    warehouse: str,
    generated_at_us: int | None = None,
    epoch_rows: int = DEFAULT_EPOCH_ROWS,
    user: str | None = None,
    json_href: str = "api/pipelines",
    refresh_s: int | None = None,
) -> str:
    """The whole HTML document (``templates/page.html.j2``); ``refresh_s`` reloads it that often."""
    generated = iso_us(generated_at_us) if generated_at_us is not None else (histories[0].generated_at if histories else "")
    return _render(
        "page.html.j2",
        histories=histories,
        sections=[Markup(render_pipeline(h, epoch_rows=epoch_rows)) for h in histories],
        warehouse=warehouse,
        generated=generated,
        user=user,
        json_href=json_href,
        refresh_s=int(refresh_s) if refresh_s else None,
        auto_refresh_s=AUTO_REFRESH_S,
    )


def render_run(view: RunView, *, warehouse: str) -> str:
    """The "Checkpoint" tab of one Airflow DAG run (``templates/run.html.j2``)."""
    role_text, no_epoch_reason = _ROLES.get(view.role or "", ("run", ""))
    return _render("run.html.j2", view=view, warehouse=warehouse, role_text=role_text, no_epoch_reason=no_epoch_reason)
