"""An upsert sink keeps one current row per key: the last of an epoch's rows for a key, a null key included.

Two epochs of a stream straight into ``DeltaSink.upsert`` (no operator in
between, so the rows carry their arrival positions): each key's current row
is its last record in arrival order, and a null key is one key whose row is
replaced like any other (before, null-key rows piled up, one per epoch,
because the rewrite matched keys with ``=``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

import barrierflow as bf
from barrierflow.checkpointing.coordinator import CheckpointCoordinator

EVENTS = pa.schema([("k", pa.string()), pa.field("v", pa.int64(), nullable=False)])
EPOCHS = [
    [("a", 1), (None, 2), ("a", 3), (None, 4)],
    [(None, 5), ("b", 6)],
]


@bf.pipeline("upserts", params=[bf.Param("landing_dir", str)])
def upserts(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS)).sink_to(bf.DeltaSink.upsert("latest", key="k"))


def test_an_upsert_sink_keeps_the_last_row_of_each_key_null_included(spark: Any, tmp_path: Path, warehouse: str) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    current: dict[str | None, tuple[int, int]] = {}  # the reference: key -> (v, epoch) of its last record
    for epoch, records in enumerate(EPOCHS, 1):
        (landing / f"part-{epoch}.jsonl").write_text("".join(json.dumps({"k": k, "v": v}) + "\n" for k, v in records))
        coordinator = CheckpointCoordinator(upserts, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark)
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [epoch]
        current.update({k: (v, epoch) for k, v in records})
        rows = bf.run_query(warehouse, "upserts", "select k, v, _epoch from latest").to_pylist()
        assert sorted(((r["k"], (r["v"], r["_epoch"])) for r in rows), key=repr) == sorted(current.items(), key=repr)
