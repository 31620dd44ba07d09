"""Real Airflow for the DAG tests: configured here, before anything imports airflow.

Each pytest process (each xdist worker) gets its own ``AIRFLOW_HOME`` in a
temporary directory with its own SQLite metadata database, migrated once per
process: workers never share a database file. The configuration is
:func:`barrierflow.airflow.dags.environment.configure_airflow`, the same as ``make run``:
the project's ``dags/`` and ``plugins/``, no examples, ``spark_connect_default``
= this process's warm engine (``tests/conftest.py``), ``spark_default`` = Spark
``local[2]`` for the spark-submit mode (two cores on the test machines).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from barrierflow.airflow.dags.environment import configure_airflow

# "<pid>:<home>": an xdist worker inherits the environment of the process that
# started it (which may have loaded this file too) and must get its own home.
_HOME_ENV = "BARRIERFLOW_TEST_AIRFLOW_HOME"
_configured = os.environ.get(_HOME_ENV, "").partition(":")[0] == str(os.getpid())

if not _configured:
    if "airflow.settings" in sys.modules:
        raise RuntimeError("airflow was imported before tests/airflow/conftest.py could configure it")
    _base = Path(tempfile.mkdtemp(prefix="barrierflow-airflow-"))
    atexit.register(shutil.rmtree, _base, True)
    # This process's engine (tests/conftest.py, loaded first, chose its port).
    _engine = f"sc://127.0.0.1:{os.environ['BARRIERFLOW_TEST_ENGINE_PORT'].partition(':')[2]}"
    configure_airflow(_base / "home", warehouse=_base / "default-warehouse", spark_master="local[2]", engine_address=_engine)
    # dag.test() re-parses dags/ on every call; each test's DAGs differ (warehouse,
    # asset URIs), so never keep a serialized DAG because it is younger than 30 s.
    os.environ["AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL"] = "0"
    os.environ[_HOME_ENV] = f"{os.getpid()}:{_base / 'home'}"

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # sensor_check helpers


@pytest.fixture(scope="session", autouse=True)
def airflow_db(spark_engine: object) -> Iterator[None]:
    """The metadata database of this process, created once (and the engine the DAGs' ``process`` uses)."""
    from barrierflow.airflow.dags.environment import migrate_metadata_db

    migrate_metadata_db()
    yield


@pytest.fixture(autouse=True)
def fresh_assets() -> None:
    """Retire the previous test's assets, so this test's commits emit their asset events.

    A sink's asset is identified by name *and* URI (the sink table), so each
    test's DAG declares assets with new URIs under the same names. Airflow
    activates an asset only if no active asset holds its name; retiring
    unreferenced ones is the scheduler's job (``_update_asset_orphanage``),
    and no scheduler runs here, so it is done by hand.
    """
    from airflow.models.asset import AssetActive
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(AssetActive))


@pytest.fixture
def warehouse(store_root: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's warehouse on its storage scheme, also seen by the DAG files that ``dag.test()`` re-parses.

    A local directory or ``s3://`` on the test endpoint (its ``stores`` marker): the tasks (and a
    spark-submit job) find S3 through the standard AWS environment that
    ``s3_bucket`` sets; the AWS connection is ``test_pipeline_dag``'s own case.
    """
    path = f"{store_root}/warehouse"
    monkeypatch.setenv("BARRIERFLOW_WAREHOUSE", path)
    return path


@pytest.fixture
def local_warehouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local warehouse, for the tests of forms and settings that no store changes."""
    path = str(tmp_path / "wh")
    monkeypatch.setenv("BARRIERFLOW_WAREHOUSE", path)
    return path
