"""What every DAG builder shares (one shape, :class:`PipelineDag`; one header, :func:`barrierflow_dag`), and how tasks fail."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from barrierflow.airflow.dags.params import operational_params
from barrierflow.airflow.dags.settings import CONNECT_MODE, DEFAULT_CONN_IDS, DagSettings
from barrierflow.core.errors import ConfigurationError
from barrierflow.execution.engine import DEFAULT_ENGINE_PORT
from barrierflow.execution.spark import get_spark
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.plan.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["PipelineDag", "PipelineRef", "Environ", "barrierflow_dag", "engine_address", "fail_without_retry", "xcom_json"]

_log = logging.getLogger("barrierflow.airflow.dags")
# A DAG builder's arguments: a registered pipeline's name or its definition; the environment its params' defaults come from.
PipelineRef = str | PipelineDefinition
Environ = Mapping[str, str] | None
_LOCAL_ENGINE_ADDRESS = f"sc://127.0.0.1:{DEFAULT_ENGINE_PORT}"


def barrierflow_dag(
    settings: DagSettings, dag_id: str, tag: str, description: str, params: Mapping[str, Any], doc_md: str, schedule: Any = None
) -> "DAG":
    """A DAG tagged ``barrierflow`` and ``tag``: one run at a time, no catch-up, the settings' retries; manual by default."""
    from airflow.sdk import DAG

    return DAG(
        dag_id=dag_id,
        description=description[:200],
        schedule=schedule,
        start_date=settings.start_date,
        catchup=False,
        max_active_runs=1,
        default_args=settings.default_args(),
        params=dict(params),
        doc_md=doc_md,
        tags=["barrierflow", tag],
    )


@dataclass(frozen=True)
class PipelineDag:
    """The pipeline a DAG is built for, the settings, and the environment its parameters' defaults come from."""

    definition: PipelineDefinition
    settings: DagSettings
    environ: Environ = None

    @classmethod
    def of(cls, pipeline: PipelineRef, settings: DagSettings | None, environ: Environ) -> "PipelineDag":
        definition = pipeline if isinstance(pipeline, PipelineDefinition) else get_pipeline(pipeline)
        return cls(definition, settings or DagSettings.from_env(environ), environ)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def warehouse(self) -> str:
        return self.settings.warehouse

    def params(self) -> dict[str, Any]:
        """The pipeline's parameters for an operation, at task run time (:func:`~.params.operational_params`)."""
        return operational_params(self.definition, self.warehouse, self.environ)

    def spark_factory(self) -> Callable[[], Any] | None:
        """The pipeline's session on the warm engine of the settings' connection (None in spark-submit mode). The connection is
        looked up when Spark is first needed, never when the DAG is parsed."""
        if self.settings.process_mode != CONNECT_MODE:
            return None
        return lambda: get_spark(remote=engine_address(self.settings.conn_id), session_name=self.name)

    def call(self, operation: Callable[..., Any], **kwargs: Any) -> Any:
        """``operation(definition, warehouse, **kwargs)`` with :meth:`params` and the settings' lease wait."""
        return operation(self.definition, self.warehouse, params=self.params(), lease_wait_s=self.settings.lease_wait_s, **kwargs)


def engine_address(conn_id: str) -> str:
    """``sc://host:port/...`` of the Spark Connect connection ``conn_id``; an undefined ``spark_connect_default`` means
    the engine that ``barrierflow engine`` and ``make run`` start on this machine (README "Configuration")."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except AirflowNotFoundException:
        if conn_id != DEFAULT_CONN_IDS[CONNECT_MODE]:
            raise ConfigurationError(
                f"no Airflow connection {conn_id!r}: define it with type spark_connect (host sc://HOST, port), "
                "or unset BARRIERFLOW_SPARK_CONN_ID to use the local engine"
            ) from None
        _log.info("no connection %s defined: using the local engine at %s", conn_id, _LOCAL_ENGINE_ADDRESS)
        return _LOCAL_ENGINE_ADDRESS
    except ValueError as exc:  # the hook's own check of the address
        raise ConfigurationError(f"Airflow connection {conn_id!r}: {exc}") from None


@contextmanager
def fail_without_retry(what: str | None, *errors: type[BaseException]) -> Iterator[None]:
    """Fail the task at once on ``errors``, which a retry cannot fix (also a task decorator), with ``"<what>: <error>"``
    and the ``dropped`` and ``missing`` lists an error may carry (an incompatible restore point)."""
    from airflow.sdk.exceptions import AirflowFailException

    try:
        yield
    except errors as exc:
        details = "".join(
            f"\n  {label}: {', '.join(items)}" for label in ("dropped", "missing") if (items := getattr(exc, label, None))
        )
        message = f"{what}: {exc}{details}" if what else f"{exc}{details}"
        _log.error("%s", message)
        raise AirflowFailException(message) from exc


def xcom_json(doc: Any) -> Any:
    """JSON types only (tuples become lists), as the XCom shown in the UI."""
    return json.loads(json.dumps(doc, default=str))
