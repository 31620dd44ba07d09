"""S3 credentials of the DAG tasks from an Airflow AWS connection.

barrierflow reaches S3 through the standard AWS environment variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``). In Airflow they
come from a connection of type ``aws`` (``aws_default`` unless
``BARRIERFLOW_AWS_CONN_ID`` names another), laid out as the Amazon provider
lays it out: login = access key id, password = secret access key, extra
``region_name``, ``endpoint_url`` and ``aws_session_token``. Every task of
every barrierflow DAG applies it to its own process just before it runs
(the tasks' ``pre_execute``), so the driver side, the Delta commits and a
spark-submit child all see it. Executors of a long-running engine or
cluster keep the environment their own deployment gives them.

Without the default connection the environment is used as it is; a named
connection that does not exist fails the task, naming it.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import Any, Callable, Mapping

from barrierflow.core.errors import ConfigurationError

__all__ = ["AWS_CONN_ID_ENV", "DEFAULT_AWS_CONN_ID", "aws_environment", "use_aws_connection", "aws_pre_execute"]

AWS_CONN_ID_ENV = "BARRIERFLOW_AWS_CONN_ID"
DEFAULT_AWS_CONN_ID = "aws_default"
_log = logging.getLogger("barrierflow.airflow.dags")


def aws_environment(login: str | None, password: str | None, extra: Mapping[str, Any]) -> dict[str, str]:
    """The AWS variables a connection's fields stand for (only those it sets)."""
    env: dict[str, str] = {}
    if login:
        env["AWS_ACCESS_KEY_ID"] = login
    if password:
        env["AWS_SECRET_ACCESS_KEY"] = password
    if extra.get("aws_session_token"):
        env["AWS_SESSION_TOKEN"] = str(extra["aws_session_token"])
    if extra.get("region_name"):
        env["AWS_REGION"] = str(extra["region_name"])
    endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get("endpoint_url")
    if endpoint:
        endpoint = str(endpoint)
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigurationError(f"endpoint_url {endpoint!r} of the AWS connection must start with http:// or https://")
        env["AWS_ENDPOINT_URL"] = endpoint
        env["AWS_ALLOW_HTTP"] = "true" if endpoint.startswith("http://") else "false"
    return env


def use_aws_connection(conn_id: str, environ: Any = None) -> dict[str, str]:
    """Set the AWS variables of connection ``conn_id`` in this process (``os.environ``); returns them."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    target = os.environ if environ is None else environ
    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        if conn_id != DEFAULT_AWS_CONN_ID:
            raise ConfigurationError(
                f"no Airflow connection {conn_id!r} (named by {AWS_CONN_ID_ENV}): define it with type aws "
                "(login: access key id, password: secret key, extra: region_name, endpoint_url), or unset "
                f"{AWS_CONN_ID_ENV} to use {DEFAULT_AWS_CONN_ID} or the process's AWS environment"
            ) from None
        return {}
    env = aws_environment(conn.login, conn.password, conn.extra_dejson)
    target.update(env)
    _log.info("S3 access from Airflow connection %s: %s", conn_id, ", ".join(sorted(env)) or "no fields set")
    return env


def aws_pre_execute(conn_id: str) -> Callable[[Any], None]:
    """A task's ``pre_execute``: apply connection ``conn_id`` before the task runs."""
    return partial(_pre_execute, conn_id)


def _pre_execute(conn_id: str, context: Any) -> None:
    use_aws_connection(conn_id)
