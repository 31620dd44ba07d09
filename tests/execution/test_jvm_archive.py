"""Which JVM options map the class-data-sharing archive (barrierflow.execution.jvm_archive), and where they go."""

from __future__ import annotations

from pathlib import Path

import pytest

from barrierflow.airflow.dags.spark_submit import _python_conf
from barrierflow.execution import jvm_archive
from barrierflow.execution.engine import EngineConfig
from barrierflow.execution.spark import DRIVER_JAVA_OPTIONS, application_conf


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(jvm_archive.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(jvm_archive.SWITCH_ENV, raising=False)
    monkeypatch.delenv("BARRIERFLOW_DRIVER_JAVA_OPTIONS", raising=False)
    return tmp_path


def test_no_archive_no_options(archive_dir: Path) -> None:
    assert jvm_archive.java_options() == ""
    conf = application_conf()
    assert conf["spark.driver.extraJavaOptions"] == DRIVER_JAVA_OPTIONS
    assert "spark.executor.extraJavaOptions" not in conf
    # A JVM that may start after a dump in progress ends is pointed at the file to come.
    assert jvm_archive.java_options(even_if_missing=True).startswith(f"-XX:SharedArchiveFile={archive_dir}/spark-classes-")


def test_every_way_of_starting_a_jvm_maps_the_archive(archive_dir: Path) -> None:
    archive = jvm_archive.archive_path()
    assert archive.parent == archive_dir and archive.name.startswith("spark-classes-") and archive.suffix == ".jsa"
    archive.write_bytes(b"")
    options = jvm_archive.java_options()
    assert options == f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    # A classic session's driver, the warm engine's and spark-submit's (application_conf), and their executors.
    for conf in (application_conf(), EngineConfig(port=15002).conf(), _python_conf()):
        assert conf["spark.driver.extraJavaOptions"] == f"{DRIVER_JAVA_OPTIONS} {options}"
        assert conf["spark.executor.extraJavaOptions"] == options


def test_switched_off_or_replaced_options(archive_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jvm_archive.archive_path().write_bytes(b"")
    monkeypatch.setenv("BARRIERFLOW_DRIVER_JAVA_OPTIONS", "-XX:+UseSerialGC")
    assert application_conf()["spark.driver.extraJavaOptions"] == f"-XX:+UseSerialGC {jvm_archive.java_options()}"
    monkeypatch.setenv(jvm_archive.SWITCH_ENV, "off")
    assert jvm_archive.java_options() == ""
    assert application_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseSerialGC"
    assert "spark.executor.extraJavaOptions" not in application_conf()
