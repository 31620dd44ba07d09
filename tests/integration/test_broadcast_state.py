"""The broadcast state pattern on real Spark and Delta, against a plain-Python reference.

The README's "Broadcast state" function (thresholds per country broadcast
to payments keyed by country) runs four epochs through a savepoint, an
injected failure between two table commits, a parallelism change and a
restore with rewound sinks. Every flagged row must come in the epoch the
reference says, and the keyed and broadcast state tables must hold the
reference's state; a payment without a country is a dead letter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import barrierflow as bf
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint
from epoch_runs import epoch_runner, fail_after_first_commit
from readme_example import readme_module

# Per epoch: limits (country, limit or None to remove) and payments (id, country, amount), in arrival order.
EPOCHS: list[tuple[list[tuple[str, float | None]], list[tuple[str, str | None, float]]]] = [
    ([("de", 100.0), ("fr", 50.0)], [("p1", "de", 150.0), ("p2", "fr", 20.0), ("p3", "it", 999.0), ("p4", "fr", 60.0)]),
    ([("it", 500.0), ("de", 200.0)], [("p5", "de", 150.0), ("p6", "it", 999.0), ("p7", None, 5.0), ("p8", "de", 250.0)]),
    ([("fr", None)], [("p9", "fr", 60.0), ("p10", "it", 501.0), ("p11", "de", 201.0)]),
    ([("fr", 10.0), ("fr", 70.0)], [("p12", "fr", 60.0), ("p13", "fr", 80.0), ("p14", "it", 100.0)]),
]


def _reference() -> tuple[list[tuple[str, str, int, int]], dict[str, int], dict[str, float]]:
    """Rows (payment_id, country, flagged, epoch), the flagged counts, the thresholds left: the documented order."""
    limits: dict[str, float] = {}
    flagged: dict[str, int] = {}
    rows = []
    for epoch, (rules, payments) in enumerate(EPOCHS, 1):
        for country, limit in rules:  # the epoch's broadcast records first
            if limit is None:
                limits.pop(country, None)
            else:
                limits[country] = limit
        for payment_id, country, amount in payments:
            if country is not None and country in limits and amount > limits[country]:
                flagged[country] = flagged.get(country, 0) + 1
                rows.append((payment_id, country, flagged[country], epoch))
    return rows, flagged, limits


def _write(landing: Path) -> None:
    for side in ("payments", "limits"):
        (landing / side).mkdir(parents=True)
    for i, (rules, payments) in enumerate(EPOCHS):
        (landing / "limits" / f"part-{i:03d}.jsonl").write_text(
            "".join(json.dumps({"country": c, "limit": v}) + "\n" for c, v in rules)
        )
        (landing / "payments" / f"part-{i:03d}.jsonl").write_text(
            "".join(json.dumps({"payment_id": p, "country": c, "amount": a}) + "\n" for p, c, a in payments)
        )


def test_broadcast_state_is_exactly_once_through_a_failure_a_rescale_and_a_restore(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = readme_module(tmp_path / "user_code", "### Broadcast state", "readme_fraud")

    # The README's pipeline, with a parallelism to change.
    @bf.pipeline("fraud", params=[bf.Param("payments_dir", str), bf.Param("limits_dir", str), bf.Param("parallelism", int, 2)])
    def fraud(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        payments = p.source(bf.FileSource("payments", params["payments_dir"], schema=readme.PAYMENTS, max_files_per_epoch=1))
        limits = p.source(bf.FileSource("limits", params["limits_dir"], schema=readme.LIMITS, max_files_per_epoch=1))
        (payments.key_by("country").connect(limits.broadcast(readme.THRESHOLDS))
            .process("flag_large", readme.FlagLarge()).sink_to(bf.DeltaSink.append("flagged")))  # fmt: skip

    landing = tmp_path / "landing"
    _write(landing)
    dirs = {"payments_dir": str(landing / "payments"), "limits_dir": str(landing / "limits")}

    run = epoch_runner(fraud, dirs, warehouse, spark)

    def flagged_rows() -> list[tuple[Any, ...]]:
        rows = run_query(warehouse, "fraud", "select payment_id, country, flagged, _epoch from flagged").to_pylist()
        return sorted(tuple(r.values()) for r in rows)

    assert run(2, 2) == [1, 2]
    create_savepoint(fraud, warehouse, name="after-2", params=dirs)
    fail_after_first_commit(run, 2, monkeypatch, tmp_path)
    assert run(3)[-1] == 4

    rows, flagged, limits = _reference()
    assert flagged_rows() == sorted(rows)
    counts = run_query(warehouse, "fraud", "select country, value from flag_large__flagged").to_pylist()
    assert {r["country"]: r["value"] for r in counts} == flagged
    thresholds = run_query(warehouse, "fraud", "select map_key, map_value from flag_large__thresholds").to_pylist()
    assert {r["map_key"]: r["map_value"] for r in thresholds} == limits
    dead = run_query(warehouse, "fraud", "select source_file, line, reason from dead_letter").to_pylist()
    assert [(Path(r["source_file"]).name, r["line"], r["reason"]) for r in dead] == [("part-001.jsonl", 3, "null_key")]

    # Restored at parallelism 1, the replay of epochs 3-4 flags the same payments from the restored broadcast state.
    restore(fraud, warehouse, savepoint="after-2", rewind_sinks=True, parallelism=1, params=dirs)
    assert run(1) == [3, 4]
    assert flagged_rows() == sorted(rows)
