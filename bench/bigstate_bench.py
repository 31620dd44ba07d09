"""Big-state benchmark: dedup + running aggregate over millions of keys, barrierflow vs Structured Streaming.

For each size (1M, 4M and 16M keys by default) the input is one bulk-load
file holding one event for every key, then ``--steady-epochs`` files that
each change 1% of the keys (one fresh event for each of ``keys / 100``
distinct random keys) plus 0.1% of ``keys`` redelivered events (exact copies
of events of earlier files: the dedup drops them, so they change no key).
Files are Parquet (``event_id``, ``sensor_id``, ``ts``, ``temperature``),
generated column-wise with numpy/Arrow; a generated input is reused when its
manifest matches.

barrierflow runs ``bench_bigstate`` (``bench/bench_bigstate.py``: dedup by
``event_id`` with no TTL -> count/sum/min/max per ``sensor_id`` -> append
Delta sink) through the CLI, ``python -m barrierflow run
bench_bigstate:bench_bigstate ... --until-caught-up`` (one file per epoch,
the default ``delta`` state backend, two concurrent checkpoints) with
``BARRIERFLOW_DRIVER_MEMORY=1g`` (``spark.driver.memory``) on the master
``--master`` names (``BARRIERFLOW_SPARK_MASTER``; default
``local-cluster[2,1,2048]``: two executors of one core in their own JVMs, each
with Spark's default 1 GiB heap, as on a cluster), and reads the
figures from ``python -m barrierflow checkpoints bench_bigstate --json``.
Structured Streaming runs ``sss_bigstate.py`` (``dropDuplicates`` on
``event_id``, the same aggregate in update mode, RocksDB state store with
changelog checkpointing, ``foreachBatch`` to Parquet, one file per batch,
shuffle partitions = core count, the same master, driver memory and JVM
options), in a fresh process.

Figures, per size:

* steady epoch (barrierflow): the median time from one epoch's completion to
  the next over the steady epochs after the first one (epochs overlap with
  two concurrent checkpoints, so this is an epoch's share of the time; its
  latency, barrier to completion, is printed beside it). Steady batch (SSS):
  the median ``triggerExecution`` of the same batches. ``bigstate_epoch_ratio``
  is the first over the second at the largest size (target <= 1.0).
* driver peak RSS: the barrierflow CLI process tree is sampled every 0.2 s
  with ``psutil``. The *driver* is the CLI's Python process plus its JVM (its
  direct ``java`` child: ``spark-submit`` execs into the driver JVM; Spark's
  short-lived launcher JVM before it is not counted), by RSS. With
  ``local-cluster`` the executors are separate JVMs (children of the driver
  JVM, found by their main class) and are reported beside the driver
  (``executors``, the sum of their RSS). In ``local[*]``
  mode the executors are threads of that JVM, so everything executor-side
  (task memory, shuffle buffers, the block manager's cached/persisted
  blocks, Parquet and Delta readers) is counted in it too, as are the JVM's
  own overheads beyond the 1g heap (metaspace, code cache, GC structures,
  thread stacks, direct buffers). PySpark's Python workers, forked by the
  JVM, are not part of the driver and are reported beside it (by PSS, as
  forked workers share pages with their daemon). Processes the JVM forks
  only to exec a command (Hadoop's local file system runs ``chmod``) show
  the JVM's pages as their own RSS for a moment and are not counted. The
  driver peak is the largest sum over one sample (a spike shorter than
  0.2 s can be missed); the sum of the two processes' ``VmHWM`` (each one's
  own high-water mark, not necessarily simultaneous) is printed as an upper
  bound. ``bigstate_driver_peak_mb`` is the largest driver peak over all
  sizes, in MiB (target < 1536 MiB = 1.5 GiB). The SSS process is sampled
  the same way, for comparison only.

Both sides are checked: every epoch/batch must update as many keys as the
generator changed (barrierflow's ``rows_out``, SSS's aggregate state
operator's ``numRowsUpdated``), SSS's final state must hold every key and
every distinct event id, and the last steady epoch's output rows of the two
engines must agree (count, min, max exactly; sum to 1e-9 relative).

CLI: ``python bench/bigstate_bench.py [--work-dir W] [--sizes 1000000,4000000]
[--steady-epochs 5] [--master M] [--keep] [--timeout SECONDS] [--sss-largest-only]``. Last line:
``bigstate_epoch_ratio=B bigstate_driver_peak_mb=M``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from barrierflow.execution.spark import MASTER_ENV  # noqa: E402
from bench_bigstate import EVENT_SCHEMA, PIPELINE_REF, SINK  # noqa: E402

__all__ = ["run_bigstate", "generate_bigstate", "ProcessTreeMonitor", "DEFAULT_SIZES"]

DEFAULT_SIZES = (1_000_000, 4_000_000, 16_000_000)
STEADY_EPOCHS = 5
CHANGED_FRACTION = 0.01
REDELIVERED_FRACTION = 0.001
DRIVER_MEMORY = "1g"
# Executors in their own JVMs, as on a cluster: the driver's figure is then the
# driver's own, not the executors' work in its heap (local[*] runs them inside it).
MASTER = "local-cluster[2,1,2048]"
EXECUTOR_MAIN = "CoarseGrainedExecutorBackend"
TARGET_RATIO = 1.0
TARGET_DRIVER_PEAK_MB = 1536.0
PIPELINE_NAME = "bench_bigstate"
MANIFEST = "_manifest.json"  # "_": neither Spark nor the FileSource reads it
GENERATOR_VERSION = 2
BASE_TS_MS = 1_700_000_000_000
SAMPLE_INTERVAL_S = 0.2
RUN_TIMEOUT_S = 3600
STDERR_TAIL_LINES = 40
MIB = 1024 * 1024

class BigstateRunError(RuntimeError):
    """A benchmark subprocess failed or its result did not verify."""


class _Skipped(Exception):
    """A run left out on purpose."""


# -- input ----------------------------------------------------------------


def _prefixed(prefix: str, values: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(values), pa.string()), "")


def _write_events(path: Path, event_ids: np.ndarray, keys: np.ndarray, ts: np.ndarray, centi: np.ndarray) -> None:
    """One Parquet file of events, written under a dot-prefixed name and renamed into place."""
    table = pa.Table.from_arrays(
        [_prefixed("e", event_ids), _prefixed("s", keys), pa.array(ts), pa.array(centi / 100.0)],
        schema=EVENT_SCHEMA,
    )
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, row_group_size=1 << 20)
    os.replace(tmp, path)


def generate_bigstate(
    out_dir: str | Path, keys: int, steady_epochs: int = STEADY_EPOCHS, seed: int = 42
) -> dict[str, Any]:
    """Write the bulk-load file and ``steady_epochs`` steady files; return (and store) the manifest.

    File 1: one event per key, keys in random order. Each steady file:
    ``round(keys * CHANGED_FRACTION)`` fresh events on as many distinct random
    keys, and ``round(keys * REDELIVERED_FRACTION)`` exact copies of random
    earlier events, shuffled together. Files get modification times in name
    order. Reuses an existing input whose manifest matches.
    """
    out = Path(out_dir)
    wanted = {
        "version": GENERATOR_VERSION, "keys": keys, "steady_epochs": steady_epochs, "seed": seed,
        "changed_fraction": CHANGED_FRACTION, "redelivered_fraction": REDELIVERED_FRACTION,
    }  # fmt: skip
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        existing = json.loads(manifest_path.read_text())
        if {k: existing.get(k) for k in wanted} == wanted:
            return existing
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    changed = round(keys * CHANGED_FRACTION)
    redelivered = round(keys * REDELIVERED_FRACTION)
    total = keys + steady_epochs * changed
    # Every distinct event, by event id: its key, timestamp and temperature (hundredths).
    event_keys = np.empty(total, dtype=np.int64)
    event_keys[:keys] = rng.permutation(keys)
    for epoch in range(steady_epochs):
        start = keys + epoch * changed
        event_keys[start : start + changed] = rng.choice(keys, size=changed, replace=False)
    event_ts = BASE_TS_MS + np.arange(total, dtype=np.int64) + rng.integers(-500, 501, size=total)
    event_centi = np.rint(rng.normal(20.0, 8.0, size=total) * 100).astype(np.int64)
    files = []
    ids = np.arange(keys, dtype=np.int64)
    files.append({"name": "events-000001.parquet", "rows": keys, "fresh": keys, "changed_keys": keys})
    _write_events(out / files[0]["name"], ids, event_keys[ids], event_ts[ids], event_centi[ids])
    for epoch in range(steady_epochs):
        start = keys + epoch * changed
        fresh = np.arange(start, start + changed, dtype=np.int64)
        again = rng.integers(0, start, size=redelivered)
        ids = rng.permutation(np.concatenate([fresh, again]))
        name = f"events-{epoch + 2:06d}.parquet"
        files.append({"name": name, "rows": len(ids), "fresh": changed, "changed_keys": changed})
        _write_events(out / name, ids, event_keys[ids], event_ts[ids], event_centi[ids])
    # Structured Streaming's file source takes files in modification-time order (ties in
    # any order): make it the name order, one second apart, in the past.
    now = time.time()
    for number, file in enumerate(files):
        stamp = now - (len(files) - number)
        os.utime(out / file["name"], (stamp, stamp))
    manifest = {**wanted, "files": files, "distinct_events": total, "rows": sum(f["rows"] for f in files)}
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


# -- process memory -------------------------------------------------------


def _vm_hwm_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class ProcessTreeMonitor:
    """Samples the memory of a PySpark driver process tree every ``interval_s`` in a thread.

    Per sample: ``python`` = RSS of the root process; ``jvm`` = RSS of its
    direct ``java`` children (``spark-submit`` execs into the driver JVM, so
    that is the JVM; Spark's launcher JVM runs as a grandchild before it and
    is not counted); ``driver`` = the two together; ``executors`` = RSS of
    the executor JVMs under it (``local-cluster``; none in ``local[*]``);
    ``workers`` = PSS of the Python processes under the JVM (PySpark's
    workers; PSS, as forked workers share pages with their daemon); ``tree``
    = driver + executors + workers. Processes the
    JVM forks only to exec a command (``chmod``, ``rm``, ``jspawnhelper``)
    report the JVM's pages as their own RSS while they exist and are left out.
    Keeps the peak of each figure and the last ``VmHWM`` (own high-water mark)
    of the root and the JVM.
    """

    def __init__(self, pid: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.peaks = {"driver": 0, "tree": 0, "python": 0, "jvm": 0, "executors": 0, "workers": 0}
        self.samples = 0
        self._hwm: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ProcessTreeMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        try:
            python = self.root.memory_info().rss
            jvms = [c for c in self.root.children() if c.name() == "java"]
        except psutil.Error:
            return
        jvm = executors = workers = 0
        for process in jvms:
            try:
                jvm += process.memory_info().rss
                for child in process.children(recursive=True):
                    try:
                        if child.name().startswith("python"):
                            workers += child.memory_full_info().pss
                        elif child.name() == "java" and any(EXECUTOR_MAIN in arg for arg in child.cmdline()):
                            executors += child.memory_info().rss
                    except psutil.Error:
                        continue
            except psutil.Error:
                continue
        for pid in (self.root.pid, *(j.pid for j in jvms)):
            hwm = _vm_hwm_bytes(pid)
            if hwm:
                self._hwm[pid] = hwm
        self.samples += 1
        driver = python + jvm
        figures = {
            "python": python, "jvm": jvm, "driver": driver, "executors": executors, "workers": workers,
            "tree": driver + executors + workers,
        }  # fmt: skip
        for name, value in figures.items():
            self.peaks[name] = max(self.peaks[name], value)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def figures(self) -> dict[str, float]:
        """Peaks in MiB (``driver_peak_mb`` ...) and ``driver_hwm_sum_mb`` (an upper bound of the driver's)."""
        out: dict[str, float] = {f"{name}_peak_mb": value / MIB for name, value in self.peaks.items()}
        out["driver_hwm_sum_mb"] = sum(self._hwm.values()) / MIB
        out["samples"] = self.samples
        return out


def _kill_tree(pid: int) -> None:
    """Kill a process this module started and every process under it."""
    try:
        root = psutil.Process(pid)
        processes = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=30)


