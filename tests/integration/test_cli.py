"""The ``barrierflow`` command line, end to end in subprocesses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from cli_runner import barrierflow_cmd, cli_env

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(barrierflow_cmd(*args), env=env or cli_env(), capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("command", ["run", "status", "checkpoints", "query", "generate", "savepoint", "maintenance"])
def test_help_documents_every_command(command: str) -> None:
    result = _cli(command, "--help")
    assert result.returncode == 0
    assert "usage: barrierflow " + command in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "nope", "--epochs", "1"], "unknown pipeline 'nope'"),
        (["run", "sensor_stats", "--epochs", "1"], "missing required parameter 'landing_dir'"),
        (["run", "sensor_stats", "--epochs", "1", "--param", "landing_dir=/no/such/dir"], "does not exist"),
        (["run", "sensor_stats", "--epochs", "1", "--param", "landing_dir=.", "--param", "parallelism=two"], "expects integer"),
        (["run", "sensor_stats", "--epochs", "1", "--param", "colour=red"], "unknown parameter(s) colour"),
        (["run", "sensor_stats", "--epochs", "0", "--param", "landing_dir=."], "--epochs must be >= 1"),
        (["status", "sensor_stats"], "has never run"),
        (["query", "sensor_stats", "select 1"], "has no data"),
        (["savepoint", "restore", "sensor_stats", "--savepoint", "nope"], "no savepoint 'nope'"),
        (["savepoint", "create", "sensor_stats", "--name", "a b"], "savepoint name 'a b' is invalid"),
        (["savepoint", "restore", "sensor_stats"], "one of the arguments --savepoint --epoch is required"),
        (["generate", "gs://bucket/landing"], "unsupported URI 'gs://bucket/landing'"),
    ],
)
def test_bad_input_exits_non_zero_with_a_clear_message(args: list[str], message: str, tmp_path: Path) -> None:
    env = cli_env()
    env["BARRIERFLOW_WAREHOUSE"] = str(tmp_path / "wh")
    result = _cli(*args, cwd=tmp_path, env=env)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_run_status_checkpoints_query(store_root: str, warehouse: str, spark_engine: Any) -> None:
    from barrierflow.storage import objects

    env = cli_env()
    env["BARRIERFLOW_WAREHOUSE"] = warehouse  # the env var sets the warehouse too
    landing = f"{store_root}/landing"  # on the warehouse's store: `generate` lands files on either
    generated = _cli("generate", landing, "--files", "3", "--records-per-file", "50", env=env)
    assert generated.returncode == 0, generated.stderr
    assert [f.path for f in objects.list_files(landing)] == [f"readings-00000{i}.jsonl" for i in range(3)]
    again = _cli("generate", landing, "--files", "1", "--start-index", "2", env=env)  # never changes a landed file
    assert again.returncode == 1 and "readings-000002.jsonl already exists" in again.stderr, again.stderr
    # On a warm engine (--remote): a Spark of the CLI's own is what the crash tests run.
    run = _cli(
        "run", "sensor_stats", "--param", f"landing_dir={landing}", "--param", "max_files_per_epoch=2", "--until-caught-up",
        "--remote", spark_engine.address, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "epoch 1 COMPLETED" in run.stdout and "epoch 2 COMPLETED" in run.stdout

    status = json.loads(_cli("status", "sensor_stats", "--json", env=env).stdout)
    assert status["last_completed_epoch"] == 2 and status["pending"] == [] and status["key_groups"] == 128
    assert set(status["tables"]) >= {"sensor_totals", "sensor_minute", "alerts", "late_readings", "dead_letter", "dedup__seen"}
    assert status["backlog"]["total"] == {"files": 0, "bytes": 0, "oldest_arrival_ms": None, "lag_ms": 0}  # caught up
    assert status["blocked"] is None

    log = json.loads(_cli("checkpoints", "sensor_stats", "--json", env=env).stdout)
    assert [(c["epoch"], c["status"]) for c in log] == [(1, "COMPLETED"), (2, "COMPLETED")]
    assert all(c["rows_in"] > 0 and c["bytes_written"] > 0 and c["duration_ms"] > 0 for c in log)
    assert [c["backlog_files"] for c in log] == [1, 0]  # the third file waited after epoch 1's barrier
    assert log[0]["backlog_bytes"] == objects.list_files(landing)[2].size

    now = json.loads(
        _cli("query", "sensor_stats", "--format", "json", "select sum(count) as n from sensor_totals", env=env).stdout
    )
    then = json.loads(
        _cli(
            "query",
            "sensor_stats",
            "--as-of-epoch",
            "1",
            "--format",
            "json",
            "select sum(count) as n from sensor_totals",
            env=env,
        ).stdout
    )
    assert now[0]["n"] > then[0]["n"] > 0
    rows = json.loads(
        _cli("query", "sensor_stats", "--format", "json", "select window_start from sensor_minute limit 1", env=env).stdout
    )
    assert rows[0]["window_start"].endswith("Z")
    csv_out = _cli(
        "query", "sensor_stats", "--format", "csv", "select sensor_id from sensor_totals order by sensor_id", env=env
    ).stdout
    assert csv_out.splitlines()[0] == "sensor_id"
    bad_epoch = _cli("query", "sensor_stats", "--as-of-epoch", "9", "select 1", env=env)
    assert bad_epoch.returncode == 1 and "not a completed epoch" in bad_epoch.stderr

    # Stop with savepoint, see runs refused, restore, dispose; maintenance.
    created = _cli("savepoint", "create", "sensor_stats", "--name", "sp1", "--description", "by the CLI", "--stop", env=env)
    assert created.returncode == 0 and "at epoch 2" in created.stdout and "stopped" in created.stdout, created.stderr
    listed = json.loads(_cli("savepoint", "list", "sensor_stats", "--json", env=env).stdout)
    assert [(m["name"], m["epoch"], m["description"], m["stopped"]) for m in listed] == [("sp1", 2, "by the CLI", True)]
    refused = _cli("run", "sensor_stats", "--param", f"landing_dir={landing}", "--epochs", "1", env=env)
    assert refused.returncode == 1 and "stopped with savepoint 'sp1'" in refused.stderr
    restored = _cli("savepoint", "restore", "sensor_stats", "--savepoint", "sp1", "--rewind-sinks", env=env)
    assert restored.returncode == 0 and "the next epoch is 3" in restored.stdout, restored.stderr
    assert _cli("savepoint", "dispose", "sensor_stats", "sp1", env=env).returncode == 0
    assert json.loads(_cli("savepoint", "list", "sensor_stats", "--json", env=env).stdout) == []
    report = _cli("maintenance", "sensor_stats", "--retained-checkpoints", "1", env=env)
    assert report.returncode == 0 and json.loads(report.stdout)["retained_epochs"] == [2], report.stderr


def test_process_step_runs_as_a_separate_spark_job(tmp_path: Path, warehouse: str) -> None:
    """Steps in separate processes, as Airflow tasks run them: plan, spark job, commit."""
    from barrierflow.checkpointing.coordinator import CheckpointCoordinator
    from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
    from barrierflow.plan.registry import get_pipeline
    from barrierflow.storage import objects

    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=2, records_per_file=40, seed=51))
    params = {"landing_dir": str(landing), "max_files_per_epoch": 2}
    coordinator = CheckpointCoordinator(get_pipeline("sensor_stats"), params, warehouse)
    barrier = coordinator.trigger_checkpoint(coordinator.recover())
    assert barrier is not None and barrier.epoch == 1
    job = subprocess.run(
        [
            sys.executable,
            str(ROOT / "spark_jobs" / "process_epoch.py"),
            "sensor_stats",
            "--warehouse",
            warehouse,
            "--param",
            f"landing_dir={landing}",
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert job.returncode == 0, job.stderr[-2000:]
    assert "epoch 1 pre-committed" in job.stdout
    assert objects.read_json(coordinator.layout.manifest(barrier.lineage_id, 1)) is not None
    recovery = coordinator.recover()  # rolls the pre-committed epoch forward: the commit step
    assert recovery.rolled_forward == (1,) and recovery.last_completed_epoch == 1


def test_a_run_on_its_own_spark_leaves_no_file_in_the_temporary_directory(tmp_path: Path) -> None:
    """Its JVM and Python workers talk over Unix sockets in $TMPDIR; the CLI leaves with ``os._exit`` and still removes them."""
    landing = tmp_path / "landing"
    scratch = Path(tempfile.mkdtemp(prefix="bf-", dir="/tmp"))  # short: a socket's path has at most 103 bytes
    try:
        env = {**cli_env(master="local[1]"), "TMPDIR": str(scratch)}
        assert _cli("generate", str(landing), "--files", "1", "--records-per-file", "20", env=env).returncode == 0
        run = _cli(
            "run",
            "sensor_stats",
            "--warehouse",
            str(tmp_path / "wh"),
            "--param",
            f"landing_dir={landing}",
            "--epochs",
            "1",
            env=env,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert "epoch 1 COMPLETED" in run.stdout
        assert sorted(p.name for p in scratch.iterdir()) == []
    finally:
        shutil.rmtree(scratch)
