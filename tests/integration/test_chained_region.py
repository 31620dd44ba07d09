"""A chained front on real Spark and Delta: its epochs write exactly the tables Spark's epochs write.

``orders_payments`` is run with chaining on and off over the same messy
stream (duplicates, out-of-order, late and malformed lines): with it on, each
epoch reads its three sources, deduplicates both streams and assigns both
watermarks in one Python task (``barrierflow.execution.chained_region``) and the rest
runs on Spark. Both runs must give identical outputs, state tables (the
deduplications' and the assigners' included) and dead letters, equal to the
plain-Python reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.demo.order_stream import OrderStreamSpec, write_order_files
from barrierflow.demo.pipelines.orders_payments import orders_payments
from barrierflow.execution import runtime
from barrierflow.execution.chaining import CHAINING_ENV
from barrierflow.state.worker_cache import latest_rows
from barrierflow.storage.layout import PipelineLayout
from orders_check import assert_orders_match_reference, orders_reference, orders_snapshot

pytestmark = pytest.mark.slow

# Operators of the chained front, as their state tables name them.
_FRONT_STATE = (("order_dedup", "seen"), ("payment_dedup", "seen"), ("order_watermark", "max_event_time"), ("payment_watermark", "max_event_time"))


def _run(spark: Any, landing: Path, warehouse: str) -> None:
    params = {"landing_dir": str(landing), "max_files_per_epoch": 2, "parallelism": 2}
    CheckpointCoordinator(orders_payments, params, warehouse, spark_factory=lambda: spark).run(until_caught_up=True)


def _state(warehouse: str, landing: Path) -> dict[str, list[str]]:
    """Each state table's live rows (but their processing time), canonical and sorted."""
    from deltalake import DeltaTable

    layout = PipelineLayout.of(warehouse, "orders_payments")
    tables = {}
    for spec in orders_payments.build({"landing_dir": str(landing)}).state_specs():
        if spec.name == "offsets":
            continue  # each run's own barriers
        rows = pa.table(DeltaTable(layout.state_table(spec.operator_id, spec.name)).to_pyarrow_table())
        live = latest_rows(rows, spec.key_columns).drop_columns(["_updated_at_ms"])
        tables[spec.table_name] = sorted(map(repr, live.to_pylist()))
    return tables


def _schemas(warehouse: str) -> dict[str, str]:
    """Every Delta table's schema (nullability included), by its path in the pipeline's directory."""
    from deltalake import DeltaTable

    from barrierflow.storage import objects

    layout = PipelineLayout.of(warehouse, "orders_payments")
    uris = [layout.dead_letter, *(layout.state_table(o, n) for o, n in layout.state_tables())]
    uris += [layout.sink_table(name) for name in objects.list_dir(objects.join_uri(layout.root, "sinks"))]
    return {uri[len(layout.root) :]: pa.schema(DeltaTable(uri).schema().to_arrow()).to_string() for uri in uris}


def test_a_chained_front_writes_the_tables_spark_writes(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    write_order_files(landing, OrderStreamSpec(n_files=6, orders_per_file=60, seed=5))
    fronts: list[tuple[int, bool]] = []

    def counted(ctx: Any, region: Any) -> Any:
        result = run_region(ctx, region)
        fronts.append((ctx.epoch, result is not None))
        return result

    run_region = runtime.run_region
    monkeypatch.setattr(runtime, "run_region", counted)
    _run(spark, landing, warehouse)
    assert fronts == [(1, True), (2, True), (3, True)], "every epoch's front chained"
    monkeypatch.setenv(CHAINING_ENV, "false")
    spark_only = f"{warehouse}-spark"
    _run(spark, landing, spark_only)
    assert len(fronts) == 3, "chaining off: no front chained"
    assert orders_snapshot(warehouse) == orders_snapshot(spark_only)
    ours, theirs = _state(warehouse, landing), _state(spark_only, landing)
    assert set(ours) == set(theirs) and {f"{o}__{n}" for o, n in _FRONT_STATE} <= set(ours)
    for name in ours:
        assert ours[name] == theirs[name], f"state table {name} differs between a chained front and Spark"
    assert _schemas(warehouse) == _schemas(spark_only), "every table is created with the schema Spark's path gives it"
    assert_orders_match_reference(warehouse, orders_reference(landing))

