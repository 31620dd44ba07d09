"""barrierflow benchmark: running aggregate vs Spark Structured Streaming, and incremental state bytes.

Entry point of ``make bench``. Generates the event stream into the work dir,
runs the barrierflow pipeline ``bench_running_agg`` over it (one file per
epoch) through the CLI and the Structured Streaming baseline over the same
files (one file per batch, two shuffle settings x three JVM option sets, each in
a fresh process), interleaved: one engine run before each baseline run, the
fastest of each side compared (the machine's speed drifts between runs, and
picking the fastest of six baseline runs alone would favour the baseline),
then measures the bytes of state written by an epoch that changes 1% of 1M
keys against a full zstd Parquet snapshot of that state. Then the full
``sensor_stats`` pipeline against its Structured Streaming implementation
(``sensor_stats_bench.py``), the full ``orders_payments`` pipeline against a
Structured Streaming implementation of its interval join
(``orders_payments_bench.py``) and the big-state benchmark, running aggregate
plus dedup at 1M, 4M and 16M keys with a 1 GiB driver and, on both sides, the
executors in their own JVMs (``local-cluster[2,1,2048]``, ``bigstate_bench.py``).

Throughput on both sides is events / processing time: for the engine the
time during which at least one epoch was in progress (the union of the epochs'
``duration_ms`` intervals; two checkpoints overlap, so summing would count the
overlap twice), for Spark the sum of per-batch ``triggerExecution`` durations
(batches run one at a time). JVM/session start-up is excluded on both sides. Wall-clock figures are printed too. The last line is machine-readable:
``events_per_s=N sss_events_per_s=N ratio=R incremental_bytes_ratio=F sensor_stats_ratio=S sensor_stats_5_ratio=S5
orders_payments_ratio=O s3_sensor_stats_ratio=S3 s3_orders_payments_ratio=O3 bigstate_epoch_ratio=B
bigstate_driver_peak_mb=M heap_ratio=H`` (``ratio`` for the default
``delta`` state backend, ``heap_ratio`` for ``heap``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bigstate_bench import DEFAULT_SIZES, run_bigstate
from engine_side import PIPELINE, EngineRunError, data_epochs, run_engine
from generate import generate, generate_incremental
from orders_payments_bench import run_orders_payments
from sensor_stats_bench import DEFAULT_FILES, DEFAULT_RECORDS_PER_FILE, run_sensor_stats
from sss_baseline import describe, fastest, run_sss_isolated, settings
from state_snapshot import full_snapshot_bytes

TARGET_RATIO = 3.0
TARGET_INCREMENTAL_RATIO = 0.05
CHANGED_FRACTION = 0.01


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="./bench-work", help="scratch root, emptied first (default ./bench-work)")
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--incremental-keys", type=int, default=1_000_000, help="keys of the incremental scenario")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--bigstate-sizes", default=",".join(str(n) for n in DEFAULT_SIZES), help="key counts of the big-state benchmark"
    )
    return parser.parse_args(argv)


def _mb(size: float) -> str:
    """Bytes as megabytes for display."""
    return f"{size / 1e6:,.1f} MB"


def _prepare_inputs(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """Empty the work dir and generate both input streams; return their directories."""
    shutil.rmtree(work, ignore_errors=True)
    stream, incremental = work / "input", work / "incremental-input"
    started = time.perf_counter()
    generate(stream, args.events, args.keys, args.files, args.seed)
    generate_incremental(incremental, args.incremental_keys, CHANGED_FRACTION, args.seed)
    print(
        f"generated {args.events:,} events / {args.keys:,} keys / {args.files} files and the "
        f"{args.incremental_keys:,}-key incremental input in {time.perf_counter() - started:.1f}s"
    )
    return stream, incremental


def _describe_engine(engine: dict[str, Any], backend: str) -> str:
    """One human-readable line of the engine's throughput figures."""
    return (
        f"engine {PIPELINE} (state backend {backend}): {engine['events']:,} events in {engine['epochs']} epochs; "
        f"processing time (epochs in progress) {engine['processing_s']:.1f}s -> {engine['events_per_s']:,.0f} ev/s; "
        f"process wall {engine['wall_s']:.1f}s (start-up {engine['startup_s']:.1f}s) -> "
        f"{engine['wall_events_per_s']:,.0f} ev/s; steady epoch {engine['steady_epoch_s']:.2f}s "
        f"(completion to completion; epoch latency {engine['steady_latency_s']:.2f}s); "
        f"mean bytes written/epoch {_mb(engine['mean_bytes_written'])}"
        + (f"; {engine['other_records']} non-COMPLETED records ignored" if engine["other_records"] else "")
    )


def _incremental_ratio(incremental: dict[str, Any], work: Path, keys: int) -> tuple[float, list[str]]:
    """Epoch-2 state bytes over the full-snapshot bytes, with explanatory lines."""
    epochs = data_epochs(incremental["completed"])
    if len(epochs) < 2:
        raise EngineRunError(f"incremental run completed {len(epochs)} epochs with input, expected 2")
    second = epochs[1]
    state_root = Path(incremental["warehouse"]) / PIPELINE / "state"
    snapshot = full_snapshot_bytes(state_root, work / "incremental-snapshot", keys)
    if snapshot.bytes == 0:
        raise EngineRunError(f"no Delta state tables found under {state_root}")
    ratio = second["state_bytes_written"] / snapshot.bytes
    lines = [
        f"incremental: epoch {second['epoch']} ({second['rows_in']:,} events over "
        f"{round(keys * CHANGED_FRACTION):,} of {keys:,} keys) wrote {second['state_bytes_written']:,} state bytes; "
        f"full snapshot (zstd Parquet) {snapshot.bytes:,} bytes -> ratio {ratio:.4f}",
        *(f"  snapshot of {method}" for method in snapshot.methods),
    ]
    return ratio, lines


