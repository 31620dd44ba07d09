"""Shared fixtures: one warm Spark engine per test process, as production runs epochs.

Each pytest process (each xdist worker) starts its own Spark Connect engine
(``barrierflow engine``'s command, master ``local[2]``) on a free loopback
port, the first time a test needs Spark; every in-process epoch, the
``spark`` fixture and the DAG tasks run by ``dag.test()`` use it. PySpark's
Connect mode is process-wide, so classic sessions (``local[2]`` in this
process's JVM) are exercised in subprocesses: the CLI crash tests and the
spark-submit DAG mode.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the reference implementation package

os.environ.setdefault("BARRIERFLOW_DRIVER_MEMORY", "2g")
# A run killed by a test leaves its epoch lease behind; the next run waits for
# it to expire (lease.py). Five seconds keeps that short and still leaves a
# heartbeat (every 1.25 s) time to land under a loaded machine.
os.environ.setdefault("BARRIERFLOW_LEASE_TTL_SECONDS", "5")


# "<pid>:<port>": an xdist worker inherits the environment of the process that started it.
_ENGINE_ENV = "BARRIERFLOW_TEST_ENGINE_PORT"
if os.environ.get(_ENGINE_ENV, "").partition(":")[0] != str(os.getpid()):
    from barrierflow.devserver import free_port

    os.environ[_ENGINE_ENV] = f"{os.getpid()}:{free_port()}"
ENGINE_PORT = int(os.environ[_ENGINE_ENV].partition(":")[2])
ENGINE_ADDRESS = f"sc://127.0.0.1:{ENGINE_PORT}"


@pytest.fixture(scope="session")
def spark_engine(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[object]:
    """This process's Spark engine; in-process epochs find it through ``$BARRIERFLOW_SPARK_REMOTE``.

    Its executors reach this process's S3 endpoint through the standard AWS
    environment, as a deployment's executors reach its object store.
    """
    from barrierflow.engine import EngineConfig, LocalEngine
    from barrierflow.spark import REMOTE_ENV
    from s3_server import aws_env

    log = (tmp_path_factory.mktemp("engine") / "engine.log").open("wb")
    config = EngineConfig(port=ENGINE_PORT, master="local[2]", driver_memory="2g")
    engine = LocalEngine(config, log=log, env={**os.environ, **aws_env(s3_server.endpoint)})
    engine.start(wait_s=300)
    os.environ[REMOTE_ENV] = engine.address
    yield engine
    engine.stop()
    log.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """This process's S3 endpoint on loopback (moto's server), started the first time a test needs it."""
    from s3_server import start_s3_server

    server = start_s3_server(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the test S3 endpoint, the AWS environment pointing at it; returns ``s3://<bucket>``."""
    import uuid

    import boto3

    from s3_server import aws_env

    for name, value in aws_env(s3_server.endpoint).items():
        monkeypatch.setenv(name, value)
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    boto3.session.Session().client("s3", endpoint_url=s3_server.endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}"


@pytest.fixture(params=["local", "s3"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A root URI on each storage scheme: a local directory, then a bucket on the test S3 endpoint."""
    if request.param == "local":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("s3_bucket"))


@pytest.fixture
def warehouse(store_root: str) -> str:
    """A warehouse on each storage scheme (``<store_root>/warehouse``: a local directory, then on S3)."""
    return f"{store_root}/warehouse"


# The xdist group of the tests that start a whole Airflow stack.
AIRFLOW_STACK_GROUP = "airflow-stack"


@pytest.fixture(scope="session")
def spark(spark_engine: object) -> object:
    from barrierflow.spark import get_spark

    return get_spark(remote=ENGINE_ADDRESS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first, and never two Airflow stacks at once.
    The stack tests (the browser test and ``tests/stack/``) share one
    ``xdist_group``: ``make test`` runs with ``--dist loadgroup``, so one worker
    runs them one after the other while the other worker takes the remaining
    tests, longest first (slow tests, then the cluster tests, then the rest),
    so the short ones fill the end instead of a long test running alone.
    Two stacks side by side on two cores each took twice as long as alone."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("browser"):
            return 0
        if not item.get_closest_marker("slow"):
            return 4
        path = str(item.path)
        return 1 if "/tests/stack/" in path else 3 if path.endswith("test_clusters.py") else 2

    items.sort(key=rank)
    for item in items:
        if rank(item) <= 1:
            item.add_marker(pytest.mark.xdist_group(AIRFLOW_STACK_GROUP))
