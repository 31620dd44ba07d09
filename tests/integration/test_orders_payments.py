"""orders_payments, the second reference pipeline, equals its plain-Python reference through kills, a failure, rescales and a restore.

One stream of 6 file indexes (3 epochs at 2 files per source and epoch)
with duplicates, out-of-order, late and malformed lines goes through:

1. a real ``barrierflow run`` killed with SIGKILL between two table commits
   of epoch 1 (the crossing computed from the pipeline's table count);
2. a run killed at a random time.

Both run on the warm engine, so SIGKILL takes the client, as when an
Airflow worker is lost (``tests/integration/test_crash_resume.py`` kills
the driver's JVM too, with sensor_stats). Then:

3. epochs at parallelism 3 in process, a savepoint, a failure between two
   commits of the next epoch, and the rest at parallelism 2.

Every output table, the upserted totals, the dead letters and the fraud
operator's state then equal the reference; each epoch committed each table
once and nothing staged is visible. Restoring the savepoint at parallelism
1 with rewound sinks and running again gives identical tables.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path
from typing import Any

import pytest

from barrierflow.demo.order_stream import OrderStreamSpec, write_order_files
from barrierflow.demo.pipelines.orders_payments import orders_payments
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint
from cli_runner import kill_runs_at_random_times, run_pipeline, tables_per_epoch
from epoch_runs import epoch_runner, fail_after_first_commit
from orders_check import assert_orders_match_reference, orders_reference, orders_snapshot
from sensor_check import assert_nothing_staged_visible, assert_one_commit_per_table_per_epoch

pytestmark = pytest.mark.slow

EPOCHS = 3


def test_orders_payments_is_exactly_once_through_kills_a_failure_rescales_and_a_restore(
    spark: Any, spark_engine: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    write_order_files(landing, OrderStreamSpec(n_files=2 * EPOCHS, seed=5))
    ref = orders_reference(landing)
    # The stream exercises every path of the pipeline.
    for name in ("paid_orders", "late_payments", "unpaid_orders", "flagged_payments", "customer_sessions", "late_activity"):
        assert getattr(ref, name), name
    assert ref.dead_letters and ref.dropped_late_orders
    params = {"landing_dir": str(landing), "max_files_per_epoch": 2}

    # 1. Killed between two tables' commits of epoch 1.
    crossing = tables_per_epoch("orders_payments") // 2
    crashed = run_pipeline(
        "orders_payments", warehouse, landing, fault=f"commit.after_delta_commit:{crossing}", remote=spark_engine.address
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    # 2. The next run, on the warm engine, killed at a random time (once epoch 1 completed at the latest).
    kill_runs_at_random_times(
        warehouse, landing, 1, random.Random(16), seconds=(5.0, 30.0), max_files_per_epoch=2, pipeline="orders_payments",
        remote=spark_engine.address, by_epoch=1,
    )  # fmt: skip
    # 3. In process: an epoch at parallelism 3, a savepoint, a failure, the rest at parallelism 2.
    run = epoch_runner(orders_payments, params, warehouse, spark)
    done = run(3, 1)
    savepoint = create_savepoint(orders_payments, warehouse, name="mid-stream", params=params)
    if done[-1] < EPOCHS:
        fail_after_first_commit(run, 3, monkeypatch, tmp_path)
    run(2)
    assert_orders_match_reference(warehouse, ref)
    assert_one_commit_per_table_per_epoch(warehouse, EPOCHS, "orders_payments")
    assert_nothing_staged_visible(warehouse, "orders_payments")
    tables = orders_snapshot(warehouse)

    # Restored at parallelism 1 with rewound sinks, the replay writes the same tables.
    restore(orders_payments, warehouse, savepoint="mid-stream", rewind_sinks=True, parallelism=1, params=params)
    assert run(1) == list(range(savepoint.epoch + 1, EPOCHS + 1))
    assert orders_snapshot(warehouse) == tables
