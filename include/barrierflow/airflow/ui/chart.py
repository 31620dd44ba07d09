"""An inline SVG chart of epoch durations and state size, rendered in Python.

No JavaScript, no external assets (it works offline and in Airflow's sandboxed iframe). Bars: epoch durations (left
axis, s); line: state size (right axis, bytes) per completed epoch; dashed rules: where a lineage (a restore) begins."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Sequence

from barrierflow.airflow.ui.history import EpochRow

__all__ = ["ChartPoint", "chart_points", "render_epoch_chart", "format_bytes", "format_ms", "nice_ceiling", "nice_bytes_ceiling"]

_W, _H = 960, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 80, 34, 44
_PLOT_W, _PLOT_H = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
_BAR = "#4c78a8"
_LINE = "#e45756"
_RULE = "#9aa0a6"


@dataclass(frozen=True)
class ChartPoint:
    label: str  # epoch number as shown on the x axis
    lineage_id: str
    duration_ms: int | None
    state_bytes: int | None


def format_bytes(n: int | float | None) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def format_ms(ms: int | float | None) -> str:
    """A duration in milliseconds as ``850 ms``, ``4.4 s``, ``3 min 5 s``, ``2 h 5 min`` or ``3 d 4 h``."""
    if ms is None:
        return ""
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{int(ms)} ms"
    s = ms / 1000
    if s < 60:
        return f"{sign}{s:.1f} s"
    if s < 3600:
        return f"{sign}{int(s // 60)} min {int(s % 60)} s"
    if s < 86400:
        return f"{sign}{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{sign}{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= ``value`` (> 0)."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    return float(next(m * 10**exp for m in (1, 2, 2.5, 5, 10) if m * 10**exp >= value * (1 - 1e-12)))


def nice_bytes_ceiling(value: float) -> float:
    """:func:`nice_ceiling` in the binary unit of ``value`` (so axis labels read 10 KiB, 20 KiB...)."""
    if value <= 0:
        return 1.0
    unit = 1.0
    while value / unit >= 1024 and unit < 1024**4:
        unit *= 1024
    return nice_ceiling(value / unit) * unit


def chart_points(epochs: Sequence[EpochRow], limit: int = 200) -> tuple[list[ChartPoint], str]:
    """The completed epochs in commit order (the last ``limit``), and the size series' name: the live state size, or when no epoch
    has one (not computed) the cumulative state bytes written, never a mix of both."""
    done = sorted((e for e in epochs if e.completed), key=lambda e: e.recorded_at_us)[-limit:]
    live = any(e.state_bytes is not None for e in done)
    points = [
        ChartPoint(str(e.epoch), e.lineage_id, e.duration_ms, e.state_bytes if live else e.state_bytes_cumulative) for e in done
    ]
    return points, ("state size" if live else "state bytes written (cumulative)")


def _svg(chart_id: str, label: str, cls: str, height: int) -> str:
    return (
        f'<svg id="{escape(chart_id)}" class="{cls}" role="img" aria-label="{escape(label)}" '
        f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height}" width="100%" preserveAspectRatio="xMinYMin meet">'
    )


def _text(x: object, y: object, text: str, anchor: str = "") -> str:
    """An axis label; ``x`` and ``y`` as they are written."""
    anchored = f' text-anchor="{anchor}"' if anchor else ""
    return f'<text x="{x}" y="{y}"{anchored} class="bf-axis">{escape(text)}</text>'


def render_epoch_chart(
    points: Sequence[ChartPoint], *, chart_id: str = "epoch-chart", title: str = "", size_label: str = "state size"
) -> str:
    """The SVG element (a string) for ``points``; a short message when there are none."""
    label = title or "Epoch durations and state size"
    if not points:
        return (
            _svg(chart_id, label, "bf-chart bf-chart-empty", 60)
            + _text(_W // 2, 34, "no completed epoch yet", "middle")
            + "</svg>"
        )
    n, base = len(points), _TOP + _PLOT_H
    slot = _PLOT_W / n
    bar_w = max(1.0, min(36.0, slot * 0.7))
    durations_s = [(p.duration_ms or 0) / 1000 for p in points]
    dmax = nice_ceiling(max(durations_s) or 1.0)
    sizes = [p.state_bytes for p in points if p.state_bytes is not None]
    smax = nice_bytes_ceiling(max(sizes)) if sizes and max(sizes) > 0 else 1.0

    def x_of(i: int) -> float:
        return _LEFT + slot * (i + 0.5)

    def y_of(v: float, vmax: float) -> float:
        return _TOP + _PLOT_H * (1 - v / vmax)

    out = [_svg(chart_id, label, "bf-chart", _H), f"<title>{escape(label)}</title>"]
    for k in range(6):  # grid and both axes, 5 ticks
        y = y_of(k / 5, 1)
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_W - _RIGHT}" y2="{y:.1f}" class="bf-grid"/>')
        out.append(_text(_LEFT - 6, f"{y + 4:.1f}", f"{dmax * (k / 5):g} s", "end"))
        if sizes:
            out.append(_text(_W - _RIGHT + 6, f"{y + 4:.1f}", format_bytes(smax * (k / 5)), "start"))
    out.append(f'<line x1="{_LEFT}" y1="{base}" x2="{_W - _RIGHT}" y2="{base}" class="bf-baseline"/>')
    for i in range(1, n):  # lineage boundaries
        if points[i].lineage_id != points[i - 1].lineage_id:
            x = _LEFT + slot * i
            out.append(
                f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{base}" stroke="{_RULE}" '
                f'stroke-dasharray="4 3" class="bf-lineage-rule"/>'
            )
            out.append(_text(f"{x + 3:.1f}", _TOP + 10, f"lineage {points[i].lineage_id[:8]}"))
    for i, (p, d) in enumerate(zip(points, durations_s)):  # duration bars
        y = y_of(d, dmax)
        tip = f"epoch {p.label} ({p.lineage_id}): {format_ms(p.duration_ms)}"
        tip += f", {size_label} {format_bytes(p.state_bytes)}" if p.state_bytes is not None else ""
        out.append(
            f'<rect class="bf-bar" x="{x_of(i) - bar_w / 2:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
            f'height="{max(0.0, base - y):.1f}" fill="{_BAR}" data-epoch="{escape(p.label)}"><title>{escape(tip)}</title></rect>'
        )
    # State size line (broken where a point has no size, and at lineage changes).
    segments: list[list[str]] = [[]]
    for i, p in enumerate(points):
        if p.state_bytes is None or (i and points[i - 1].lineage_id != p.lineage_id):
            segments.append([])
        if p.state_bytes is not None:
            segments[-1].append(f"{x_of(i):.1f},{y_of(p.state_bytes, smax):.1f}")
    for seg in filter(None, segments):
        out.append(f'<polyline class="bf-line" points="{" ".join(seg)}" fill="none" stroke="{_LINE}" stroke-width="2"/>')
    for i, p in enumerate(points if n <= 120 else []):
        if p.state_bytes is not None:
            out.append(
                f'<circle class="bf-dot" cx="{x_of(i):.1f}" cy="{y_of(p.state_bytes, smax):.1f}" r="3" fill="{_LINE}">'
                f"<title>{escape(f'epoch {p.label}: {size_label} {format_bytes(p.state_bytes)}')}</title></circle>"
            )
    out += [_text(f"{x_of(i):.1f}", base + 16, points[i].label, "middle") for i in range(0, n, max(1, math.ceil(n / 16)))]
    out.append(_text(f"{_LEFT + _PLOT_W / 2:.1f}", _H - 6, "epoch (completed, in commit order)", "middle"))
    # Legend.
    out.append(f'<rect x="{_LEFT}" y="8" width="12" height="12" fill="{_BAR}"/>{_text(_LEFT + 18, 18, "duration (left axis)")}')
    out.append(f'<line x1="{_LEFT + 180}" y1="14" x2="{_LEFT + 204}" y2="14" stroke="{_LINE}" stroke-width="2"/>')
    out.append(_text(_LEFT + 210, 18, f"{size_label} (right axis)") + "</svg>")
    return "".join(out)
