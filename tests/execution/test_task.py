"""barrierflow.execution.task.run_task: one task of an epoch on a real staging directory, no Spark.

The pipeline reads a JSON Lines file, deduplicates by ``id`` and writes every
new record to an append sink and the latest per ``user`` to an upsert sink.
The driver's part is done as the runner does it (the physical plan, state
plans from :class:`EpochStateTables`, sink plans from ``plan_sink_table``)
on a warehouse in ``tmp_path``; the tasks run in this process, in one task
or stage by stage. Every expectation is written out by hand: key groups by
the ``xxhash`` library (Spark's ``pmod(xxhash64(key), G)``), arrival
positions from line numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import xxhash
from deltalake import DeltaTable, write_deltalake

import barrierflow as bf
from barrierflow.connectors import delta_sink
from barrierflow.connectors.delta_sink import EPOCH_FIELD, plan_sink_table
from barrierflow.core.columns import KEY_GROUP, SEQ
from barrierflow.core.dead_letters import DEAD_LETTER_SCHEMA
from barrierflow.execution.exchange import key_group_ranges
from barrierflow.execution.runner import _detached
from barrierflow.execution.task import DEAD_LETTER, OutputTable, TaskInput, TaskPlan, TaskResult, run_task
from barrierflow.operators.watermark import WatermarkClock
from barrierflow.plan.pipeline import Pipeline, SourceNode
from barrierflow.plan.planner import PhysicalPlan, physical_plan
from barrierflow.state import files
from barrierflow.state.snapshots import EpochStateTables
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import join_uri

SCHEMA = pa.schema([("id", pa.string()), ("user", pa.string()), ("amount", pa.int64())])
GROUPS = 16
EPOCH, NOW = 2, 5_000
PREFIX = PipelineLayout.staging_prefix("lineage", EPOCH, "attempt")
LINES = [
    {"id": "e1", "user": "u1", "amount": 1},
    {"id": "e2", "user": "u2", "amount": 2},
    {"id": "e1", "user": "u1", "amount": 100},  # the same id again in the epoch: dropped
    {"id": "e0", "user": "u3", "amount": 3},  # seen in epoch 1: dropped
    {"id": None, "user": "u4", "amount": 4},  # a null key: a dead letter of the source
    {"id": "e3", "user": "u1", "amount": 5},  # u1's last record: the upsert keeps it
    {"id": "e4", "user": "u5", "amount": 6},
]
# What the deduplication lets through, in arrival order: (id, user, amount, _seq = the line: source 0, file 0).
FRESH = [("e1", "u1", 1, 1), ("e2", "u2", 2, 2), ("e3", "u1", 5, 6), ("e4", "u5", 6, 7)]
ROWS = pa.schema([*SCHEMA, pa.field(SEQ, pa.int64())])  # a sink's rows
STAGED = ROWS.append(EPOCH_FIELD)  # its staged files


def _kg(key: str) -> int:
    """Spark's ``pmod(xxhash64(key), G)`` of a string key, from the xxhash library."""
    h = xxhash.xxh64_intdigest(key.encode(), 42)
    return (h - 2**64 if h >= 2**63 else h) % GROUPS


@pytest.fixture(autouse=True)
def empty_cache() -> Any:
    files.clear()
    yield
    files.clear()


