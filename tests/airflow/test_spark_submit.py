"""barrierflow.airflow.dags.spark_submit: what the process task hands to spark-submit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from barrierflow.airflow.dags.environment import LOCAL_SPARK_CONNECTION, SPARK_CONN_ENV
from barrierflow.airflow.dags.settings import DagSettings
from barrierflow.airflow.dags.spark_submit import ProcessEpochOperator, ensure_spark_connection, process_job_arguments


def test_job_arguments_carry_the_runs_params() -> None:
    args = process_job_arguments(
        "sensor_stats", "/wh", {"landing_dir": "/in", "parallelism": 4, "verbose": True, "unset": None}, 30.0
    )
    assert args == [
        "sensor_stats",
        "--warehouse",
        "/wh",
        "--lease-wait",
        "30",
        "--param",
        "landing_dir=/in",
        "--param",
        "parallelism=4",
        "--param",
        "verbose=true",
    ]


def test_the_default_connection_means_local_when_nobody_defined_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPARK_CONN_ENV)
    ensure_spark_connection("spark_default")
    assert json.loads(__import__("os").environ[SPARK_CONN_ENV]) == json.loads(LOCAL_SPARK_CONNECTION)


def test_a_defined_connection_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    cluster = json.dumps({"conn_type": "spark", "host": "spark://cluster", "port": 7077})
    monkeypatch.setenv(SPARK_CONN_ENV, cluster)
    ensure_spark_connection("spark_default")
    assert os.environ[SPARK_CONN_ENV] == cluster
    monkeypatch.delenv(SPARK_CONN_ENV)
    ensure_spark_connection("spark_other")  # only spark_default has a built-in meaning
    assert SPARK_CONN_ENV not in os.environ


def test_the_operator_submits_the_venv_python_and_the_job(tmp_path: Path) -> None:
    settings = DagSettings(warehouse=str(tmp_path / "wh"))
    op = ProcessEpochOperator(
        task_id="process",
        pipeline="sensor_stats",
        warehouse=settings.warehouse,
        application=settings.process_application,
        lease_wait_s=10,
        driver_memory="1g",
    )
    assert op.application == settings.process_application and Path(op.application).is_file()
    from barrierflow.airflow.dags.spark_submit import _job_env, _python_conf

    assert _python_conf()["spark.pyspark.python"] == sys.executable
    env = _job_env(settings.warehouse)
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent) or str(Path(sys.executable).parent) in env["PATH"]
    assert (Path(sys.executable).parent / "spark-submit").exists()
    assert env["BARRIERFLOW_WAREHOUSE"] == settings.warehouse
