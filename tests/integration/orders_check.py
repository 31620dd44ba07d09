"""Compare the engine's orders_payments tables with the plain-Python reference, row for row."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from barrierflow.operations.query import run_query
from reference.orders_payments_reference import OrdersPaymentsResult, run_reference, split_epochs

__all__ = ["orders_reference", "assert_orders_match_reference", "orders_snapshot"]

# Append outputs compared exactly (values parsed from the same JSON text), with the epoch each row came in.
_APPENDS = ("paid_orders", "late_payments", "unpaid_orders", "flagged_payments", "customer_sessions", "late_activity")


def orders_reference(landing: Path, max_files: int = 2) -> OrdersPaymentsResult:
    return run_reference(split_epochs(landing, max_files))


def _rows(warehouse: str, sql: str) -> list[dict[str, Any]]:
    return run_query(warehouse, "orders_payments", sql).to_pylist()


def _canonical(row: dict[str, Any]) -> tuple[Any, ...]:
    # Timestamps compare as instants whatever their tzinfo object.
    return tuple(sorted((k, v.timestamp() if hasattr(v, "timestamp") else v) for k, v in row.items()))


def orders_snapshot(warehouse: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every output and state table that the reference predicts, canonical and sorted, for exact comparisons."""
    snap = {name: sorted(_canonical(r) for r in _rows(warehouse, f"select * from {name}")) for name in _APPENDS}
    snap["country_totals"] = sorted(
        _canonical(r) for r in _rows(warehouse, "select country, orders, revenue from country_totals")
    )
    snap["dead_letter"] = sorted(
        (r["source"], r["source_file"], r["line"], r["reason"])
        for r in _rows(warehouse, "select source, source_file, line, reason from dead_letter")
    )
    snap["fraud_limits"] = sorted(
        tuple(r.values()) for r in _rows(warehouse, "select map_key, map_value from fraud_check__fraud_limits")
    )
    snap["flagged"] = sorted(tuple(r.values()) for r in _rows(warehouse, "select country, value from fraud_check__flagged"))
    return snap


def assert_orders_match_reference(warehouse: str, ref: OrdersPaymentsResult) -> None:
    """Each append output, the upserted totals, the dead letters and the fraud operator's state equal the reference's."""
    snap = orders_snapshot(warehouse)
    for name in _APPENDS:
        want = sorted(_canonical(r) for r in getattr(ref, name))
        assert snap[name] == want, (name, sorted(set(snap[name]) ^ set(want))[:6])
    totals = {dict(r)["country"]: dict(r) for r in snap["country_totals"]}
    assert set(totals) == set(ref.country_totals)
    for country, expected in ref.country_totals.items():
        assert totals[country]["orders"] == expected["orders"], country
        assert math.isclose(totals[country]["revenue"], expected["revenue"], rel_tol=1e-12), country
    assert snap["dead_letter"] == sorted(ref.dead_letters)
    assert dict(snap["fraud_limits"]) == ref.fraud_limits
    assert dict(snap["flagged"]) == ref.flagged_counts
