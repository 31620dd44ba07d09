"""``orders_payments_ratio``: barrierflow's full ``orders_payments`` pipeline vs a Structured Streaming join.

Generates a messy order stream with ``barrierflow.demo.order_stream``
(``OrderStreamSpec`` / ``write_order_files``: ``landing/{orders,payments,
thresholds}/part-NNNNNN.jsonl`` with blank and malformed lines, duplicates,
out-of-order, late and early records), runs the ``orders_payments`` pipeline
over it through the CLI (``python -m barrierflow run orders_payments ...
--param max_files_per_epoch=2 --until-caught-up``, figures from ``checkpoints
--json`` as in ``engine_side.run_engine``), then ``sss_orders_payments.py``
over the same files in a fresh process, interleaved ``--runs`` times.

The sides do not do the same work: barrierflow runs the *whole* pipeline
(dead letters, dedup, watermarks, the interval join and its late output,
unpaid-order timers, the broadcast fraud check, customer sessions over a
union, running country totals: five outputs and two side outputs), Structured
Streaming only its join part (dedup, watermarks, the interval join; see
``sss_orders_payments.py``). The ratio therefore favours the baseline.

Throughput on both sides is events / processing time with session/JVM
start-up excluded (barrierflow: the union of its epochs' intervals; Spark: the
union of its batches' ``triggerExecution`` intervals, one query so their sum).
``events`` is the same number on both sides: the non-blank input lines of
``orders/``, ``payments/`` *and* ``thresholds/`` (barrierflow's ``rows_in``;
records plus dead letters; the baseline does not read the few threshold
lines). ``orders_payments_ratio`` = barrierflow events/s over SSS events/s
(target >= 2.5).

The output check compares barrierflow's ``paid_orders`` with Spark's pairs as
sets of ``(order_id, payment_id)`` (with their time stamps and amounts for the
common pairs). They differ only by the two sides' late-data rules: a pair only
in Spark must hold a record barrierflow judged late (``ts < W(n-1)``, the
watermark at the start of its epoch, from the checkpoint log: its order was
dropped or its payment went to ``late_payments``) that Spark's join did not
drop (``ts <= `` the watermark of the batch before, from the query progress);
a pair only in barrierflow must hold a record Spark dropped as late. Each kind
is counted; anything else is ``[MISMATCH]``.

Default scale: 8 files x 5,000 orders per source (76,950 events with seed 7, 4
epochs / batches; a steady barrierflow epoch of ~20,000 events took 1.3-1.6 s
on 2 cores in December 2026, its first epoch ~2 s: see ``bench/README.md`` for
every run and where an epoch's time goes).

CLI: ``python bench/orders_payments_bench.py [--files N] [--orders-per-file M] [--work-dir D]
[--files-per-batch 2] [--runs R] [--no-check]``; the last line is
``orders_payments_events_per_s=N sss_orders_payments_events_per_s=N orders_payments_ratio=R``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from s3_side import LoopbackS3, describe_s3, same_tables

from engine_side import EngineRunError, data_epochs, run_engine

__all__ = ["run_orders_payments", "generate_input", "compare_pairs", "TARGET_RATIO", "DEFAULT_FILES", "DEFAULT_ORDERS_PER_FILE"]

PIPELINE = "orders_payments"
TARGET_RATIO = 2.5
FILES_PER_BATCH = 2
DEFAULT_FILES = 8
DEFAULT_ORDERS_PER_FILE = 5_000
SEED = 7
STDERR_TAIL_LINES = 40
SSS_SCRIPT = Path(__file__).resolve().with_name("sss_orders_payments.py")


# -- running both sides -------------------------------------------------------------------


def generate_input(landing: Path, files: int, orders_per_file: int) -> Any:
    """Write the stream with ``barrierflow.demo.order_stream``; returns its spec."""
    from barrierflow.demo.order_stream import OrderStreamSpec, write_order_files

    spec = OrderStreamSpec(n_files=files, orders_per_file=orders_per_file, seed=SEED)
    write_order_files(landing, spec)
    return spec


def run_sss(landing: Path, work: Path, files_per_batch: int) -> dict[str, Any]:
    """``sss_orders_payments.py`` in a fresh Python/JVM process; its result dict."""
    command = [
        sys.executable, str(SSS_SCRIPT), str(landing), "--work-dir", str(work),
        "--files-per-batch", str(files_per_batch), "--json",
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        tail = "\n".join(completed.stderr.splitlines()[-STDERR_TAIL_LINES:])
        raise RuntimeError(f"SSS orders_payments exited {completed.returncode}:\n{tail}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


# -- the output check --------------------------------------------------------------------


def _us(value: Any) -> int:
    """A timestamp (pandas, datetime or ISO text) as epoch microseconds."""
    import pandas as pd

    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return int(ts.value // 1000)


def _first_file(landing: Path, source: str, field: str) -> dict[str, int]:
    """Id -> index of the first file (in name order) with a line naming it (duplicates and malformed copies land later or in the same file)."""
    first: dict[str, int] = {}
    for index, path in enumerate(sorted((landing / source).glob("*.jsonl"))):
        for raw in path.read_bytes().split(b"\n"):
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get(field), str):
                first.setdefault(obj[field], index)
    return first


def compare_pairs(
    warehouse: Path, sss: dict[str, Any], landing: Path, files_per_batch: int, epochs: list[dict[str, Any]]
) -> tuple[bool, list[str]]:
    """barrierflow's ``paid_orders`` vs Spark's pairs; (agree, explanation lines). See the module docstring."""
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    bf = DeltaTable(str(warehouse / PIPELINE / "sinks" / "paid_orders")).to_pandas()
    ss = ds.dataset(sss["output"], format="parquet", exclude_invalid_files=True).to_table().to_pandas()
    columns = ("ordered_at", "paid_at", "order_amount", "paid_amount")
    left = {(r.order_id, r.payment_id): r for r in bf.itertuples(index=False)}
    right = {(r.order_id, r.payment_id): r for r in ss.itertuples(index=False)}
    problems: list[str] = []
    for key in set(left) & set(right):
        a, b = left[key], right[key]
        if (_us(a.ordered_at), _us(a.paid_at), a.order_amount, a.paid_amount) != (
            _us(b.ordered_at), _us(b.paid_at), b.order_amount, b.paid_amount
        ):  # fmt: skip
            problems.append(f"{key}: {[getattr(a, c) for c in columns]} vs {[getattr(b, c) for c in columns]}")
    # barrierflow: epoch of a file index and the watermark at its start, W(n-1).
    data = data_epochs(epochs)
    starts: list[int | None] = []
    previous: int | None = None
    for epoch in epochs:
        if epoch in data:
            starts.append(previous)
        mark = epoch.get("watermark")
        if mark and mark != "-":
            previous = _us(datetime.fromisoformat(mark.replace("Z", "+00:00")))
    # Spark: the watermark each batch ran with (progress), so batch b's late-events watermark is batch b-1's.
    spark_marks = {b["batch_id"]: _us(b["watermark"]) for b in sss["batch"] if b.get("watermark")}
    order_file = _first_file(landing, "orders", "order_id")
    payment_file = _first_file(landing, "payments", "payment_id")

    def bf_late(ts_us: int, index: int) -> bool:
        w = starts[index // files_per_batch] if index // files_per_batch < len(starts) else None
        return w is not None and ts_us < w

    def spark_late(ts_us: int, index: int) -> bool:
        w = spark_marks.get(index // files_per_batch - 1)
        return w is not None and w > 0 and ts_us <= w

    def sides(row: Any) -> list[tuple[str, int, int]]:
        return [
            ("order", _us(row.ordered_at), order_file.get(row.order_id, -1)),
            ("payment", _us(row.paid_at), payment_file.get(row.payment_id, -1)),
        ]

    only_sss = {"order": 0, "payment": 0}
    only_bf = {"order": 0, "payment": 0}
    unexplained: list[str] = []
    for key in sorted(set(right) - set(left)):
        late = [name for name, ts, index in sides(right[key]) if bf_late(ts, index) and not spark_late(ts, index)]
        if late:
            only_sss[late[0]] += 1
        else:
            unexplained.append(f"only in SSS {key}")
    for key in sorted(set(left) - set(right)):
        late = [name for name, ts, index in sides(left[key]) if spark_late(ts, index)]
        if late:
            only_bf[late[0]] += 1
        else:
            unexplained.append(f"only in barrierflow {key}")
    ok = not problems and not unexplained
    lines = [
        f"{len(left):,} vs {len(right):,} pairs (order_id, payment_id); {len(set(left) & set(right)):,} in both"
        + (", their time stamps and amounts identical" if not problems else f", {len(problems)} differing in values"),
        f"only in SSS: {sum(only_sss.values()):,} (a barrierflow-late record Spark's join still took: "
        f"{only_sss['order']:,} late orders, {only_sss['payment']:,} late payments)",
        f"only in barrierflow: {sum(only_bf.values()):,} explained by Spark dropping a late row "
        f"({only_bf['order']:,} orders, {only_bf['payment']:,} payments)",
    ]
    if unexplained or problems:
        lines.append(f"unexplained: {len(unexplained) + len(problems)}, e.g. {(unexplained + problems)[:5]}")
    return ok, lines


# -- the benchmark -----------------------------------------------------------------------


def _describe_engine(engine: dict[str, Any]) -> str:
    durations = "/".join(f"{e['duration_ms'] / 1000:.1f}" for e in engine["completed"])
    return (
        f"barrierflow {PIPELINE} (whole pipeline: join, timers, broadcast, sessions, totals, dead letters): "
        f"{engine['events']:,} events in {engine['epochs']} epochs; processing time (epochs in progress) "
        f"{engine['processing_s']:.1f}s -> {engine['events_per_s']:,.0f} ev/s; process wall {engine['wall_s']:.1f}s "
        f"(start-up {engine['startup_s']:.1f}s) -> {engine['wall_events_per_s']:,.0f} ev/s; steady epoch "
        f"{engine['steady_epoch_s']:.2f}s (latency {engine['steady_latency_s']:.2f}s); epoch durations {durations} s"
        + (f"; {engine['other_records']} non-COMPLETED records ignored" if engine["other_records"] else "")
    )


def _describe_sss(sss: dict[str, Any]) -> str:
    from sss_orders_payments import describe

    return describe(sss)


def run_orders_payments(
    work_dir: Path,
    files: int = DEFAULT_FILES,
    orders_per_file: int = DEFAULT_ORDERS_PER_FILE,
    *,
    files_per_batch: int = FILES_PER_BATCH,
    runs: int = 2,
    check: bool = True,
    s3: bool = False,
) -> dict[str, Any]:
    """Generate the input under ``work_dir`` (emptied first), run both sides ``runs`` times interleaved, compare.

    The fastest run of each side counts (the machine's speed drifts between
    runs); the outputs of the first pair are compared. Keys:
    ``events_per_s`` (barrierflow), ``sss_events_per_s``,
    ``orders_payments_ratio``, ``events``, ``engine`` / ``sss`` (the fastest
    runs' figures), ``engine_runs`` / ``sss_runs`` (events/s of every run),
    ``check`` (explanation lines) and ``agree``. ``s3``: afterwards, barrierflow
    once more with landing and warehouse on the loopback S3 server
    (``s3_side.py``), reported beside the local figure (``s3_events_per_s``,
    ``s3_ratio``, ``s3_emulator_cpu_s``, ``s3_agree``).
    """
    from sss_orders_payments import count_events

    work = Path(work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    landing = work / "landing"
    started = time.perf_counter()
    generate_input(landing, files, orders_per_file)
    events = count_events(landing)
    print(
        f"generated {files} files x {orders_per_file:,} orders per source ({events:,} non-blank lines in orders, "
        f"payments and thresholds) in {time.perf_counter() - started:.1f}s"
    )
    engines, baselines = [], []
    for run in range(runs):
        engines.append(run_engine(landing, work / f"engine-{run}", pipeline=PIPELINE, files_per_epoch=files_per_batch))
        print(_describe_engine(engines[-1]))
        baselines.append(run_sss(landing, work / f"sss-{run}", files_per_batch))
        print(_describe_sss(baselines[-1]))
        if engines[-1]["events"] != events:
            print(f"note: barrierflow counted {engines[-1]['events']:,} events (rows_in), the files hold {events:,}")
    agree, lines = True, []
    if check:
        agree, lines = compare_pairs(Path(engines[0]["warehouse"]), baselines[0], landing, files_per_batch, engines[0]["completed"])
        print(f"output check, paid_orders: [{'OK' if agree else 'MISMATCH'}]")
        for line in lines:
            print(f"  {line}")
    engine = max(engines, key=lambda r: r["events_per_s"])
    sss = max(baselines, key=lambda r: r["batch_events_per_s"])
    ratio = engine["events_per_s"] / sss["batch_events_per_s"] if sss["batch_events_per_s"] else 0.0
    fastest = ""
    if runs > 1:
        bf_runs = ", ".join(f"{r['events_per_s']:,.0f}" for r in engines)
        sss_runs = ", ".join(f"{r['batch_events_per_s']:,.0f}" for r in baselines)
        fastest = f" (fastest of {runs} runs each: {bf_runs} vs {sss_runs} ev/s)"
    print(
        f"comparison{fastest}: barrierflow whole pipeline {engine['events_per_s']:,.0f} ev/s vs SSS join only "
        f"{sss['batch_events_per_s']:,.0f} ev/s -> {ratio:.3f}x; steady epoch {engine['steady_epoch_s']:.2f}s vs "
        f"steady batch {sss['steady_batch_s']:.2f}s; wall-clock (barrierflow incl. start-up, SSS query only): "
        f"{engine['wall_events_per_s']:,.0f} vs {sss['events_per_s']:,.0f} ev/s"
    )
    if ratio < TARGET_RATIO:
        print(f"TARGET MISSED: orders_payments_ratio {ratio:.3f} < {TARGET_RATIO}")
    extra: dict[str, Any] = {}
    if s3:
        with LoopbackS3(work / "s3-server.log") as server:
            landing_uri = server.upload(landing, "landing")
            before = server.cpu_seconds()
            on_s3 = run_engine(
                landing_uri, work / "engine-s3", pipeline=PIPELINE, files_per_epoch=files_per_batch,
                warehouse=server.uri("warehouse"), env=server.env,
            )  # fmt: skip
            emulator_s = server.cpu_seconds() - before
            differ = same_tables(
                f"{engine['warehouse']}/{PIPELINE}", f"{server.uri('warehouse')}/{PIPELINE}",
                ["sinks/paid_orders", "dead_letter"], server.env,
            )  # fmt: skip
        print(_describe_engine(on_s3))
        print(describe_s3(on_s3, engine, sss["batch_events_per_s"], emulator_s))
        print(f"  [{'OK' if not differ else 'MISMATCH'}] the S3 run's outputs against the local run's" + (f": {differ}" if differ else ""))
        extra = {
            "s3_events_per_s": on_s3["events_per_s"],
            "s3_ratio": on_s3["events_per_s"] / sss["batch_events_per_s"] if sss["batch_events_per_s"] else 0.0,
            "s3_emulator_cpu_s": emulator_s,
            "s3_agree": not differ,
        }
    return {
        **extra,
        "events": events,
        "events_per_s": engine["events_per_s"],
        "sss_events_per_s": sss["batch_events_per_s"],
        "orders_payments_ratio": ratio,
        "engine": {k: v for k, v in engine.items() if k != "completed"},
        "sss": sss,
        "engine_runs": [r["events_per_s"] for r in engines],
        "sss_runs": [r["batch_events_per_s"] for r in baselines],
        "check": lines,
        "agree": agree,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="./bench-work/orders_payments", help="scratch dir, emptied first")
    parser.add_argument("--files", type=int, default=DEFAULT_FILES, help="file indexes (one file per source each)")
    parser.add_argument("--orders-per-file", type=int, default=DEFAULT_ORDERS_PER_FILE)
    parser.add_argument("--files-per-batch", type=int, default=FILES_PER_BATCH, help="files per epoch / micro-batch and source")
    parser.add_argument("--runs", type=int, default=2, help="interleaved runs per side; the fastest of each counts")
    parser.add_argument("--no-check", action="store_true", help="skip the output comparison")
    parser.add_argument("--s3", action="store_true", help="also run barrierflow with landing and warehouse on loopback S3")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)
    args = _parse_args(argv)
    try:
        result = run_orders_payments(
            Path(args.work_dir),
            args.files,
            args.orders_per_file,
            files_per_batch=args.files_per_batch,
            runs=args.runs,
            check=not args.no_check,
            s3=args.s3,
        )
    except (RuntimeError, EngineRunError) as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        sys.exit(1)
    print(
        f"orders_payments_events_per_s={result['events_per_s']:.0f} "
        f"sss_orders_payments_events_per_s={result['sss_events_per_s']:.0f} "
        f"orders_payments_ratio={result['orders_payments_ratio']:.3f}"
        + (f" s3_orders_payments_ratio={result['s3_ratio']:.3f}" if "s3_ratio" in result else "")
    )


if __name__ == "__main__":
    main()