def _missed_targets(ratio: float, incremental_ratio: float) -> list[str]:
    """A ``TARGET MISSED`` line for each target the figures miss."""
    misses = []
    if ratio < TARGET_RATIO:
        misses.append(f"TARGET MISSED: throughput ratio {ratio:.3f} < {TARGET_RATIO}")
    if incremental_ratio >= TARGET_INCREMENTAL_RATIO:
        misses.append(f"TARGET MISSED: incremental bytes ratio {incremental_ratio:.3f} >= {TARGET_INCREMENTAL_RATIO}")
    return misses


def run(args: argparse.Namespace) -> None:
    """Run every measurement and print the report; raises on a failed run."""
    work = Path(args.work_dir).resolve()
    stream, incremental_input = _prepare_inputs(args, work)
    # The machine's speed drifts by 10-20% between runs, and SSS reports the fastest of
    # its settings; so the engine runs as often, interleaved, and reports its fastest too.
    # Both state backends (see README): ``delta``, the default, merges state on
    # the executors; ``heap`` keeps running aggregates resident on the driver.
    engine_results, heap_results, sss_results = [], [], []
    for name, partitions, options in settings():
        engine_results.append(run_engine(stream, work / "engine"))
        print(_describe_engine(engine_results[-1], "delta"))
        heap_results.append(run_engine(stream, work / "engine-heap", ("--state-backend", "heap")))
        print(_describe_engine(heap_results[-1], "heap"))
        sss_results.append(run_sss_isolated(stream, work / "sss" / name, partitions, options))
        print(describe(sss_results[-1]))
    engine = max(engine_results, key=lambda r: r["events_per_s"])
    heap = max(heap_results, key=lambda r: r["events_per_s"])
    incremental = run_engine(incremental_input, work / "incremental")
    incremental_ratio, incremental_lines = _incremental_ratio(incremental, work, args.incremental_keys)
    sss = fastest(sss_results)
    ratio = engine["events_per_s"] / sss["batch_events_per_s"]
    heap_ratio = heap["events_per_s"] / sss["batch_events_per_s"]
    for backend, best, results, backend_ratio in (("delta", engine, engine_results, ratio), ("heap", heap, heap_results, heap_ratio)):
        runs = ", ".join(f"{r['events_per_s']:,.0f}" for r in results)
        print(
            f"comparison: engine, state backend {backend} (fastest of {len(results)} runs: {runs} ev/s) processing time "
            f"{best['events_per_s']:,.0f} ev/s vs SSS "
            f"(shuffle.partitions={sss['shuffle_partitions']}, JVM options {sss['java_options'] or '(defaults)'}) sum-of-batches {sss['batch_events_per_s']:,.0f} ev/s "
            f"-> {backend_ratio:.3f}x; steady epoch {best['steady_epoch_s']:.2f}s vs steady batch {sss['steady_batch_s']:.2f}s; "
            f"wall-clock (engine incl. start-up, SSS query only): "
            f"{best['wall_events_per_s']:,.0f} vs {sss['events_per_s']:,.0f} ev/s"
        )
    for line in incremental_lines:
        print(line)
    for miss in _missed_targets(ratio, incremental_ratio):
        print(miss)
    # Each prints its own figures and missed targets.
    # sensor_stats at 100 sensors (and on the loopback S3 server) and at 5 sensors: speed must not depend on many keys.
    sensor = run_sensor_stats(work / "sensor_stats", DEFAULT_FILES, DEFAULT_RECORDS_PER_FILE, s3=True)
    few_keys = run_sensor_stats(work / "sensor_stats_5", DEFAULT_FILES, DEFAULT_RECORDS_PER_FILE, sensors=5)
    orders = run_orders_payments(work / "orders_payments", s3=True)
    # The ratio is taken at the largest size; smaller sizes show the driver peak only.
    bigstate = run_bigstate(work, tuple(int(n) for n in args.bigstate_sizes.split(",")), sss_largest_only=True)
    print(
        f"events_per_s={engine['events_per_s']:.0f} sss_events_per_s={sss['batch_events_per_s']:.0f} "
        f"ratio={ratio:.3f} incremental_bytes_ratio={incremental_ratio:.3f} "
        f"sensor_stats_ratio={sensor['sensor_stats_ratio']:.3f} "
        f"sensor_stats_5_ratio={few_keys['sensor_stats_ratio']:.3f} "
        f"orders_payments_ratio={orders['orders_payments_ratio']:.3f} "
        f"s3_sensor_stats_ratio={sensor['s3_ratio']:.3f} s3_orders_payments_ratio={orders['s3_ratio']:.3f} "
        f"bigstate_epoch_ratio={bigstate['bigstate_epoch_ratio']:.3f} "
        f"bigstate_driver_peak_mb={bigstate['bigstate_driver_peak_mb']:.0f} heap_ratio={heap_ratio:.3f}"
    )


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show up as they happen
    try:
        run(_parse_args(argv))
    except RuntimeError as error:  # EngineRunError and SSS baseline failures
        print(f"benchmark failed: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