def _run_monitored(
    command: list[str], env: dict[str, str], log: Path, timeout_s: float
) -> tuple[str, float, dict[str, float], bool]:
    """Run ``command`` with its memory sampled; return stdout, wall seconds, memory figures, timed out.

    stdout and stderr go to files beside ``log`` (``.out``/``.err``), kept for
    inspection. After ``timeout_s`` the process and its children are killed
    and the result says so; a non-zero exit otherwise raises
    :class:`BigstateRunError` with the stderr tail.
    """
    out_path, err_path = log.with_suffix(".out"), log.with_suffix(".err")
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    timed_out = False
    with open(out_path, "w") as out, open(err_path, "w") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        with ProcessTreeMonitor(process.pid) as monitor:
            try:
                returncode = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_tree(process.pid)
                returncode = process.wait()
    wall_s = time.perf_counter() - started
    if returncode != 0 and not timed_out:
        tail = "\n".join(err_path.read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:])
        raise BigstateRunError(
            f"`{' '.join(command)}` exited {returncode} after {wall_s:.0f}s (driver peak "
            f"{monitor.figures()['driver_peak_mb']:,.0f} MiB); full stderr in {err_path}; tail:\n{tail}"
        )
    return out_path.read_text(), wall_s, monitor.figures(), timed_out


