"""The checkpoints page's data, chart and HTML (barrierflow.airflow.ui.history / chart / render)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from barrierflow.airflow.ui import history as history_mod
from barrierflow.airflow.ui.chart import (
    ChartPoint,
    chart_points,
    format_bytes,
    format_ms,
    nice_bytes_ceiling,
    nice_ceiling,
    render_epoch_chart,
)
from barrierflow.airflow.ui.history import discover_pipelines, pipeline_history, resolve_warehouse
from barrierflow.airflow.ui.render import render_page, render_pipeline
from barrierflow.storage import objects
from ui_warehouse import MS, S, build_demo_warehouse, live_bytes

SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class FakeSavepoint:
    name: str
    created_at: str
    epoch: int = 2

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pipeline": "demo",
            "epoch": self.epoch,
            "lineage_id": "L1",
            "created_at": self.created_at,
            "description": "<b>before upgrade</b>",
            "uri": "/sp/" + self.name,
            "size_bytes": 2048,
            "stopped": False,
        }


def _lister(pipeline: str, warehouse: str) -> list[FakeSavepoint]:
    return [FakeSavepoint("old", "2024-01-01T00:00:00Z"), FakeSavepoint("new", "2024-02-01T00:00:00Z")]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("wh")
    facts = build_demo_warehouse(root)
    facts["root"] = root
    return facts


def test_discover_pipelines_needs_pipeline_json(tmp_path: Path, demo: dict[str, Any]) -> None:
    (tmp_path / "no_meta").mkdir()
    (tmp_path / "_savepoints" / "demo").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    build_demo_warehouse(tmp_path, "p2")
    assert discover_pipelines(str(tmp_path)) == ["p2"]
    assert discover_pipelines(str(tmp_path / "missing")) == []


def test_resolve_warehouse_prefers_argument_then_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BARRIERFLOW_WAREHOUSE", str(tmp_path / "env"))
    assert resolve_warehouse(str(tmp_path / "arg")) == str(tmp_path / "arg")
    assert resolve_warehouse() == str(tmp_path / "env")
    monkeypatch.delenv("BARRIERFLOW_WAREHOUSE")
    monkeypatch.chdir(tmp_path)
    assert resolve_warehouse() == str(tmp_path / "warehouse")


def test_epoch_rows_take_the_furthest_status_and_the_manifest_metrics(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    assert h.error is None
    assert [(e.lineage_id, e.epoch, e.status) for e in h.epochs] == [
        ("L1", 1, "COMPLETED"),
        ("L1", 2, "COMPLETED"),
        ("L1", 3, "PLANNED"),
        ("L2", 3, "COMPLETED"),
    ]
    e2 = h.epochs[1]
    assert (e2.rows_in, e2.rows_out, e2.dead_letters, e2.bytes_written, e2.duration_ms) == (200, 20, 2, 2000, 4000)
    assert e2.event_time_lag_ms == 30_000  # max event time - watermark
    assert e2.processing_lag_ms == (e2.recorded_at_us - e2.watermark_us) // 1000
    assert e2.watermark and e2.watermark.endswith("Z")
    assert e2.table_versions == {"counter__totals": demo["versions"][("L1", 2)], "out": 1}
    planned = h.epochs[2]
    assert planned.processing_lag_ms is None and planned.state_bytes is None and planned.table_versions == {}
    assert (h.current_lineage_id, h.last_completed_epoch, h.key_groups) == ("L2", 3, 16)
    assert h.dag_id == "barrierflow_demo" and h.savepoint_dag_id == "barrierflow_demo_savepoint"


def test_state_size_is_live_bytes_of_state_tables_at_the_recorded_versions(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    by_key = {(e.lineage_id, e.epoch): e for e in h.epochs}
    for key, version in demo["versions"].items():
        assert by_key[key].state_bytes == live_bytes(demo["state_uri"], version)
    # Epoch 2 appended (sizes add up), the restore lineage's epoch 3 overwrote (older files not live).
    assert by_key[("L1", 2)].state_bytes > by_key[("L1", 1)].state_bytes
    # Cumulative bytes written restart with each lineage.
    assert [by_key[k].state_bytes_cumulative for k in [("L1", 1), ("L1", 2), ("L2", 3)]] == [700, 1600, 1200]
    # Cached sizes give the same answer.
    again = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    assert [e.state_bytes for e in again.epochs] == [e.state_bytes for e in h.epochs]


def test_state_size_can_be_skipped(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo", state_size=False, savepoint_lister=_lister)
    assert all(e.state_bytes is None for e in h.epochs)
    points, label = chart_points(h.epochs)
    assert label == "state bytes written (cumulative)"
    assert [p.state_bytes for p in points] == [700, 1600, 1200]


def test_lineages_in_order_with_their_epochs(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    assert [(lin.lineage_id, lin.reason, lin.current, lin.epochs_completed, lin.last_completed_epoch) for lin in h.lineages] == [
        ("L1", "created", False, 2, 2),
        ("L2", "restore", True, 1, 3),
    ]
    assert h.lineages[1].document["savepoint"] == "sp-1"


def test_savepoints_newest_first_and_tolerated_when_missing_or_broken(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    assert [s["name"] for s in h.savepoints] == ["new", "old"] and h.savepoints_available

    def broken(pipeline: str, warehouse: str) -> list[Any]:
        raise OSError("disk on fire")

    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=broken)
    assert h.savepoints == () and h.savepoints_available and "disk on fire" in (h.savepoints_error or "")
    assert len(h.epochs) == 4  # the rest of the page still works


def test_default_savepoint_lister_is_barrierflow_savepoint(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo")
    if "barrierflow.operations.savepoint" not in sys.modules:
        pytest.skip("barrierflow.operations.savepoint is not installed")
    assert h.savepoints_available and h.savepoints_error is None and h.savepoints == ()


def test_stop_marker_and_unreadable_log_are_reported(tmp_path: Path) -> None:
    facts = build_demo_warehouse(tmp_path)
    layout = facts["layout"]
    objects.write_json_if_absent(layout.stopped, {"savepoint": "sp-9", "epoch": 3})
    h = pipeline_history(str(tmp_path), "demo", savepoint_lister=_lister)
    assert h.stopped == {"savepoint": "sp-9", "epoch": 3}
    assert "stopped with savepoint sp-9" in render_page([h], warehouse=str(tmp_path))
    # A corrupt checkpoint log: the page shows the error instead of failing.
    log_dir = Path(layout.checkpoint_log) / "_delta_log"
    for f in log_dir.iterdir():  # commits, checkpoints and _last_checkpoint
        if f.is_file():
            f.write_text("{not json")
    h = pipeline_history(str(tmp_path), "demo", savepoint_lister=_lister)
    assert h.error and h.epochs == ()


def test_to_json_round_trips_through_json(demo: dict[str, Any]) -> None:
    import json

    doc = json.loads(json.dumps(pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister).to_json()))
    assert doc["pipeline"] == "demo" and len(doc["epochs"]) == 4 and doc["savepoints"][0]["name"] == "new"
    assert set(doc["watermark_lag"]) == {"event_time_lag_ms", "processing_lag_ms"}
    assert "live bytes" in doc["state_size_method"]


# -- chart ---------------------------------------------------------------------------


def test_format_helpers() -> None:
    assert format_bytes(None) == "" and format_bytes(512) == "512 B" and format_bytes(1536) == "1.5 KiB"
    assert format_bytes(5 * 1024**3) == "5.0 GiB"
    assert format_ms(None) == "" and format_ms(850) == "850 ms" and format_ms(4400) == "4.4 s"
    assert format_ms(185_000) == "3 min 5 s" and format_ms(7_500_000) == "2 h 5 min" and format_ms(-1500) == "-1.5 s"
    assert format_ms(3 * 86_400_000 + 4 * 3_600_000) == "3 d 4 h"
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 3, 11, 24.5, 26, 800)] == [1, 1, 1, 5, 20, 25, 50, 1000]
    assert nice_bytes_ceiling(30 * 1024) == 50 * 1024 and nice_bytes_ceiling(700) == 1000


def test_chart_has_one_bar_per_completed_epoch_a_size_line_and_lineage_rules(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    points, label = chart_points(h.epochs)
    assert label == "state size" and [p.label for p in points] == ["1", "2", "3"]
    svg = ET.fromstring(render_epoch_chart(points, chart_id="c1", title="demo <&>", size_label=label))
    assert svg.tag == f"{SVG}svg" and svg.get("id") == "c1" and svg.get("role") == "img"
    assert len(svg.findall(f".//{SVG}rect[@class='bf-bar']")) == 3
    heights = [float(r.get("height")) for r in svg.findall(f".//{SVG}rect[@class='bf-bar']")]
    assert heights[1] == max(heights)  # epoch 2 took longest (4 s)
    assert len(svg.findall(f".//{SVG}line[@class='bf-lineage-rule']")) == 1  # L1 -> L2
    # The size line breaks at the lineage change: one polyline per lineage.
    assert len(svg.findall(f".//{SVG}polyline")) == 2
    assert svg.find(f"{SVG}title").text == "demo <&>"


def test_chart_without_completed_epochs_says_so() -> None:
    svg = ET.fromstring(render_epoch_chart([], chart_id="empty"))
    assert "no completed epoch" in "".join(svg.itertext())


def test_chart_thins_labels_and_caps_points() -> None:
    points = [ChartPoint(str(i), "L", 1000 + i, 10 * i) for i in range(1, 301)]
    svg = ET.fromstring(render_epoch_chart(points))
    assert len(svg.findall(f".//{SVG}rect[@class='bf-bar']")) == 300
    labels = [t for t in svg.findall(f".//{SVG}text") if (t.text or "").isdigit()]
    assert len(labels) <= 20
    assert not svg.findall(f".//{SVG}circle")  # no dots beyond 120 points


# -- HTML ------------------------------------------------------------------------------


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(html: str) -> _Collector:
    c = _Collector()
    c.feed(html)
    return c


def test_page_shows_epochs_savepoints_lineages_and_chart_escaped(demo: dict[str, Any]) -> None:
    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    html = render_page([h], warehouse=str(demo["root"]), user="ada<script>")
    assert "<script>" not in html.replace("&lt;script&gt;", "")
    assert "&lt;b&gt;before upgrade&lt;/b&gt;" in html
    page = _parse(html)
    epochs = [a for t, a in page.tags if t == "tr" and "bf-epoch" in (a.get("class") or "")]
    assert [(a["data-epoch"], a["data-status"]) for a in epochs] == [
        ("3", "COMPLETED"),
        ("3", "PLANNED"),
        ("2", "COMPLETED"),
        ("1", "COMPLETED"),
    ]
    savepoints = [a["data-name"] for t, a in page.tags if t == "tr" and "bf-savepoint" in (a.get("class") or "")]
    assert savepoints == ["new", "old"]
    assert sum(1 for t, a in page.tags if t == "tr" and a.get("class") == "bf-lineage") == 2
    assert any(t == "svg" and a.get("id") == "epoch-chart-demo" for t, a in page.tags)
    text = " ".join(page.text)
    assert "Event-time lag" in text and "Backlog" in text and "Input lag" in text
    assert "max event time seen − watermark" in text and "how long the oldest of them had waited" in text
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no external assets


def test_page_shows_the_backlog_measured_now_and_per_epoch(demo: dict[str, Any]) -> None:
    import dataclasses

    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    assert h.backlog is not None and h.backlog["error"].startswith("unknown pipeline 'demo'")  # no code for it here
    report = {
        "measured_at_ms": 0,
        "total": {"files": 3, "bytes": 2048, "oldest_arrival_ms": 0, "lag_ms": 125_000},
        "sources": {"readings": {"files": 3, "bytes": 2048, "oldest_arrival_ms": 0, "lag_ms": 125_000}},
    }
    phases = {"barrier": 120, "process": 2_000, "wait": 0, "stage": 300, "commit": 80}
    run = "barrierflow_demo:scheduled__2024-01-01T00:01:00+00:00"
    rows = [
        dataclasses.replace(e, backlog_files=2, backlog_bytes=1536, input_lag_ms=61_000, phase_ms=phases, planned_by=run)
        for e in h.epochs
    ]
    page = _parse(render_pipeline(dataclasses.replace(h, backlog=report, epochs=tuple(rows))))
    links = [a.get("href") for t, a in page.tags if t == "a"]
    assert "/dags/barrierflow_demo/runs/scheduled__2024-01-01T00%3A01%3A00%2B00%3A00" in links  # the run's page in Airflow
    text = " ".join(page.text)
    assert "Backlog 3 files, 2.0 KiB" in text and "Input lag 2 min 5 s" in text
    assert "2 files, 1.5 KiB 1 min 1 s" in text  # an epoch's row
    assert "b 120 ms p 2.0 s s 300 ms c 80 ms" in text  # its phases (a zero wait left out)
    idle = {**report, "total": {"files": 0, "bytes": 0, "oldest_arrival_ms": None, "lag_ms": 0}}
    assert "Input lag none waiting" in " ".join(_parse(render_pipeline(dataclasses.replace(h, backlog=idle))).text)


def test_failures_restore_points_and_rewound_epochs_read_as_what_they_are(tmp_path: Path) -> None:
    import dataclasses

    from barrierflow.checkpointing.checkpoint import EpochStatus
    from barrierflow.checkpointing.checkpoint_log import CheckpointLog
    from ui_warehouse import WALL, S, _record

    facts = build_demo_warehouse(tmp_path)
    log = CheckpointLog(facts["layout"])
    # L1's epoch 3 failed once, then completed; the restore to epoch 2 (lineage L2) rewound it.
    log.append(
        _record("demo", "L1", 3, EpochStatus.ABORTED, WALL + 21 * S, message="process failed: EngineUnavailableError: down")
    )
    log.append(_record("demo", "L1", 3, EpochStatus.COMPLETED, WALL + 22 * S, duration_ms=99_000, rows_in=7))
    point = _record("demo", "L2", 2, EpochStatus.COMPLETED, WALL + 25 * S, rows_in=0, duration_ms=0)
    log.append(dataclasses.replace(point, attempt_id="restore-L2"))
    h = pipeline_history(str(tmp_path), "demo", savepoint_lister=_lister, state_size=False)
    rows = {(e.lineage_id, e.epoch): e for e in h.epochs}
    assert rows[("L1", 3)].status == "COMPLETED" and rows[("L1", 3)].rewound
    assert rows[("L2", 2)].restore_point and not rows[("L2", 3)].rewound
    assert [(f.epoch, f.message) for f in h.failures] == [(3, "process failed: EngineUnavailableError: down")]
    summary = h.summary()
    assert {k: summary[k] for k in ("completed", "in_progress", "failed", "restored", "recent")} == {
        "completed": 1,
        "in_progress": 0,
        "failed": 1,
        "restored": 1,
        "recent": 3,  # the rewound epoch is not recent work
    }
    assert summary["duration_ms"] == {"min": 2500, "avg": 3166.6666666666665, "max": 4000}
    text = " ".join(_parse(render_pipeline(h)).text)
    assert "RESTORE POINT" in text and "REWOUND" in text and "Failed attempts 1" in text and "Restores 1" in text
    assert "Latest failure : epoch 3" in text and "EngineUnavailableError: down" in text
    assert "over the last 3 computed epochs" in text and "2.5 s 3.2 s 4.0 s" in text
    assert h.to_json()["summary"]["failed"] == 1


def test_page_limits_epoch_rows_and_handles_an_empty_warehouse(demo: dict[str, Any], tmp_path: Path) -> None:
    h = pipeline_history(str(demo["root"]), "demo", savepoint_lister=_lister)
    page = _parse(render_page([h], warehouse="w", epoch_rows=2))
    assert sum(1 for t, a in page.tags if t == "tr" and "bf-epoch" in (a.get("class") or "")) == 2
    assert "Showing the newest 2 of 4 epochs" in "".join(page.text)
    empty = render_page([], warehouse=str(tmp_path))
    assert "No pipeline in this warehouse yet" in empty


def test_timestamps_are_microsecond_iso_utc() -> None:
    assert history_mod.iso_us(None) is None
    assert history_mod.iso_us(1_700_000_000 * S + 5 * MS) == "2023-11-14T22:13:20.005000Z"
