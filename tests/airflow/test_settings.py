"""barrierflow.airflow.dags.settings: deployment settings from the environment."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from barrierflow.airflow.dags.settings import DagSettings, param_env_var
from barrierflow.core.errors import ConfigurationError


def test_defaults_run_out_of_the_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = DagSettings.from_env({})
    assert settings.warehouse == str(tmp_path / "warehouse")  # ./warehouse, made absolute
    assert settings.schedule == "* * * * *" and settings.maintenance_schedule == "@daily"
    assert settings.process_mode == "connect" and settings.conn_id == "spark_connect_default"
    assert settings.retries == 3 and settings.retry_delay == timedelta(seconds=30)
    assert settings.default_args()["retry_exponential_backoff"] == 2.0
    assert Path(settings.process_application).is_file()


def test_environment_overrides() -> None:
    settings = DagSettings.from_env(
        {
            "BARRIERFLOW_WAREHOUSE": "file:///data/wh",
            "BARRIERFLOW_SCHEDULE": "none",
            "BARRIERFLOW_SPARK_CONN_ID": "spark_cluster",
            "BARRIERFLOW_TASK_RETRIES": "5",
            "BARRIERFLOW_RETRY_DELAY_SECONDS": "2.5",
            "BARRIERFLOW_LEASE_WAIT_SECONDS": "30",
        }
    )
    assert settings.warehouse == "/data/wh" and settings.schedule is None
    assert settings.spark_conn_id == "spark_cluster" and settings.retries == 5
    assert settings.retry_delay == timedelta(seconds=2.5) and settings.lease_wait_s == 30


@pytest.mark.parametrize("env", [{"BARRIERFLOW_TASK_RETRIES": "many"}, {"BARRIERFLOW_TASK_RETRIES": "-1"}])
def test_bad_values_are_configuration_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError, match="BARRIERFLOW_TASK_RETRIES"):
        DagSettings.from_env(env)


def test_relative_warehouse_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="absolute"):
        DagSettings(warehouse="warehouse")


def test_param_env_var() -> None:
    assert param_env_var("sensor_stats", "landing_dir") == "BARRIERFLOW_SENSOR_STATS__LANDING_DIR"