def _pipeline(landing: Path) -> Pipeline:
    @bf.pipeline("task_test", key_groups=GROUPS)
    def definition(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        events = p.source(bf.FileSource("events", str(landing), parser=json.loads, parser_schema=SCHEMA))
        fresh = events.deduplicate("dedup", key="id")
        fresh.sink_to(bf.DeltaSink.append("all_events"))
        fresh.sink_to(bf.DeltaSink.upsert("latest", key="user"))

    return definition.build({})


class Epoch:
    """Epoch 2 of the pipeline on a warehouse in ``tmp_path``: the driver's plans, then tasks."""

    def __init__(self, tmp_path: Path) -> None:
        landing = tmp_path / "landing"
        landing.mkdir()
        (landing / "001.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LINES))
        self.pipe = _pipeline(landing)
        self.layout = PipelineLayout.of(str(tmp_path / "warehouse"), "task_test")
        source_nodes = {i: n for i, n in enumerate(self.pipe.nodes) if isinstance(n, SourceNode)}
        self.plan: PhysicalPlan = physical_plan(
            self.pipe, {i: n.source.record_schema().append(pa.field(SEQ, pa.int64())) for i, n in source_nodes.items()}
        )  # type: ignore[union-attr]
        source = source_nodes[0].source
        assert source is not None
        self.splits = source.splits(source.plan(None, None), 0, None)
        # Epoch 1 saw e0.
        seen = self.layout.state_table("dedup", "seen")
        spec = self.plan.state_specs[1][0]
        write_deltalake(seen, pa.table({
            "id": ["e0"], KEY_GROUP: pa.array([_kg("e0")], pa.int32()), "first_epoch": pa.array([1], pa.int64()),
            "_updated_at_ms": pa.array([1_000], pa.int64()), "_deleted": [False], "_epoch": pa.array([1], pa.int64()),
        }, schema=spec.arrow_schema()))  # fmt: skip
        self.state_tables = EpochStateTables("task_test", 1, "delta")
        state_plan, _, _ = self.state_tables.plan(spec, seen)
        self.states = {spec.table_name: state_plan}

    def stored(self, name: str, parts: list[list[tuple[Any, ...]]], schema: pa.Schema = STAGED) -> list[str]:
        """A sink table holding ``parts`` (one Delta file each: (id, user, amount, _seq, _epoch) rows); its files' URIs, in that order."""
        uri = self.layout.sink_table(name)
        written: list[str] = []
        for rows in parts:
            write_deltalake(uri, pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema), mode="append")
            (added,) = set(DeltaTable(uri).file_uris()) - set(written)
            written.append(added)
        return written

    def tables(self) -> dict[str, OutputTable]:
        """Each sink planned against its table as it is (``plan_sink_table``), and the dead letters."""
        out = {DEAD_LETTER: OutputTable(DEAD_LETTER, self.layout.dead_letter, DEAD_LETTER_SCHEMA)}
        for name, key in (("all_events", ()), ("latest", ("user",))):
            uri = self.layout.sink_table(name)
            sink = plan_sink_table(name, uri, ROWS, key)
            out[name] = OutputTable(name, uri, sink.schema, sink.stored, sink.rewrite_all)
        return out

    def task_plan(self, members: tuple[int, ...], stage: int | None = None, receivers: int = 1) -> TaskPlan:
        incoming, outgoing = self.plan.crossing(stage) if stage is not None else ([], [])
        member_set = set(members)
        owner = {"dedup__seen": 1, "all_events": 2, "latest": 3}
        return TaskPlan(
            epoch=EPOCH, processing_time_ms=NOW, key_groups=GROUPS, parallelism=2, ranges=2,
            nodes=tuple(_detached(n) if i in member_set else None for i, n in enumerate(self.pipe.nodes)), inputs=self.plan.inputs,
            schemas=self.plan.schemas, members=members, watermark=WatermarkClock(None, {}, {}, False),
            states={k: v for k, v in self.states.items() if owner[k] in member_set},
            tables={k: v for k, v in self.tables().items() if owner.get(k, -1) in member_set or k == DEAD_LETTER},
            prefix=PREFIX, exchange_dir=join_uri(self.layout.dead_letter, PREFIX, "_exchange"),
            outgoing=tuple(outgoing), incoming=tuple(incoming), source_keys=self.plan.source_keys,
            computed_keys=self.plan.computed_keys, source_ids=("events",), source_files={0: ("001.jsonl",)},
            receivers=receivers, singletons=self.plan.singletons,
        )  # fmt: skip

    def read(self, table: str, described: list[dict[str, Any]]) -> list[dict[str, Any]]:
        uri = {"dedup__seen": self.layout.state_table("dedup", "seen"), DEAD_LETTER: self.layout.dead_letter}.get(
            table
        ) or self.layout.sink_table(table)
        return [r for d in described for r in pq.read_table(join_uri(uri, d["path"])).to_pylist()]


def _check_descriptions(root: str, described: list[dict[str, Any]]) -> None:
    """Each staged file: in the attempt's staging directory, its size, rows and statistics as written."""
    for d in described:
        assert d["path"].startswith(f"{PREFIX}/")
        path = Path(join_uri(root, d["path"]))
        rows = pq.read_table(path)
        assert d["size"] == path.stat().st_size and d["rows"] == rows.num_rows > 0
        stats = json.loads(d["stats"])
        assert stats["numRecords"] == rows.num_rows
        if KEY_GROUP in rows.column_names:
            assert stats["minValues"][KEY_GROUP] == min(rows[KEY_GROUP].to_pylist())
            assert stats["maxValues"][KEY_GROUP] == max(rows[KEY_GROUP].to_pylist())


def _fresh(rows: list[tuple[Any, ...]] = FRESH) -> list[dict[str, Any]]:
    return [{"id": i, "user": u, "amount": a, SEQ: s, "_epoch": EPOCH} for i, u, a, s in rows]


def test_one_task_runs_the_whole_pipeline_and_stages_every_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    epoch = Epoch(tmp_path)
    # The upsert sink: three files; only the first holds keys the epoch writes (u1, u2).
    monkeypatch.setattr(delta_sink, "UPSERT_WHOLE_REWRITE_ROWS", 1)  # a large table: rewrite only the files holding a changed key
    stored = epoch.stored(
        "latest",
        [
            [("x1", "u1", 10, 1, 1), ("x2", "u2", 20, 2, 1), ("x7", "u7", 70, 3, 1)],
            [("x8", "u8", 80, 4, 1)],
            [("x9", "u9", 90, 5, 1)],
        ],
    )
    plan = epoch.task_plan(tuple(range(len(epoch.pipe.nodes))))
    assert not plan.tables["latest"].rewrite_all and len(plan.tables["latest"].stored) == 3
    result = run_task(plan, TaskInput(0, key_group_ranges(1, GROUPS)[0], {0: tuple(epoch.splits)}))

    assert result.rows_in == 7  # six records and a dead letter
    assert result.exchange == {} and TaskResult.from_json(result.to_json()) == result
    assert set(result.files) == {"dedup__seen", "all_events", "latest", DEAD_LETTER}
    # The deduplication's state: the new keys, with their key groups; files clustered by the two key-group ranges.
    seen = epoch.read("dedup__seen", result.files["dedup__seen"])
    assert sorted((r["id"], r[KEY_GROUP], r["first_epoch"], r["_updated_at_ms"], r["_deleted"], r["_epoch"]) for r in seen) == [
        (k, _kg(k), EPOCH, NOW, False, EPOCH) for k in ("e1", "e2", "e3", "e4")
    ]
    assert len(result.files["dedup__seen"]) == len({_kg(k) * 2 // GROUPS for k in ("e1", "e2", "e3", "e4")})
    _check_descriptions(epoch.layout.state_table("dedup", "seen"), result.files["dedup__seen"])
    # The append sink: the fresh records in arrival order.
    assert epoch.read("all_events", result.files["all_events"]) == _fresh()
    assert "all_events" not in result.removes
    # The upsert sink: the file holding u1 and u2 is rewritten (u7 kept), the others stay; rows sorted by key.
    assert result.removes == {"latest": [stored[0][len(epoch.layout.sink_table("latest")) + 1 :]]}
    assert epoch.read("latest", result.files["latest"]) == [
        {"id": "e3", "user": "u1", "amount": 5, SEQ: 6, "_epoch": EPOCH},
        {"id": "e2", "user": "u2", "amount": 2, SEQ: 2, "_epoch": EPOCH},
        {"id": "e4", "user": "u5", "amount": 6, SEQ: 7, "_epoch": EPOCH},
        {"id": "x7", "user": "u7", "amount": 70, SEQ: 3, "_epoch": 1},
    ]
    # The dead letter names its file and line.
    (dead,) = epoch.read(DEAD_LETTER, result.files[DEAD_LETTER])
    assert (dead["source"], dead["source_file"], dead["line"], dead["reason"], dead["_epoch"]) == (
        "events",
        "001.jsonl",
        5,
        "null_key",
        EPOCH,
    )
    for name in ("all_events", "latest"):
        _check_descriptions(epoch.layout.sink_table(name), result.files[name])


def test_an_upsert_of_a_small_table_rewrites_every_stored_file(tmp_path: Path) -> None:
    epoch = Epoch(tmp_path)
    stored = epoch.stored("latest", [[("x1", "u1", 10, 1, 1)], [("x8", "u8", 80, 4, 1)]])
    plan = epoch.task_plan(tuple(range(len(epoch.pipe.nodes))))
    assert plan.tables["latest"].rewrite_all
    result = run_task(plan, TaskInput(0, key_group_ranges(1, GROUPS)[0], {0: tuple(epoch.splits)}))
    root = epoch.layout.sink_table("latest")
    assert sorted(result.removes["latest"]) == sorted(s[len(root) + 1 :] for s in stored)
    assert [(r["user"], r["id"]) for r in epoch.read("latest", result.files["latest"])] == [
        ("u1", "e3"),
        ("u2", "e2"),
        ("u5", "e4"),
        ("u8", "x8"),
    ]


def test_stage_by_stage_rows_cross_in_exchange_files_and_the_singleton_runs_in_task_0(tmp_path: Path) -> None:
    epoch = Epoch(tmp_path)
    assert epoch.plan.stages == [(0,), (1, 2), (3,)] and epoch.plan.singletons == {3}
    # The append sink's table holds amounts as int32: this epoch widens it, rewriting its stored rows.
    narrow = pa.schema([f.with_type(pa.int32()) if f.name == "amount" else f for f in STAGED])
    stored = epoch.stored("all_events", [[("old", "u0", 9, 1, 1)]], schema=narrow)
    ranges = key_group_ranges(2, GROUPS)

    # Stage 0: the source's task writes, for each task of the next stage, the rows of its key groups.
    (source_edge,) = epoch.plan.crossing(0)[1]
    first = run_task(
        epoch.task_plan((0,), 0, receivers=2), TaskInput(0, key_group_ranges(1, GROUPS)[0], {0: tuple(epoch.splits)})
    )
    assert set(first.files) == {DEAD_LETTER} and first.rows_in == 7
    sent = first.exchange[source_edge.name]
    by_task: dict[int, list[str]] = {}
    for line in LINES:
        if line["id"] is not None:
            by_task.setdefault(0 if _kg(line["id"]) <= ranges[0].high else 1, []).append(line["id"])
    assert set(sent) == set(by_task)
    for receiver, uris in sent.items():
        assert uris == [join_uri(epoch.task_plan((0,), 0).exchange_dir, f"{source_edge.name}/0-{receiver}.arrow")]
        with pa.memory_map(uris[0]) as f:
            rows = ipc.open_file(f).read_all()
        assert rows["id"].to_pylist() == by_task[receiver]  # in arrival order
        assert rows[KEY_GROUP].to_pylist() == [_kg(k) for k in by_task[receiver]]

    # Stage 1: a task per key-group range; each reads its exchange files and its key groups' state.
    second = [
        run_task(
            epoch.task_plan((1, 2), 1, receivers=2), TaskInput(t, groups, exchanged={source_edge.name: tuple(sent.get(t, ()))})
        )
        for t, groups in enumerate(ranges)
    ]
    appended = [r for result in second for r in epoch.read("all_events", result.files.get("all_events", []))]
    assert sorted(appended, key=lambda r: r[SEQ]) == [{"id": "old", "user": "u0", "amount": 9, SEQ: 1, "_epoch": 1}] + _fresh()
    # Only the first task stages the stored rows again (read with the wider type), and only it removes the old file.
    assert second[0].removes == {"all_events": [stored[0][len(epoch.layout.sink_table("all_events")) + 1 :]]}
    assert "old" in [r["id"] for r in epoch.read("all_events", second[0].files["all_events"])]
    assert second[1].removes == {} and "old" not in [
        r["id"] for r in epoch.read("all_events", second[1].files.get("all_events", []))
    ]
    assert all(pq.read_schema(join_uri(epoch.layout.sink_table("all_events"), d["path"])).field("amount").type == pa.int64()
               for result in second for d in result.files.get("all_events", []))  # fmt: skip
    seen = [r["id"] for result in second for r in epoch.read("dedup__seen", result.files.get("dedup__seen", []))]
    assert sorted(seen) == ["e1", "e2", "e3", "e4"]
    (global_edge,) = epoch.plan.crossing(1)[1]
    assert all(set(result.exchange[global_edge.name]) <= {0} for result in second)  # a GLOBAL edge: everything to task 0
    to_sink = tuple(u for result in second for u in result.exchange[global_edge.name].get(0, []))

    # Stage 2: the upsert sink is a singleton: it runs in task 0 only, whatever reaches another task.
    last = [
        run_task(epoch.task_plan((3,), 2, receivers=2), TaskInput(t, groups, exchanged={global_edge.name: to_sink}))
        for t, groups in enumerate(ranges)
    ]
    assert [(r["user"], r["id"]) for r in epoch.read("latest", last[0].files["latest"])] == [
        ("u1", "e3"),
        ("u2", "e2"),
        ("u5", "e4"),
    ]
    assert "latest" not in last[1].files
