"""How barrierflow configures Airflow: one function for ``make run``, the tests and the UI tests.

Call :func:`configure_airflow` **before anything imports airflow**: Airflow reads its configuration (home, metadata
database, DAGs folder) when ``airflow`` is first imported. The configuration is plain environment variables
(``AIRFLOW__SECTION__KEY``), so subprocesses (``airflow`` CLI, api-server, scheduler, spark-submit) inherit it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from barrierflow.core.errors import ConfigurationError
from barrierflow.storage.objects import normalize_uri

__all__ = [
    "LOCAL_SPARK_CONNECTION", "SPARK_CONN_ENV", "engine_connection", "python_env", "airflow_environment", "configure_airflow",
    "migrate_metadata_db", "repo_root",
]  # fmt: skip

# The default Spark connection (``spark_default``): Spark embedded in the worker, local[*].
LOCAL_SPARK_CONNECTION = json.dumps({"conn_type": "spark", "host": "local[*]"})
SPARK_CONN_ENV = "AIRFLOW_CONN_SPARK_DEFAULT"


def engine_connection(address: str) -> str:
    """``spark_connect_default`` (the Spark provider's ``spark_connect`` type) for the engine at ``sc://host:port``."""
    host, _, port = address.removeprefix("sc://").split("/", 1)[0].rpartition(":")
    return json.dumps({"conn_type": "spark_connect", "host": f"sc://{host}", "port": int(port)})


def repo_root() -> Path:
    """The project checkout this library runs from (``include/barrierflow`` lives in it)."""
    return Path(__file__).resolve().parents[4]


def python_env() -> dict[str, str]:
    """The venv's Python for Spark's driver and workers, and its ``bin`` first on ``PATH`` (the project's ``spark-submit``)."""
    bin_dir, path = str(Path(sys.executable).parent), os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        path = f"{bin_dir}{os.pathsep}{path}" if path else bin_dir
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "PATH": path}


def airflow_environment(
    home: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    warehouse: str | os.PathLike[str] | None = None,
    spark_master: str | None = None,
    engine_address: str | None = None,
) -> dict[str, str]:
    """The environment variables that configure Airflow for barrierflow: ``home`` (``AIRFLOW_HOME``) holds the SQLite
    metadata database; the DAGs and plugins folders are ``root``'s (the project's) ``dags/`` and ``plugins/``.
    ``warehouse`` sets ``BARRIERFLOW_WAREHOUSE``; ``spark_master`` the default Spark connection (else ``local[*]``);
    ``engine_address`` (``sc://host:port``) the warm engine's ``spark_connect_default``."""
    home_path = Path(home).resolve()
    base = Path(root).resolve() if root is not None else repo_root()
    env = {
        "AIRFLOW_HOME": str(home_path),
        "AIRFLOW__CORE__DAGS_FOLDER": str(base / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(base / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home_path / 'airflow.db'}",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home_path / "logs"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # A DAG file of this project imports pyarrow and the pipeline registry: allow for it.
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        SPARK_CONN_ENV: json.dumps({"conn_type": "spark", "host": spark_master}) if spark_master else LOCAL_SPARK_CONNECTION,
        **python_env(),
    }
    if warehouse is not None:
        env["BARRIERFLOW_WAREHOUSE"] = normalize_uri(os.fspath(warehouse))
    if engine_address is not None:
        env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = engine_connection(engine_address)
    return env


def configure_airflow(home: str | os.PathLike[str], **options: Any) -> Mapping[str, str]:
    """Apply :func:`airflow_environment` (keywords ``options``) to ``os.environ``; ConfigurationError if Airflow is imported."""
    current = os.environ.get("AIRFLOW_HOME")
    if "airflow.settings" in sys.modules and current != str(Path(home).resolve()):
        raise ConfigurationError(
            "configure_airflow() must run before airflow is imported: this process already "
            f"configured Airflow with AIRFLOW_HOME={current!r}"
        )
    env = airflow_environment(home, **options)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return env


def migrate_metadata_db() -> None:
    """Create or upgrade the metadata database of the configured ``AIRFLOW_HOME`` (idempotent)."""
    from airflow.utils.db import upgradedb

    upgradedb()