# -- barrierflow ------------------------------------------------------------


def _engine_env(master: str) -> dict[str, str]:
    env = dict(os.environ)
    env["BARRIERFLOW_DRIVER_MEMORY"] = DRIVER_MEMORY
    env[MASTER_ENV] = master
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("BARRIERFLOW_SPARK_REMOTE", None)
    env.pop("SPARK_REMOTE", None)
    return env


def _end_s(epoch: dict[str, Any]) -> float:
    return datetime.fromisoformat(epoch["recorded_at"].replace("Z", "+00:00")).timestamp()


def _checkpoints(warehouse: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    # ``checkpoints`` takes the pipeline's registered name (it does not load the
    # definition): with ``bench_bigstate:bench_bigstate`` it looks for a directory of that name.
    command = [sys.executable, "-m", "barrierflow", "checkpoints", PIPELINE_NAME, "--warehouse", str(warehouse), "--json"]
    completed = subprocess.run(command, capture_output=True, text=True, env=env)
    if completed.returncode != 0:
        raise BigstateRunError(f"`{' '.join(command)}` exited {completed.returncode}:\n{completed.stderr[-4000:]}")
    return sorted(json.loads(completed.stdout), key=lambda record: record["epoch"])


def run_barrierflow(
    input_dir: Path, work_dir: Path, manifest: dict[str, Any], timeout_s: float = RUN_TIMEOUT_S, master: str = MASTER
) -> dict[str, Any]:
    """Run ``bench_bigstate`` over ``input_dir`` into a fresh warehouse; figures of its epochs.

    A run killed after ``timeout_s`` still reports the epochs it completed
    (``timed_out`` is set, and the missing epochs are listed as problems).
    """
    warehouse = work_dir / "warehouse"
    shutil.rmtree(warehouse, ignore_errors=True)
    env = _engine_env(master)
    command = [
        sys.executable, "-m", "barrierflow", "run", PIPELINE_REF, "--warehouse", str(warehouse),
        "--param", f"landing_dir={input_dir}", "--param", "max_files_per_epoch=1", "--until-caught-up",
    ]  # fmt: skip
    _, wall_s, memory, timed_out = _run_monitored(command, env, work_dir / "logs" / "barrierflow.log", timeout_s)
    records = _checkpoints(warehouse, env) if (warehouse / PIPELINE_NAME / "_pipeline.json").exists() else []
    epochs = [r for r in records if r["status"] == "COMPLETED" and r["rows_in"] > 0]
    expected = manifest["files"]
    problems = [f"timed out after {wall_s:.0f}s and killed"] if timed_out else []
    if len(epochs) != len(expected):
        problems.append(f"{len(epochs)} completed epochs with input, expected {len(expected)}")
    for epoch, file in zip(epochs, expected):
        if epoch["rows_in"] != file["rows"] or epoch["rows_out"] != file["changed_keys"]:
            problems.append(
                f"epoch {epoch['epoch']}: rows_in {epoch['rows_in']:,} rows_out {epoch['rows_out']:,}, "
                f"expected {file['rows']:,} in and {file['changed_keys']:,} changed keys out"
            )
    durations = [e["duration_ms"] / 1000 for e in epochs]
    ends = [_end_s(e) for e in epochs]
    periods = [later - earlier for earlier, later in zip(ends, ends[1:])]  # periods[i] ends at epoch i + 1
    steady_periods = periods[1:]  # the steady epochs after the first steady one
    return {
        "wall_s": wall_s,
        "timed_out": timed_out,
        "epochs": len(epochs),
        "epoch_numbers": [e["epoch"] for e in epochs],
        "duration_s": durations,
        "period_s": periods,
        "bulk_epoch_s": durations[0] if durations else 0.0,
        "steady_epoch_s": statistics.median(steady_periods) if steady_periods else float("nan"),
        "steady_latency_s": statistics.median(durations[2:]) if durations[2:] else float("nan"),
        "state_bytes_written": [e["state_bytes_written"] for e in epochs],
        "bytes_written": [e["bytes_written"] for e in epochs],
        "other_records": len(records) - sum(1 for r in records if r["status"] == "COMPLETED"),
        "memory": memory,
        "master": master,
        "warehouse": str(warehouse),
        "problems": problems,
    }


# -- Structured Streaming -------------------------------------------------


def run_sss(
    input_dir: Path, work_dir: Path, manifest: dict[str, Any], timeout_s: float = RUN_TIMEOUT_S, master: str = MASTER
) -> dict[str, Any]:
    """Run ``sss_bigstate.py`` in a fresh process; its figures plus memory and verification problems.

    Raises :class:`BigstateRunError` if it fails or is killed after ``timeout_s``.
    """
    command = [
        sys.executable, str(BENCH_DIR / "sss_bigstate.py"), str(input_dir), "--work-dir", str(work_dir),
        "--shuffle-partitions", str(os.cpu_count() or 1), "--driver-memory", DRIVER_MEMORY, "--master", master, "--json",
    ]  # fmt: skip
    env = dict(os.environ)
    env.pop("SPARK_REMOTE", None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    stdout, wall_s, memory, timed_out = _run_monitored(command, env, work_dir / "logs" / "sss.log", timeout_s)
    if timed_out:
        raise BigstateRunError(f"SSS timed out after {wall_s:.0f}s and was killed (peak RSS {memory['driver_peak_mb']:,.0f} MiB)")
    result = json.loads(stdout.strip().splitlines()[-1])
    expected = manifest["files"]
    problems = []
    if result["rows_in"] != [f["rows"] for f in expected]:
        problems.append(f"rows per batch {result['rows_in']} != files {[f['rows'] for f in expected]}")
    aggregate_ops = [_aggregate_state(state) for state in result["state"]]
    updated = [op["rows_updated"] for op in aggregate_ops]
    if updated != [f["changed_keys"] for f in expected]:
        problems.append(f"aggregate rows updated per batch {updated} != changed keys {[f['changed_keys'] for f in expected]}")
    final = result["state"][-1] if result["state"] else {}
    totals = sorted(op["rows_total"] for op in final.values())
    if totals != sorted([manifest["keys"], manifest["distinct_events"]]):
        problems.append(f"final state rows {totals} != keys {manifest['keys']:,} and distinct events {manifest['distinct_events']:,}")
    return {**result, "process_wall_s": wall_s, "memory": memory, "problems": problems}


def _aggregate_state(state: dict[str, dict[str, int]]) -> dict[str, int]:
    """The aggregate's state operator figures (the one that is not the dedup)."""
    others = {name: op for name, op in state.items() if "dedup" not in name.lower()}
    if len(others) != 1:
        raise BigstateRunError(f"cannot tell the aggregate state operator among {sorted(state)}")
    return next(iter(others.values()))


# -- cross-check ------------------------------------------------------------


def cross_check(engine: dict[str, Any], sss: dict[str, Any]) -> list[str]:
    """Compare the last steady epoch's output rows of both engines; a list of problems (empty if equal)."""
    if not engine["epoch_numbers"] or not sss["batch_ids"]:
        return ["no epoch/batch to compare"]
    from deltalake import DeltaTable

    epoch = engine["epoch_numbers"][-1]
    sink = Path(engine["warehouse"]) / PIPELINE_NAME / "sinks" / SINK
    ours = (
        DeltaTable(str(sink)).to_pyarrow_dataset()
        .to_table(filter=ds.field("_epoch") == epoch, columns=["sensor_id", "count", "sum", "min", "max"])
        .sort_by("sensor_id")
    )  # fmt: skip
    theirs = (
        ds.dataset(str(Path(sss["output"]) / f"batch_id={sss['batch_ids'][-1]}"), format="parquet")
        .to_table(columns=["sensor_id", "count", "sum", "min", "max"])
        .sort_by("sensor_id")
    )
    if ours.num_rows != theirs.num_rows:
        return [f"last epoch output: {ours.num_rows:,} rows vs SSS {theirs.num_rows:,}"]
    problems = []
    for column in ("sensor_id", "count", "min", "max"):
        a, b = ours.column(column).to_numpy(), theirs.column(column).to_numpy()
        if not np.array_equal(a.astype(b.dtype) if column == "count" else a, b):
            problems.append(f"last epoch output: column {column} differs")
    a, b = ours.column("sum").to_numpy(), theirs.column("sum").to_numpy()
    if not np.allclose(a, b, rtol=1e-9, atol=1e-9):
        problems.append(f"last epoch output: sums differ by up to {np.max(np.abs(a - b)):g}")
    return problems


# -- report -------------------------------------------------------------------


def _fmt_list(values: list[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values) or "-"


def _secs(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}s"  # NaN: too few epochs completed


def describe_engine(keys: int, r: dict[str, Any]) -> str:
    m = r["memory"]
    return (
        f"bigstate {keys:,} keys barrierflow ({r['master']}, driver memory {DRIVER_MEMORY}): {r['epochs']} epochs, "
        f"bulk epoch {r['bulk_epoch_s']:.1f}s, steady epoch {_secs(r['steady_epoch_s'])} (completion to completion; "
        f"periods {_fmt_list(r['period_s'])}s), steady latency {_secs(r['steady_latency_s'])} "
        f"(durations {_fmt_list(r['duration_s'])}s); process wall {r['wall_s']:.1f}s; "
        f"state bytes/epoch {'/'.join(f'{b / 1e6:.1f}' for b in r['state_bytes_written'])} MB; "
        f"driver peak RSS {m['driver_peak_mb']:,.0f} MiB (python {m['python_peak_mb']:,.0f}, JVM {m['jvm_peak_mb']:,.0f}; "
        f"sum of VmHWM {m['driver_hwm_sum_mb']:,.0f}); executor JVMs {m['executors_peak_mb']:,.0f} MiB; "
        f"whole tree with Python workers {m['tree_peak_mb']:,.0f} MiB; {m['samples']} samples"
        + (f" [{'; '.join(r['problems'])}]" if r["problems"] else " [OK]")
    )


def describe_sss(keys: int, r: dict[str, Any]) -> str:
    m = r["memory"]
    return (
        f"bigstate {keys:,} keys SSS ({r['master']}, RocksDB + changelog, shuffle.partitions={r['shuffle_partitions']}, driver memory "
        f"{r['driver_memory']}): {r['batches']} batches, bulk batch {r['bulk_batch_s']:.1f}s, steady batch "
        f"{r['steady_batch_s']:.2f}s (batches {_fmt_list(r['batch_s'])}s); query wall {r['wall_s']:.1f}s, "
        f"process wall {r['process_wall_s']:.1f}s; process peak RSS {m['driver_peak_mb']:,.0f} MiB "
        f"(JVM {m['jvm_peak_mb']:,.0f}); executor JVMs {m['executors_peak_mb']:,.0f} MiB; whole tree {m['tree_peak_mb']:,.0f} MiB"
        + (f" [{'; '.join(r['problems'])}]" if r["problems"] else " [OK]")
    )


def run_bigstate(
    work_dir: Path,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    steady_epochs: int = STEADY_EPOCHS,
    seed: int = 42,
    keep: bool = False,
    timeout_s: float = RUN_TIMEOUT_S,
    sss_largest_only: bool = False,
    master: str = MASTER,
) -> dict[str, Any]:
    """Run every size on both engines, printing a line per run; return the figures.

    The dict holds ``bigstate_epoch_ratio`` (at the largest size),
    ``bigstate_driver_peak_mb`` (largest over the sizes), ``sizes`` (per size:
    ``engine``, ``sss``, ``ratio``, ``driver_peak_mb``, ``cross_check`` and the
    seconds each part took) and ``problems`` (verification failures, all sizes).
    A failed barrierflow or SSS run is recorded (``engine_error`` /
    ``sss_error``) and the other sizes still run; each engine process is
    killed after ``timeout_s`` (barrierflow then reports the epochs it
    completed, see :func:`run_barrierflow`). ``sss_largest_only`` runs
    Structured Streaming at the largest size only (the ratio needs no other;
    saves a few minutes). Both engines run on ``master``. Unless ``keep``, each size's
    warehouse, checkpoint and output are deleted after it (inputs are kept
    for reuse).
    """
    root = Path(work_dir).resolve() / "bigstate"
    results: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    for keys in sizes:
        entry: dict[str, Any] = {}
        started = time.perf_counter()
        input_dir = root / f"input-{keys}"
        manifest = generate_bigstate(input_dir, keys, steady_epochs, seed)
        entry["generate_s"] = time.perf_counter() - started
        print(
            f"bigstate {keys:,} keys: input {manifest['rows']:,} events in {len(manifest['files'])} files "
            f"(bulk {keys:,}, then {steady_epochs} x {manifest['files'][1]['changed_keys']:,} changed keys "
            f"+ {manifest['files'][1]['rows'] - manifest['files'][1]['fresh']:,} redelivered) ready in {entry['generate_s']:.1f}s",
            flush=True,
        )
        run_dir = root / f"run-{keys}"
        started = time.perf_counter()
        try:
            entry["engine"] = run_barrierflow(input_dir, run_dir / "engine", manifest, timeout_s, master)
            print(describe_engine(keys, entry["engine"]), flush=True)
            problems += [f"{keys:,} keys barrierflow: {p}" for p in entry["engine"]["problems"]]
        except BigstateRunError as error:
            entry["engine_error"] = str(error)
            problems.append(f"{keys:,} keys barrierflow FAILED: {error}")
            print(f"bigstate {keys:,} keys barrierflow FAILED: {error}", flush=True)
        entry["engine_s"] = time.perf_counter() - started
        started = time.perf_counter()
        try:
            if sss_largest_only and keys != max(sizes):
                raise _Skipped
            entry["sss"] = run_sss(input_dir, run_dir / "sss", manifest, timeout_s, master)
            print(describe_sss(keys, entry["sss"]), flush=True)
            problems += [f"{keys:,} keys SSS: {p}" for p in entry["sss"]["problems"]]
        except _Skipped:
            print(f"bigstate {keys:,} keys SSS: skipped (--sss-largest-only)", flush=True)
        except BigstateRunError as error:
            entry["sss_error"] = str(error)
            problems.append(f"{keys:,} keys SSS FAILED: {error}")
            print(f"bigstate {keys:,} keys SSS FAILED: {error}", flush=True)
        entry["sss_s"] = time.perf_counter() - started
        if "engine" in entry and "sss" in entry:
            complete = entry["engine"]["epochs"] == len(manifest["files"])
            entry["cross_check"] = cross_check(entry["engine"], entry["sss"]) if complete else ["barrierflow incomplete"]
            if complete:
                problems += [f"{keys:,} keys: {p}" for p in entry["cross_check"]]
            entry["ratio"] = entry["engine"]["steady_epoch_s"] / entry["sss"]["steady_batch_s"]
            print(
                f"bigstate {keys:,} keys: steady epoch {entry['engine']['steady_epoch_s']:.2f}s / steady batch "
                f"{entry['sss']['steady_batch_s']:.2f}s = {entry['ratio']:.3f}; last epoch outputs "
                + ("agree" if not entry["cross_check"] else "not compared or DIFFER: " + "; ".join(entry["cross_check"]))
                + f"; took generate {entry['generate_s']:.0f}s, barrierflow {entry['engine_s']:.0f}s, SSS {entry['sss_s']:.0f}s",
                flush=True,
            )
        if "engine" in entry:
            entry["driver_peak_mb"] = entry["engine"]["memory"]["driver_peak_mb"]
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        results[keys] = entry
    for keys, entry in results.items():
        peak = entry.get("driver_peak_mb")
        print(f"bigstate_driver_peak_mb[{keys}]={peak:.0f}" if peak is not None else f"bigstate_driver_peak_mb[{keys}]=FAILED")
    largest = max(sizes)
    ratio = results[largest].get("ratio", float("nan"))
    peaks = [e["driver_peak_mb"] for e in results.values() if "driver_peak_mb" in e]
    peak = max(peaks) if peaks else float("nan")
    if not ratio <= TARGET_RATIO:
        print(f"TARGET MISSED: bigstate_epoch_ratio {ratio:.3f} > {TARGET_RATIO} (at {largest:,} keys)")
    if not peak < TARGET_DRIVER_PEAK_MB or len(peaks) < len(sizes):
        print(f"TARGET MISSED: bigstate_driver_peak_mb {peak:.0f} >= {TARGET_DRIVER_PEAK_MB:.0f} or a run failed")
    for problem in problems:
        print(f"CHECK FAILED: {problem.splitlines()[0]}")
    return {
        "bigstate_epoch_ratio": ratio,
        "bigstate_driver_peak_mb": peak,
        "sizes": results,
        "problems": problems,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="./bench-work", help="scratch root; uses <work-dir>/bigstate (default ./bench-work)")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="comma-separated key counts")
    parser.add_argument("--steady-epochs", type=int, default=STEADY_EPOCHS)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--master", default=MASTER, help=f"Spark master of both engines (default {MASTER})")
    parser.add_argument("--keep", action="store_true", help="keep warehouses, checkpoints and outputs")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds before a run is killed (per process)")
    parser.add_argument("--sss-largest-only", action="store_true", help="run Structured Streaming at the largest size only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    args = _parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    if not sizes or min(sizes) < 100 or args.steady_epochs < 2:
        raise SystemExit("need sizes >= 100 keys and --steady-epochs >= 2")
    started = time.perf_counter()
    result = run_bigstate(
        Path(args.work_dir), sizes, args.steady_epochs, args.seed, args.keep, args.timeout, args.sss_largest_only,
        args.master,
    )
    print(f"bigstate total {time.perf_counter() - started:.0f}s")
    print(
        f"bigstate_epoch_ratio={result['bigstate_epoch_ratio']:.3f} "
        f"bigstate_driver_peak_mb={result['bigstate_driver_peak_mb']:.0f}"
    )


if __name__ == "__main__":
    main()
