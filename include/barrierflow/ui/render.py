"""Server-rendered HTML of the checkpoints page (inline CSS, inline SVG, no scripts; auto-refresh is a meta refresh).

Pure functions of :class:`~barrierflow.ui.history.PipelineHistory` values, so
they are tested without a web server. Every value from the warehouse is
HTML-escaped.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote

from barrierflow.intervals import airflow_run_of
from barrierflow.ui.chart import (
    chart_points,
    format_bytes,
    format_ms,
    render_epoch_chart,
)
from barrierflow.ui.history import EpochRow, PipelineHistory, iso_us

__all__ = ["render_page", "render_pipeline", "DEFAULT_EPOCH_ROWS"]

DEFAULT_EPOCH_ROWS = 100
AUTO_REFRESH_S = 15

_CSS = """
:root { color-scheme: light dark; --fg:#1f2328; --muted:#636c76; --bg:#ffffff; --panel:#f6f8fa;
  --border:#d0d7de; --ok:#1a7f37; --warn:#9a6700; --bad:#cf222e; --accent:#0969da; }
@media (prefers-color-scheme: dark) { :root { --fg:#e6edf3; --muted:#8d96a0; --bg:#0d1117; --panel:#161b22;
  --border:#30363d; --ok:#3fb950; --warn:#d29922; --bad:#f85149; --accent:#4493f8; } }
* { box-sizing: border-box; }
body { margin: 0; padding: 16px 20px 40px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
a { color: var(--accent); }
.muted { color: var(--muted); } .small { font-size: 12px; }
header { display: flex; flex-wrap: wrap; gap: 8px 24px; align-items: baseline; border-bottom: 1px solid var(--border);
  padding-bottom: 10px; }
nav.bf-pipelines a { margin-right: 12px; }
section.bf-pipeline { border: 1px solid var(--border); border-radius: 8px; padding: 4px 16px 16px; margin-top: 20px; }
dl.bf-summary { display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap: 8px; margin: 8px 0; }
dl.bf-summary div { background: var(--panel); border: 1px solid var(--border); border-radius: 6px; padding: 6px 10px; }
dl.bf-summary dt { font-size: 12px; color: var(--muted); } dl.bf-summary dd { margin: 0; font-weight: 600;
  overflow-wrap: anywhere; }
.bf-table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
table.bf-epochs { font-size: 13px; }
th, td { border-bottom: 1px solid var(--border); padding: 4px 7px; text-align: right; white-space: nowrap; }
th { position: sticky; top: 0; background: var(--panel); font-weight: 600; font-size: 12px; }
td.l, th.l { text-align: left; } td.wrap { white-space: normal; overflow-wrap: anywhere; text-align: left; }
.blocked { border-left: 4px solid var(--bad); padding: .4em .8em; overflow-wrap: anywhere; }
.status { font-weight: 600; } .status-COMPLETED { color: var(--ok); } .status-ABORTED { color: var(--bad); }
.status-PLANNED, .status-PRE_COMMITTED { color: var(--warn); } .status-RESTORED { color: var(--accent); }
.status-REWOUND { color: var(--muted); } tr.bf-rewound td { color: var(--muted); }
.bf-phases { font-size: 11px; white-space: normal; max-width: 8em; margin-left: auto; }
table.bf-epochs th { white-space: normal; vertical-align: bottom; } table.bf-stats { width: auto; margin: 6px 0; } table.bf-stats caption { text-align: left; }
.bf-failure { border-left: 4px solid var(--warn); padding: .3em .8em; overflow-wrap: anywhere; }
.error { color: var(--bad); font-weight: 600; }
.bf-chart { max-width: 1100px; background: var(--panel); border: 1px solid var(--border); border-radius: 6px; }
.bf-chart .bf-axis { font-size: 11px; fill: var(--muted); }
.bf-chart .bf-grid { stroke: var(--border); stroke-width: 1; }
.bf-chart .bf-baseline { stroke: var(--muted); stroke-width: 1; }
code { font-size: 12px; }
"""


def _e(value: Any) -> str:
    return "" if value is None else escape(str(value))


def _num(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _status(status: str) -> str:
    return f'<span class="status status-{_e(status)}">{_e(status)}</span>'


def _short_time(iso: str | None, compact: bool = False) -> str:
    """``2024-01-02T03:04:05.678901Z`` -> ``2024-01-02 03:04:05Z``, or ``01-02 03:04:05`` when ``compact`` (full value in the title)."""
    if not iso:
        return ""
    text = iso.replace("T", " ")
    if "." in text:
        head, _, tail = text.partition(".")
        zone = "Z" if tail.endswith("Z") else ""
        text = head + zone
    if compact and len(text) >= 19 and text[4] == "-":
        text = text[5:19]  # the epochs table: month-day time, UTC (the header says so)
    return f'<span title="{_e(iso)}">{_e(text)}</span>'


def _cutoff_iso(ms: Any) -> str | None:
    return iso_us(int(ms) * 1000) if isinstance(ms, int) else None


def _summary(items: Iterable[tuple[str, str]]) -> str:
    cells = "".join(f"<div><dt>{_e(k)}</dt><dd>{v}</dd></div>" for k, v in items)
    return f'<dl class="bf-summary">{cells}</dl>'


def _backlog_cell(files: int | None, size: int | None) -> str:
    if files is None:
        return ""
    return "none" if files == 0 else _e(f"{files} file{'s' if files != 1 else ''}, {format_bytes(size)}")


def _backlog_summary(backlog: Mapping[str, Any] | None) -> tuple[str, str]:
    """The summary's Backlog and Input lag cells, from a backlog report measured now."""
    if not backlog:
        return "", ""
    if "error" in backlog:
        return f'<span class="muted" title="{_e(backlog["error"])}">not measured</span>', ""
    total = backlog["total"]
    sources = "; ".join(
        f"{sid}: {_backlog_cell(b['files'], b['bytes'])}" for sid, b in backlog.get("sources", {}).items()
    )
    cell = f'<span title="{_e(sources)}">{_backlog_cell(total["files"], total["bytes"])}</span>'
    return cell, _e(format_ms(total["lag_ms"])) if total["files"] else "none waiting"


def _run_link(planned_by: str) -> str:
    """The Airflow run that planned an epoch, linked to its page in the Airflow UI; a command's name as text."""
    run = airflow_run_of(planned_by) if planned_by else None
    if run is None:
        return _e(planned_by)
    dag_id, run_id = run
    kind = run_id.split("__", 1)[0] if "__" in run_id else "run"  # scheduled, manual, backfill, ...
    return f'<a href="/dags/{quote(dag_id, safe="")}/runs/{quote(run_id, safe="")}" title="{_e(planned_by)}">{_e(kind)}</a>'


def _files_cell(files: Sequence[str]) -> str:
    if not files:
        return ""
    listed = "\n".join(files[:50]) + (f"\n... {len(files) - 50} more" if len(files) > 50 else "")
    return f'<span title="{_e(listed)}">{len(files)}</span>'


_PHASES = (("barrier", "b"), ("process", "p"), ("wait", "w"), ("stage", "s"), ("commit", "c"))


def _duration_cell(r: EpochRow) -> str:
    """The epoch's duration; its phases (as Flink splits a checkpoint's time) on hover and below it."""
    known = [(name, short, r.phase_ms[name]) for name, short in _PHASES if r.phase_ms.get(name) is not None]
    if not known:
        return _e(format_ms(r.duration_ms))
    title = " · ".join(f"{name} {format_ms(ms)}" for name, _, ms in known)
    parts = " ".join(f"{short} {format_ms(ms)}" for _, short, ms in known if ms)
    return f'<span title="{_e(title)}">{_e(format_ms(r.duration_ms))}</span><div class="muted bf-phases">{_e(parts)}</div>'


def _status_cell(r: EpochRow) -> str:
    if r.restore_point:
        return '<span class="status status-RESTORED" title="the point a restore started this lineage from">RESTORE POINT</span>'
    if r.rewound:
        return '<span class="status status-REWOUND" title="completed, then undone by a restore to an earlier epoch">REWOUND</span>'
    return _status(r.status)


def _epochs_table(rows: Sequence[EpochRow], limit: int) -> str:
    newest = sorted(rows, key=lambda r: r.recorded_at_us, reverse=True)
    shown = newest[:limit]
    head = (
        "<tr><th title='hover: its lineage'>Epoch</th><th class=l>Status</th>"
        "<th title='b barrier (planning) · p process · w waiting for the epoch before · s staged writes · c commit'>Duration</th>"
        "<th>Rows in</th><th>Rows out</th><th>Dead letters</th><th>Bytes written</th>"
        "<th title='live bytes of the state tables at this epoch'>State size</th>"
        "<th title='input files its barrier took (hover: their names)'>Files</th>"
        "<th class=l title='the epoch took the input that arrived by then (UTC)'>Arrival cut-off</th>"
        "<th class=l title='UTC'>Watermark</th>"
        "<th title='max event time seen minus the watermark'>Event-time lag</th>"
        "<th title='input the barrier left waiting'>Backlog</th>"
        "<th title='how long the oldest input left waiting had waited when the epoch was planned'>Input lag</th>"
        "<th class=l title='the Airflow run that planned it'>Run</th><th class=l title='UTC'>Recorded</th></tr>"
    )
    body = []
    for r in shown:
        metrics = not r.restore_point  # a restore point is recorded, not computed: it has no metrics of its own
        body.append(
            f'<tr class="bf-epoch{" bf-rewound" if r.rewound else ""}" data-epoch="{r.epoch}" data-status="{_e(r.status)}"'
            f' data-lineage="{_e(r.lineage_id)}">'
            f'<td title="lineage {_e(r.lineage_id)}">{r.epoch}</td><td class=l>{_status_cell(r)}</td>'
            + (
                f"<td>{_duration_cell(r)}</td><td>{_num(r.rows_in)}</td><td>{_num(r.rows_out)}</td>"
                f"<td>{_num(r.dead_letters)}</td><td>{_e(format_bytes(r.bytes_written))}</td>"
                if metrics
                else "<td></td>" * 5
            )
            + f"<td>{_e(format_bytes(r.state_bytes))}</td><td>{_files_cell(r.input_files) if metrics else ''}</td>"
            f"<td class=l>{_short_time(r.arrival_cutoff, True)}</td><td class=l>{_short_time(r.watermark, True)}</td>"
            f"<td>{_e(format_ms(r.event_time_lag_ms))}</td><td>{_backlog_cell(r.backlog_files, r.backlog_bytes)}</td>"
            f"<td>{_e(format_ms(r.input_lag_ms))}</td><td class=l>{_run_link(r.planned_by)}</td>"
            f"<td class=l>{_short_time(r.recorded_at, True)}</td></tr>"
        )
    more = ""
    if len(newest) > len(shown):
        more = (
            f'<p class="muted small">Showing the newest {len(shown)} of {len(newest)} epochs; '
            f'add <code>?limit=N</code> for more, or use the JSON endpoint.</p>'
        )
    if not body:
        return '<p class="muted">No epoch has been recorded yet.</p>'
    return f'<div class="bf-table-wrap"><table class="bf-epochs"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>{more}'


def _savepoints_table(history: PipelineHistory) -> str:
    if not history.savepoints_available:
        return '<p class="muted">Savepoint support (<code>barrierflow.savepoint</code>) is not installed.</p>'
    parts = []
    if history.savepoints_error:
        parts.append(f'<p class="error">Cannot list savepoints: {_e(history.savepoints_error)}</p>')
    if not history.savepoints:
        parts.append(
            f'<p class="muted">No savepoint yet. Trigger the <code>{_e(history.savepoint_dag_id)}</code> DAG to take one.</p>'
        )
        return "".join(parts)
    head = (
        "<tr><th class=l>Name</th><th>Epoch</th>"
        "<th class=l title='input that arrived after it is what a restore replays'>Arrival cut-off</th>"
        "<th class=l>Lineage</th><th class=l>Created</th>"
        "<th>Size</th><th class=l>Stopped</th><th class=l>Description</th><th class=l>Location</th></tr>"
    )
    body = []
    for sp in history.savepoints:
        name = sp.get("name")
        body.append(
            f'<tr class="bf-savepoint" data-name="{_e(name)}"><td class=l><strong>{_e(name)}</strong></td>'
            f"<td>{_e(sp.get('epoch'))}</td><td class=l>{_short_time(_cutoff_iso(sp.get('arrival_cutoff_ms')))}</td>"
            f"<td class=l><code>{_e(sp.get('lineage_id'))}</code></td>"
            f"<td class=l>{_short_time(sp.get('created_at'))}</td><td>{_e(format_bytes(sp.get('size_bytes')))}</td>"
            f"<td class=l>{'yes' if sp.get('stopped') else 'no'}</td><td class=wrap>{_e(sp.get('description'))}</td>"
            f"<td class=wrap><code>{_e(sp.get('uri'))}</code></td></tr>"
        )
    parts.append(
        f'<div class="bf-table-wrap"><table class="bf-savepoints"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'
    )
    return "".join(parts)


def _stats_table(counts: Mapping[str, Any]) -> str:
    """Min, average and max over the recent computed epochs."""
    if not counts["recent"]:
        return ""
    rows = [
        ("Duration", counts["duration_ms"], format_ms),
        ("Bytes written", counts["bytes_written"], format_bytes),
        ("Rows in", counts["rows_in"], lambda v: _num(None if v is None else round(v))),
    ]
    body = "".join(
        f"<tr><td class=l>{label}</td>" + "".join(f"<td>{_e(fmt(spread[k]))}</td>" for k in ("min", "avg", "max")) + "</tr>"
        for label, spread, fmt in rows
    )
    return (
        f'<table class="bf-stats"><caption class="muted small">over the last {counts["recent"]} computed epochs</caption>'
        f"<thead><tr><th class=l></th><th>min</th><th>avg</th><th>max</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _lineages_table(history: PipelineHistory) -> str:
    if not history.lineages:
        return '<p class="muted">No lineage yet.</p>'
    head = (
        "<tr><th class=l>Lineage</th><th class=l>Seq</th><th>Start epoch</th><th class=l>Started</th>"
        "<th class=l>Reason</th><th>Epochs completed</th><th>Last completed</th><th class=l>Details</th></tr>"
    )
    body = []
    known = {"lineage_id", "start_epoch", "started_at", "reason"}
    for lin in sorted(history.lineages, key=lambda x: x.seq, reverse=True):
        extra = {k: v for k, v in lin.document.items() if k not in known}
        details = "<br>".join(f"<span class=muted>{_e(k)}</span> {_e(_fmt_detail(v))}" for k, v in sorted(extra.items()))
        current = ' <span class="status status-COMPLETED">current</span>' if lin.current else ""
        body.append(
            f'<tr class="bf-lineage"><td class=l><code>{_e(lin.lineage_id)}</code>{current}</td><td class=l>{_e(lin.seq)}</td>'
            f"<td>{_e(lin.start_epoch)}</td><td class=l>{_short_time(lin.started_at)}</td><td class=l>{_e(lin.reason)}</td>"
            f"<td>{lin.epochs_completed}</td><td>{_e(lin.last_completed_epoch)}</td><td class=wrap>{details}</td></tr>"
        )
    return f'<div class="bf-table-wrap"><table class="bf-lineages"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'


def _fmt_detail(value: Any) -> str:
    if isinstance(value, Mapping):
        text = ", ".join(f"{k} = {v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in sorted(value.items()))
    else:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def render_pipeline(history: PipelineHistory, *, epoch_rows: int = DEFAULT_EPOCH_ROWS) -> str:
    """The ``<section>`` of one pipeline."""
    anchor = f"pipeline-{history.pipeline}"
    completed = [e for e in history.epochs if e.completed]
    last = max(completed, key=lambda e: e.recorded_at_us) if completed else None
    stopped = ""
    if history.stopped:
        stopped = f"stopped with savepoint {history.stopped.get('savepoint', '')}"
    blocked = ""
    if history.blocked:
        b = history.blocked
        blocked = (
            f'<p class="blocked" role="alert"><b>Blocked</b> at epoch {_e(b.get("epoch"))} ({_e(b.get("step"))}) since '
            f'{_short_time(b.get("since"))}: {_e(b.get("message"))}</p>'
        )
    backlog_cell, lag_cell = _backlog_summary(history.backlog)
    counts = history.summary()
    state = _e(stopped) if stopped else "blocked" if blocked else "running" if completed else "not started"
    summary = _summary(
        [
            ("DAG", f"<code>{_e(history.dag_id)}</code>"),
            ("State", state),
            ("Current lineage", f"<code>{_e(history.current_lineage_id)}</code>"),
            ("Last completed epoch", _e(history.last_completed_epoch)),
            ("Completed (this lineage)", _e(counts["completed"])),
            ("In progress", _e(counts["in_progress"])),
            ("Failed attempts", _e(counts["failed"])),
            ("Restores", _e(counts["restored"])),
            ("Watermark", _short_time(last.watermark) if last else ""),
            ("State size", _e(format_bytes(last.state_bytes)) if last else ""),
            ("Backlog", backlog_cell),
            ("Input lag", lag_cell),
            ("Savepoints", _e(len(history.savepoints))),
            ("Key groups", _e(history.key_groups)),
        ]
    )
    failure = ""
    if history.failures:
        f = history.failures[0]
        failure = (
            f'<p class="bf-failure small"><b>Latest failure</b>: epoch {_e(f.epoch)} at {_short_time(f.recorded_at)}: '
            f"{_e(f.message)}</p>"
        )
    points, size_label = chart_points(history.epochs)
    chart = render_epoch_chart(
        points,
        chart_id=f"epoch-chart-{history.pipeline}",
        title=f"{history.pipeline}: epoch durations and {size_label}",
        size_label=size_label,
    )
    error = f'<p class="error">Cannot read the checkpoint log: {_e(history.error)}</p>' if history.error else ""
    size_note = (
        "State size: the total bytes of the live files of every state table at the Delta versions the "
        "epoch's checkpoint recorded (what a restore from that epoch reads)."
        if size_label == "state size"
        else "State bytes written (cumulative): the running sum of the state bytes each epoch committed."
    )
    return (
        f'<section class="bf-pipeline" id="{_e(anchor)}" data-pipeline="{_e(history.pipeline)}">'
        f"<h2>{_e(history.pipeline)}</h2>{error}{blocked}{summary}{failure}{_stats_table(counts)}"
        f"<h3>Epoch durations and {_e(size_label)}</h3>{chart}"
        f'<p class="muted small">{_e(size_note)} Duration: recover to commit, as recorded in the checkpoint log.</p>'
        f"<h3>Savepoints</h3>{_savepoints_table(history)}"
        f"<h3>Lineages</h3>{_lineages_table(history)}"
        f"<h3>Epochs</h3>"
        f'<p class="muted small"><b>Event-time lag</b> = max event time seen − watermark '
        f"(the out-of-orderness the watermark waits for). <b>Backlog</b>: input files the epoch's barrier left waiting; "
        f"<b>input lag</b>: how long the oldest of them had waited (by arrival time) when it was planned.</p>"
        f"{_epochs_table(history.epochs, epoch_rows)}</section>"
    )


def render_page(
    histories: Sequence[PipelineHistory],
    *,
    warehouse: str,
    generated_at_us: int | None = None,
    epoch_rows: int = DEFAULT_EPOCH_ROWS,
    user: str | None = None,
    json_href: str = "api/pipelines",
    links: Mapping[str, str] | None = None,
    refresh_s: int | None = None,
) -> str:
    """The whole HTML document; ``refresh_s`` reloads it that often (no script: a meta refresh)."""
    generated = iso_us(generated_at_us) if generated_at_us is not None else (histories[0].generated_at if histories else "")
    nav = " ".join(f'<a href="#pipeline-{_e(h.pipeline)}">{_e(h.pipeline)}</a>' for h in histories)
    extra_links = " · ".join(f'<a href="{_e(href)}">{_e(text)}</a>' for text, href in (links or {}).items())
    body = "".join(render_pipeline(h, epoch_rows=epoch_rows) for h in histories)
    if not histories:
        body = (
            '<p class="muted bf-empty">No pipeline in this warehouse yet. Each pipeline appears here after its first epoch '
            f"(a directory with <code>_pipeline.json</code> under <code>{_e(warehouse)}</code>).</p>"
        )
    who = f' · signed in as <strong>{_e(user)}</strong>' if user else ""
    refreshing = (
        f'auto-refresh every {int(refresh_s)} s (<a href="?">stop</a>)' if refresh_s
        else f'<a href="?refresh={AUTO_REFRESH_S}">auto-refresh</a>'
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        + (f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else "")
        + "<title>barrierflow · checkpoints</title>"
        f"<style>{_CSS}</style></head><body>"
        "<header><h1>barrierflow · checkpoints</h1>"
        f'<span class="muted small">warehouse <code>{_e(warehouse)}</code> · as of {_short_time(generated)}{who}</span>'
        f'<span class="small"><a href="">refresh</a> · {refreshing} · <a href="{_e(json_href)}">JSON</a>'
        f"{' · ' + extra_links if extra_links else ''}</span></header>"
        f'<nav class="bf-pipelines small">{nav}</nav>{body}</body></html>'
    )
