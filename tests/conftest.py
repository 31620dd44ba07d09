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
# Every JVM a test starts (engines, CLI drivers, spark-submit, standalone
# daemons, executors) inherits the suite's options: why each, in jvm_options.
# A bare pytest run without the class archive dumps it in the background, and
# the JVMs started before that ends run without it (xdist workers inherit the options).
if "JAVA_TOOL_OPTIONS" not in os.environ:
    import subprocess

    from barrierflow.execution import jvm_archive

    if not jvm_archive.archive_path().exists():
        subprocess.Popen(
            [sys.executable, "-m", "barrierflow.execution.jvm_archive"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    from jvm_options import suite_java_options

    os.environ["JAVA_TOOL_OPTIONS"] = suite_java_options(jvm_archive.java_options(even_if_missing=True))


# "<pid>:<port>": an xdist worker inherits the environment of the process that started it.
_ENGINE_ENV = "BARRIERFLOW_TEST_ENGINE_PORT"
if os.environ.get(_ENGINE_ENV, "").partition(":")[0] != str(os.getpid()):
    from barrierflow.tools.devserver import free_port

    os.environ[_ENGINE_ENV] = f"{os.getpid()}:{free_port()}"
ENGINE_PORT = int(os.environ[_ENGINE_ENV].partition(":")[2])
ENGINE_ADDRESS = f"sc://127.0.0.1:{ENGINE_PORT}"


@pytest.fixture(scope="session")
def spark_engine(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[object]:
    """This process's Spark engine; in-process epochs find it through ``$BARRIERFLOW_SPARK_REMOTE``.

    Its executors reach this process's S3 endpoint through the standard AWS
    environment, as a deployment's executors reach its object store.
    """
    from barrierflow.execution.engine import EngineConfig, LocalEngine
    from barrierflow.execution.spark import REMOTE_ENV
    from s3_server import aws_env

    log = (tmp_path_factory.mktemp("engine") / "engine.log").open("wb")
    config = EngineConfig(port=ENGINE_PORT, master="local[2]", driver_memory="2g")
    engine = LocalEngine(config, log=log, env={**os.environ, **aws_env(s3_server.endpoint)})
    engine.start(wait_s=300)
    os.environ[REMOTE_ENV] = engine.address
    yield engine
    from barrierflow.execution.spark import get_spark

    get_spark(remote=ENGINE_ADDRESS).stop()  # released while the engine answers: at exit PySpark would retry for ~20 s
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
def parallel_epochs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every epoch runs in parallel tasks: a task per input split, then a task per key-group range.

    A small epoch otherwise runs its whole pipeline in one task, which most
    tests cover; the window, join and timer tests use this to check that a
    task holding some key groups (reading only their state) gives the same
    results.
    """
    from barrierflow.core import settings

    monkeypatch.setenv(settings.SINGLE_TASK_INPUT_BYTES.env, "0")


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[Any]:
    """A standalone Spark cluster (``tests/spark_cluster.py``) for this process, started the first time a test needs it.

    Its workers reach this process's S3 endpoint, and their executors run
    Spark SQL's generated code, as production does.
    """
    from jvm_options import with_generated_code
    from s3_server import aws_env
    from spark_cluster import standalone_cluster

    env = {**os.environ, **aws_env(s3_server.endpoint)}
    env["JAVA_TOOL_OPTIONS"] = with_generated_code(env.get("JAVA_TOOL_OPTIONS", ""))
    with standalone_cluster(tmp_path_factory.mktemp("standalone"), env) as cluster:
        yield cluster


@pytest.fixture
def s3_bucket(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the test S3 endpoint, the AWS environment pointing at it; returns ``s3://<bucket>``."""
    from s3_server import aws_env

    for name, value in aws_env(s3_server.endpoint).items():
        monkeypatch.setenv(name, value)
    return f"s3://{_new_bucket(s3_server.endpoint, 'test')}"


def _new_bucket(endpoint: str, prefix: str) -> str:
    """A new bucket on the test endpoint (the AWS environment already points at it)."""
    import uuid

    import boto3

    bucket = f"{prefix}-{uuid.uuid4().hex[:16]}"
    boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return bucket


# The storage schemes a test of a warehouse may run on.
STORES = ("local", "s3")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that uses a store (``store_root``, ``warehouse``, ``stack_warehouse``) on a local directory and on ``s3://``.

    A user's pipeline must behave the same on either, so every test of a
    warehouse runs on both. Tests whose subject is S3 itself (faults on the
    wire, the Airflow AWS connection, the compose topology) ask for
    ``s3_bucket``; the fast tier's store primitives run on both too.

    A whole Airflow stack (``stack_store``, per module) runs on the stores
    its module names with ``pytest.mark.stack_store``: these tests wait for
    the scheduler's one-minute intervals (2-4 minutes each). The backfill
    race runs on both; the browser test, whose subject is the UI, on a local
    warehouse, and the compose topology (which also reads the checkpoints
    page's data from its API server) on S3. The browser test pointed at a
    running server (``$BARRIERFLOW_UI_TEST_URL``) runs on that server's
    warehouse, whichever it is.
    """
    if "store_root" in metafunc.fixturenames:
        metafunc.parametrize("store_root", STORES, indirect=True)
    if "stack_store" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("stack_store")
        if marker is None or not marker.args or not set(marker.args) <= set(STORES):
            raise pytest.UsageError(
                f"{metafunc.definition.nodeid}: a stack test names its stores, of {STORES}: pytest.mark.stack_store(...)"
            )
        external = os.environ.get("BARRIERFLOW_UI_TEST_URL") and "devserver" in metafunc.fixturenames
        metafunc.parametrize("stack_store", ("external",) if external else marker.args, indirect=True, scope="module")


@pytest.fixture
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A root URI on the test's storage scheme: a local directory, or a bucket on the test S3 endpoint."""
    if request.param == "local":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("s3_bucket"))


@pytest.fixture(scope="module")
def stack_store(request: pytest.FixtureRequest) -> str:
    """The storage scheme of a module's Airflow stack: ``local``, ``s3`` (or ``external``: a running server's)."""
    return str(request.param)


@pytest.fixture(scope="module")
def stack_warehouse(request: pytest.FixtureRequest, stack_store: str) -> Iterator[str | None]:
    """The warehouse of a whole Airflow stack (``tests/stack.py``), on the module's ``stack_store``.

    None for a local one (the stack's own temporary directory), else
    ``s3://<new bucket>/warehouse`` with the AWS environment pointing at the
    test endpoint for the module, so the stack it starts and the test's own
    reads reach it. Module scope: a stack serves a whole module.
    """
    if stack_store != "s3":
        yield None
        return
    from s3_server import aws_env

    s3_server = request.getfixturevalue("s3_server")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in aws_env(s3_server.endpoint).items():
            patch.setenv(name, value)
        yield f"s3://{_new_bucket(s3_server.endpoint, 'stack')}/warehouse"


@pytest.fixture
def warehouse(store_root: str) -> str:
    """A warehouse on the test's storage scheme (``<store_root>/warehouse``)."""
    return f"{store_root}/warehouse"


# The scheduling unit of the tests that start a whole Airflow stack.
AIRFLOW_STACK_GROUP = "airflow-stack"


@pytest.fixture(scope="session")
def spark(spark_engine: object) -> object:
    from barrierflow.execution.spark import get_spark

    return get_spark(remote=ENGINE_ADDRESS)


def _starts_a_stack(nodeid: str) -> bool:
    """Whether a test starts a whole Airflow stack (the browser test and ``tests/stack/``)."""
    return nodeid.startswith(("tests/stack/", "tests/ui/test_checkpoints_ui.py::"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: the stack tests, the other slow tests, the cluster tests, then the rest.

    With the scheduler below, one worker runs the stacks one after another
    while the other takes the slow tests; the short ones fill the end
    instead of a long test running alone.
    """

    def rank(item: pytest.Item) -> int:
        if _starts_a_stack(item.nodeid):
            return 0
        if not item.get_closest_marker("slow"):
            return 3
        return 2 if str(item.path).endswith("test_clusters.py") else 1

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)  # a hook of xdist, which ``-p no:xdist`` leaves out
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (``make test``): every test its own unit, except the stack tests, one unit.

    So one worker runs the Airflow stacks one after another: two side by
    side on two cores each took twice as long as alone. (xdist's own
    ``xdist_group`` marker does not group under pytest 9, which ignores the
    node id it rewrites; this scheduler groups by node id instead.)
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class StacksInSeries(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return AIRFLOW_STACK_GROUP if _starts_a_stack(nodeid) else nodeid

    return StacksInSeries(config, log)
