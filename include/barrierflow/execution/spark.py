"""The Spark session barrierflow runs epochs in: a warm Spark Connect engine or an embedded one.

- **remote** (``sc://host:port``, Spark Connect): the epoch's jobs go to a long-lived Spark application (``barrierflow engine``,
  or a cluster's Connect endpoint). Chosen by ``remote=``, ``$BARRIERFLOW_SPARK_REMOTE`` or ``$SPARK_REMOTE``.
- **classic**: this process starts the Spark driver (a JVM), or is the driver ``spark-submit`` started. Chosen by ``master=`` or
  ``$BARRIERFLOW_SPARK_MASTER`` (default ``local[*]``).

PySpark's Connect mode is process-wide, so one process uses one kind only.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from barrierflow.core.errors import ConfigurationError, EngineUnavailableError
from barrierflow.execution import jvm_archive
from barrierflow.execution.shipping import package_archive, ships_package

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "get_spark", "describe_jobs", "engine_address", "engine_lost", "launched_by_spark_submit", "MASTER_ENV", "REMOTE_ENV",
    "DRIVER_JAVA_OPTIONS", "driver_java_options", "session_conf", "worker_conf", "remove_socket_file",
]  # fmt: skip

MASTER_ENV = "BARRIERFLOW_SPARK_MASTER"
REMOTE_ENV = "BARRIERFLOW_SPARK_REMOTE"
_SOCKET_PATH_BYTES = 104  # a Unix socket's path, its final NUL included: 108 on Linux, 104 on macOS
# The driver JVM's options when started here ($BARRIERFLOW_DRIVER_JAVA_OPTIONS replaces them). Throughput collector: G1's
# concurrent threads took CPU from the tasks. C1 only: C2 kept compiling the driver's planning code all run long (executors' own
# JVMs keep both); C1 only shrinks the code cache to 48 MiB, which Spark fills. Figures: bench/README.md, "The driver's compiler".
DRIVER_JAVA_OPTIONS = "-XX:+UseParallelGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def session_conf() -> dict[str, str]:
    """SQL settings, set per session: a shared Connect engine gets them from each client. Spark runs only jobs of Python tasks
    (an RDD's partitions, or ``mapInArrow`` over a range or a few strings): no Spark file I/O, cache or default shuffle."""
    return {"spark.sql.adaptive.enabled": os.environ.get("BARRIERFLOW_SPARK_AQE", "false")}


def driver_java_options(base: str | None = None) -> str:
    """A driver JVM's options: ``base`` (default: :data:`DRIVER_JAVA_OPTIONS`, or its environment variable) and the archive's."""
    if base is None:
        base = os.environ.get("BARRIERFLOW_DRIVER_JAVA_OPTIONS", DRIVER_JAVA_OPTIONS)
    return " ".join(filter(None, [base, jvm_archive.java_options()]))


def application_conf() -> dict[str, str]:
    """Settings read once, when a driver JVM starts: every way barrierflow starts one passes them. Its Python workers talk over
    Unix sockets in ``$TMPDIR`` where their paths fit (a one-row Python job: 52 ms, 94 over TCP and its delayed ACK; median)."""
    conf = {"spark.driver.extraJavaOptions": driver_java_options()}
    sockets = tempfile.gettempdir()
    if len(os.path.join(sockets, f".{uuid.uuid4()}.sock").encode()) < _SOCKET_PATH_BYTES:
        conf |= {"spark.python.unix.domain.socket.enabled": "true", "spark.python.unix.domain.socket.dir": sockets}
    archive = jvm_archive.java_options()  # executors in JVMs of their own map the same archive (where its path exists)
    if archive:
        conf["spark.executor.extraJavaOptions"] = archive
    return conf


def worker_conf(master: str | None) -> dict[str, str]:
    """Settings for the Python workers of ``master``: forked from :mod:`.worker_daemon` where they run here (``local[...]``), not
    elsewhere: those workers may not have barrierflow installed (they import the package shipped with the task)."""
    if master is None or ships_package(master):
        return {}
    return {"spark.python.daemon.module": "barrierflow.execution.worker_daemon"}


_sessions: dict[str, "SparkSession"] = {}
_addresses: dict[int, str] = {}  # id(remote session) -> the engine's address, for error messages
_SESSION_NAMESPACE = uuid.UUID("0f6d1c2e-5b8a-4c1e-9a57-3d2b6f0e8c41")
_SESSION_GENERATIONS = 8


def engine_address(remote: str | None = None) -> str | None:
    """The Spark Connect address to use (``sc://...``), or None for a classic session."""
    return remote or os.environ.get(REMOTE_ENV) or os.environ.get("SPARK_REMOTE") or None


def spark_context(spark: Any) -> Any:
    """A classic session's SparkContext; None for a Spark Connect session (it has none)."""
    return getattr(spark, "sparkContext", None) if not type(spark).__module__.startswith("pyspark.sql.connect") else None


def describe_jobs(spark: Any, text: str) -> None:
    """Name the Spark jobs the calling thread starts from now on in Spark's UI and event log (classic sessions only)."""
    sc = spark_context(spark)
    if sc is not None:
        sc.setJobDescription(text)


def engine_lost(spark: Any, exc: BaseException) -> EngineUnavailableError | None:
    """An :class:`EngineUnavailableError` naming the engine if ``exc`` means ``spark``'s engine went away."""
    address = _addresses.get(id(spark))
    if address is None:
        return None
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    text = str(exc)
    lost = ("UNAVAILABLE", "RETRIES_EXCEEDED", "Connection refused", "Socket closed", "failed to connect")
    if isinstance(exc, SparkConnectGrpcException) and any(marker in text for marker in lost):
        return EngineUnavailableError(
            f"the Spark engine at {address} was lost ({_first_line(exc)}); the epoch did not vote, "
            "so the next attempt on a live engine replays its barrier"
        )
    return None


def launched_by_spark_submit() -> bool:
    """Whether this Python process is a driver started by ``spark-submit`` (its JVM is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(master: str | None = None, remote: str | None = None, session_name: str | None = None) -> "SparkSession":
    """One session per process and engine: remote or classic (the module docstring; under ``spark-submit``, its ``--master``).

    ``session_name`` (a pipeline's name) makes every process driving that pipeline join one Connect session, whose Python workers
    stay warm from one Airflow task to the next.
    """
    if master is None and remote is None and launched_by_spark_submit():
        return _classic_session(None)  # spark-submit's --master holds; no environment overrides it
    address = remote or (engine_address() if master is None else None)
    if address is not None:
        return _remote_session(address, session_name)
    return _classic_session(master)


def session_ids(session_name: str) -> list[str]:
    """The Connect session ids a pipeline's processes try, in order: the first the engine has not closed (idle too long) wins."""
    return [str(uuid.uuid5(_SESSION_NAMESPACE, f"barrierflow/{session_name}#{n}")) for n in range(_SESSION_GENERATIONS)]


def with_session_id(address: str, session_id: str) -> str:
    separator = ";" if "/;" in address else ("" if address.endswith("/") else "/") + ";"
    return f"{address}{separator}session_id={session_id}"


def _remote_session(address: str, session_name: str | None) -> "SparkSession":
    if not address.startswith("sc://"):
        raise ConfigurationError(f"Spark Connect address {address!r}: expected sc://host:port")
    key = f"{address}#{session_name}"
    if (session := _sessions.get(key)) is not None:
        return _current(session)
    if "classic" in _sessions:
        raise ConfigurationError(
            f"this process already runs a classic Spark session; it cannot also use the Spark Connect "
            f"engine at {address} (PySpark's Connect mode is process-wide)"
        )
    candidates = [address]  # an id in the address is the user's choice; else one session per pipeline (or a fresh one)
    if session_name is not None and "session_id=" not in address:
        candidates = [with_session_id(address, sid) for sid in session_ids(session_name)]
    for url in candidates:
        session = _connect(url, address)
        if session is not None:
            _sessions[key] = session
            return _current(session)
    raise EngineUnavailableError(
        f"the Spark engine at {address} refused all {len(candidates)} session ids of {session_name!r} as closed"
    )


def _connect(url: str, address: str) -> "SparkSession | None":
    """A session at ``url`` after one round trip; None when the engine closed that session id."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    _check_reachable(address)
    try:
        session = SparkSession.builder.remote(url).create()
    except Exception as exc:  # noqa: BLE001 - e.g. a malformed address
        raise ConfigurationError(f"Spark Connect address {address!r}: {_first_line(exc)}") from exc
    # PySpark waits up to 10 minutes for a lost engine; an epoch fails within about half a minute instead.
    session.client.set_retry_policies(
        [DefaultPolicy(max_retries=8, backoff_multiplier=2.0, initial_backoff=200, max_backoff=5000)]
    )
    try:
        session.version  # noqa: B018 - the first round trip: fail here, naming the address
        for key, value in session_conf().items():
            session.conf.set(key, value)
        _addresses[id(session)] = address
        return session
    except Exception as exc:  # noqa: BLE001 - gRPC errors have no common base worth naming
        _discard(session)
        if "SESSION_CLOSED" in str(exc):
            return None
        raise EngineUnavailableError(
            f"the Spark engine at {address} did not answer ({type(exc).__name__}: {_first_line(exc)}); "
            "start it (barrierflow engine, or make run) or point the Spark Connect connection at a live one"
        ) from exc


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an engine that is down: PySpark's own retries back off for minutes."""
    parsed = urlparse("http://" + address.removeprefix("sc://"))
    host, port = parsed.hostname or "localhost", parsed.port or 15002
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise EngineUnavailableError(
            f"the Spark engine at {address} is not reachable ({exc.strerror or exc}); start it "
            "(barrierflow engine, or make run) or point the Spark Connect connection at a live one"
        ) from exc


def _current(session: "SparkSession") -> "SparkSession":
    """``session`` as PySpark's default and active one (``functions`` query it; else the first opened stays, its engine gone)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    RemoteSession._default_session = RemoteSession._active_session.session = session  # type: ignore[assignment]
    return session


def _discard(session: Any) -> None:
    """Close a session this process could not use, and stop PySpark from handing it out again."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    session.client.close()
    if RemoteSession._default_session is session:
        RemoteSession._default_session = None
    if getattr(RemoteSession._active_session, "session", None) is session:
        RemoteSession._active_session.session = None


def _classic_session(master: str | None) -> "SparkSession":
    if (session := _sessions.get("classic")) is not None:
        return session
    from pyspark.sql import SparkSession

    if _addresses:
        raise ConfigurationError(
            "this process already uses a Spark Connect engine; it cannot also start a classic Spark "
            "session (PySpark's Connect mode is process-wide)"
        )
    # PySpark marks Connect mode in the (inherited) environment: a classic session in a Connect client's child clears it first.
    for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        os.environ.pop(key, None)
    # Python workers must run the interpreter that has barrierflow's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    chosen = None if launched_by_spark_submit() else master or os.environ.get(MASTER_ENV) or "local[*]"
    builder = SparkSession.builder.appName("barrierflow")
    if chosen is not None:
        # Under spark-submit without an explicit choice, --master (the Airflow Spark connection) holds.
        builder = builder.master(chosen)
    builder = (
        # ({**...}: PySpark types map= as a dict of any primitive values, and a dict is invariant.)
        builder.config(map={**session_conf()})
        .config(map={**application_conf(), **worker_conf(chosen)})
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", os.environ.get("BARRIERFLOW_DRIVER_MEMORY", "2g"))
        .config("spark.python.worker.reuse", "true")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if ships_package(session.sparkContext.master):
        # Executors import the shipped package, never the driver's interpreter path.
        session.sparkContext.addPyFile(package_archive())
    _sessions["classic"] = session
    return session


def remove_socket_file() -> None:
    """Delete the classic session's accumulator socket, which only stopping Spark does (the CLI leaves with ``os._exit``)."""
    path = getattr(getattr(getattr(_sessions.get("classic"), "_sc", None), "_accumulatorServer", None), "server_address", None)
    if isinstance(path, str) and os.path.exists(path):
        os.remove(path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""
