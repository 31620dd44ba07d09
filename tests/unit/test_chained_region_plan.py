"""Which part of a pipeline an epoch chains (``barrierflow.execution.chained_region.chained_region``), without Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from barrierflow.checkpointing.checkpoint import Barrier
from barrierflow.demo.pipelines.orders_payments import orders_payments
from barrierflow.execution.chained_region import chained_region
from barrierflow.execution.chaining import CHAINING_ENV


def _ctx(landing: Path, orders: list[Any], payments: list[Any]) -> Any:
    class Ctx:
        pipeline = orders_payments.build({"landing_dir": str(landing)})
        barrier = Barrier(
            pipeline="orders_payments", lineage_id="l", epoch=1, start_offsets={},
            end_offsets={"orders": {"files": orders}, "payments": {"files": payments}, "thresholds": {"files": []}},
            processing_time_ms=0, planned_at="", attempt_id="a",
        )  # fmt: skip

    return Ctx()


def test_the_front_is_the_sources_and_the_operators_with_a_chained_form_after_them(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, [["a.jsonl", 0, None, 100]], [["a.jsonl", 0, None, 100]])
    region = chained_region(ctx)
    assert region is not None
    ids = [n.operator_id for n in region.nodes]
    assert ids[:7] == ["orders", "order_dedup", "order_watermark", "payments", "payment_dedup", "payment_watermark", "thresholds"]
    assert {"select-1", "select-3", "select-4", "union-1", "country_totals", "sink_country_totals"} <= set(ids)
    # The outputs are the nodes consumed outside the region, and only those.
    inside = {id(n) for n in region.nodes}
    outside = [n for n in region.nodes if any(id(c) not in inside for c in ctx.pipeline.children(n))]
    assert [region.nodes[i] for i in region.outputs] == outside
    schemas = dict(zip(ids, region.schemas))
    assert schemas["orders"].names == ["order_id", "customer_id", "country", "ts", "amount", "_seq"]
    assert schemas["select-1"].names == ["payment_id", "order_id", "ts", "amount", "_seq"]
    assert schemas["union-1"].names == ["customer_id", "ts", "amount", "_seq", "_seq_1"]
    assert schemas["country_totals"].names == ["country", "orders", "revenue"]


def test_a_source_reading_part_of_a_file_is_read_on_spark(tmp_path: Path) -> None:
    region = chained_region(_ctx(tmp_path, [["a.jsonl", 0, 10, 100]], [["a.jsonl", 0, None, 100]]))
    assert region is not None
    ids = [n.operator_id for n in region.nodes]
    assert ids[:5] == ["payments", "payment_dedup", "payment_watermark", "thresholds", "select-1"]
    assert "select-4" in ids
    # Nor what needs the orders: their stream, and the event-time operators (the watermark is the orders' too).
    assert not {"orders", "order_dedup", "order_watermark", "union-1", "country_totals", "payment_join", "customer_sessions"} & set(ids)


def test_chaining_off_or_a_large_epoch_chains_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert chained_region(_ctx(tmp_path, [["a.jsonl", 0, None, 10**9]], [])) is None
    monkeypatch.setenv(CHAINING_ENV, "false")
    assert chained_region(_ctx(tmp_path, [["a.jsonl", 0, None, 100]], [])) is None
