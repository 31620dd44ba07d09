"""The warm engine's configuration and the Connect session helpers (no JVM)."""

from __future__ import annotations

import json
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from barrierflow.airflow.dags.environment import engine_connection
from barrierflow.airflow.dags.settings import CONNECT_MODE, SPARK_SUBMIT_MODE, DagSettings
from barrierflow.core.errors import ConfigurationError, EngineUnavailableError
from barrierflow.execution.engine import CONNECT_SERVER_CLASS, EngineConfig
from barrierflow.execution.spark import _check_reachable, application_conf, session_ids, with_session_id
from barrierflow.tools.devserver import first_interval_end


def test_the_engine_command_is_pysparks_connect_server_on_loopback() -> None:
    cmd = EngineConfig(port=15123, master="local[2]").command()
    assert cmd[1:3] == ["--class", CONNECT_SERVER_CLASS] and cmd[-1] == "spark-internal"
    conf = {cmd[i + 1].split("=", 1)[0]: cmd[i + 1].split("=", 1)[1] for i, a in enumerate(cmd) if a == "--conf"}
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.connect.grpc.binding.port"] == "15123"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"  # nothing of a loopback engine listens elsewhere
    assert conf["spark.pyspark.python"] == sys.executable
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    env = EngineConfig().environment({"PATH": "/usr/bin", "SPARK_REMOTE": "sc://x:1", "BARRIERFLOW_SPARK_REMOTE": "sc://x:1"})
    assert env["PYSPARK_PYTHON"] == sys.executable and "SPARK_REMOTE" not in env and "BARRIERFLOW_SPARK_REMOTE" not in env


def test_a_pipeline_meets_its_session_on_the_engine_from_every_process() -> None:
    ids = session_ids("sensor_stats")
    assert ids == session_ids("sensor_stats") and len(set(ids)) == len(ids)  # same list everywhere, distinct ids
    assert set(ids).isdisjoint(session_ids("other"))
    assert with_session_id("sc://h:1", ids[0]) == f"sc://h:1/;session_id={ids[0]}"
    assert with_session_id("sc://h:1/", ids[0]) == f"sc://h:1/;session_id={ids[0]}"
    assert with_session_id("sc://h:1/;token=t", ids[0]) == f"sc://h:1/;token=t;session_id={ids[0]}"


def test_an_engine_that_is_down_fails_fast_naming_its_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        with pytest.raises(EngineUnavailableError, match=f"sc://127.0.0.1:{port}/; is not reachable"):
            _check_reachable(f"sc://127.0.0.1:{port}/;")


def test_the_engine_connection_is_the_spark_providers_spark_connect_type() -> None:
    conn = json.loads(engine_connection("sc://127.0.0.1:15002"))
    assert conn == {"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": 15002}


def test_process_mode_and_its_default_connection() -> None:
    assert DagSettings.from_env({}).process_mode == CONNECT_MODE
    assert DagSettings.from_env({}).conn_id == "spark_connect_default"
    submit = DagSettings.from_env({"BARRIERFLOW_PROCESS_MODE": "spark-submit"})
    assert submit.process_mode == SPARK_SUBMIT_MODE and submit.conn_id == "spark_default"
    assert DagSettings.from_env({"BARRIERFLOW_SPARK_CONN_ID": "my_engine"}).conn_id == "my_engine"
    with pytest.raises(ConfigurationError, match="allowed are connect, spark-submit"):
        DagSettings.from_env({"BARRIERFLOW_PROCESS_MODE": "yarn"})


def test_the_dev_server_unpauses_after_the_first_interval_holding_input() -> None:
    assert first_interval_end(120.0) == 180.0  # a file at a boundary belongs to the interval it starts
    assert first_interval_end(125.5) == 180.0
    assert first_interval_end(179.9) == 180.0


def test_a_local_engine_warms_up_by_default_and_a_cluster_engine_does_not() -> None:
    from barrierflow.execution.engine import default_warm_up_epochs
    from barrierflow.tools.warmup import DEFAULT_WARM_UP_EPOCHS

    assert default_warm_up_epochs("local[*]") == DEFAULT_WARM_UP_EPOCHS > 0
    assert default_warm_up_epochs("local-cluster[2,1,1024]") == DEFAULT_WARM_UP_EPOCHS
    assert default_warm_up_epochs("spark://master:7077") == 0  # its executors cannot read this machine's files
    assert EngineConfig().warm_up_epochs == 0  # an engine started from code warms up only when asked
    # The warm-up is a client of the engine: a wildcard bind is reached on loopback.
    cmd = EngineConfig(host="0.0.0.0", port=15123, warm_up_epochs=3, warm_up_session="clicks").warm_up_command()
    assert cmd[1:] == ["-m", "barrierflow.tools.warmup", "sc://127.0.0.1:15123", "--epochs", "3", "--session", "clicks"]


def test_spark_talks_to_its_python_workers_over_unix_sockets_where_tmpdir_is_short_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 80)
    for tmpdir, unix in (("/tmp", True), (str(deep), False)):  # a socket's path has at most 103 bytes
        monkeypatch.setattr(tempfile, "tempdir", tmpdir)
        conf = application_conf()
        assert (conf.get("spark.python.unix.domain.socket.enabled") == "true") is unix, conf
        assert conf.get("spark.python.unix.domain.socket.dir") == (tmpdir if unix else None)
