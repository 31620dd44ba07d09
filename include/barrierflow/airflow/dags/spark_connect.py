"""Step 3 on the warm engine: the ``process`` task is a Spark Connect client.

The engine's address comes from an Airflow connection of the Apache Spark
provider's ``spark_connect`` type (``spark_connect_default`` unless
``BARRIERFLOW_SPARK_CONN_ID`` names another), so a deployment points the same
DAGs at a cluster's Connect endpoint by editing one connection. When nobody
defined ``spark_connect_default``, it means the engine ``barrierflow engine``
and ``make run`` start on this machine (``sc://127.0.0.1:15002``), as
``spark_default`` means ``local[*]`` for spark-submit.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from barrierflow.core.errors import ConfigurationError
from barrierflow.execution.engine import DEFAULT_ENGINE_PORT
from barrierflow.execution.spark import get_spark

__all__ = ["DEFAULT_ENGINE_CONN_ID", "LOCAL_ENGINE_ADDRESS", "engine_address", "engine_spark_factory"]

DEFAULT_ENGINE_CONN_ID = "spark_connect_default"
LOCAL_ENGINE_ADDRESS = f"sc://127.0.0.1:{DEFAULT_ENGINE_PORT}"
_log = logging.getLogger("barrierflow.airflow.dags")


def engine_address(conn_id: str) -> str:
    """``sc://host:port/...`` of the Spark Connect connection ``conn_id``."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except AirflowNotFoundException:
        if conn_id != DEFAULT_ENGINE_CONN_ID:
            raise ConfigurationError(
                f"no Airflow connection {conn_id!r}: define it with type spark_connect (host sc://HOST, port), "
                "or unset BARRIERFLOW_SPARK_CONN_ID to use the local engine"
            ) from None
        _log.info("no connection %s defined: using the local engine at %s", conn_id, LOCAL_ENGINE_ADDRESS)
        return LOCAL_ENGINE_ADDRESS
    except ValueError as exc:  # the hook's own check of the address
        raise ConfigurationError(f"Airflow connection {conn_id!r}: {exc}") from None


def engine_spark_factory(conn_id: str, pipeline: str) -> Callable[[], Any]:
    """A session factory for the coordinator: the pipeline's session on the connection's engine.

    The connection is looked up when Spark is first needed (in ``process``
    or ``catch_up``), never when the DAG is parsed.
    """

    def factory() -> Any:

        return get_spark(remote=engine_address(conn_id), session_name=pipeline)

    return factory
