"""The orders_payments input generator: deterministic per file, messy in every documented way."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from barrierflow.demo.order_stream import SOURCES, OrderStreamSpec, generate_order_files, write_order_files


def _records(lines: list[str]) -> list[dict]:
    """The lines that are JSON objects, a ``ts`` that does not parse removed."""
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            try:
                datetime.fromisoformat(obj.get("ts") or "")
            except (TypeError, ValueError):
                obj.pop("ts", None)
            out.append(obj)
    return out


def test_a_file_depends_only_on_the_seed_and_its_index(tmp_path: Path) -> None:
    short, long = OrderStreamSpec(n_files=3, seed=4), OrderStreamSpec(n_files=9, seed=4)
    assert generate_order_files(short, 2) == generate_order_files(long, 2)
    assert generate_order_files(long, 2) != generate_order_files(OrderStreamSpec(n_files=9, seed=5), 2)
    write_order_files(tmp_path / "a", long, count=3)
    write_order_files(tmp_path / "b", long, start_index=1, count=1)
    for source in SOURCES:
        assert (tmp_path / "a" / source / "part-000001.jsonl").read_bytes() == (
            tmp_path / "b" / source / "part-000001.jsonl"
        ).read_bytes()
        assert not [p for p in (tmp_path / "a" / source).iterdir() if p.name.startswith(".")]  # no temp file left


def test_the_stream_holds_every_case_the_pipeline_handles() -> None:
    spec = OrderStreamSpec(n_files=10, seed=1, malformed_rate=0.1)
    files = [generate_order_files(spec, k) for k in range(spec.n_files)]
    orders = [o for f in files for o in _records(f["orders"]) if o.get("order_id")]
    payments = [p for f in files for p in _records(f["payments"]) if p.get("payment_id")]
    ordered = {o["order_id"]: o for o in orders if "ts" in o}
    assert len(orders) > len(ordered)  # duplicates (and malformed copies)

    def delay(payment: dict) -> timedelta:
        order = ordered[payment["order_id"]]
        return datetime.fromisoformat(payment["ts"]) - datetime.fromisoformat(order["ts"])

    paid = [p for p in payments if p["order_id"] in ordered and "ts" in p]
    delays = {delay(p) for p in paid}
    assert timedelta(0) in delays and timedelta(minutes=15) in delays  # both inclusive bounds
    assert any(d > timedelta(minutes=15) for d in delays)  # overdue: unpaid, not joined
    assert {o["order_id"] for o in orders} - {p["order_id"] for p in payments}  # never paid
    assert any(o["order_id"].startswith("late-") for o in orders) and any(p["payment_id"].startswith("late-") for p in payments)
    lines = [line for f in files for line in f["orders"] + f["payments"]]
    assert "" in [line.strip() for line in lines]  # blank lines
    assert any(line.startswith("[") for line in lines)  # JSON that is not an object
    assert any(not line.strip().endswith("}") and line.strip() and not line.startswith("[") for line in lines)  # not JSON
    thresholds = [_records(f["thresholds"]) for f in files]
    assert {t["country"] for t in thresholds[0]} == {"de", "fr", "it", "es", "nl"}
    assert any(t["limit"] is None for ts in thresholds for t in ts) and any(
        isinstance(t["limit"], str) for ts in thresholds for t in ts
    )


@pytest.mark.parametrize(
    "kw", [{"n_files": -1}, {"n_files": 1, "orders_per_file": 0}, {"n_files": 1, "unpaid_rate": 0.9, "overdue_rate": 0.2}]
)
def test_a_spec_out_of_range_is_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        OrderStreamSpec(**kw)
