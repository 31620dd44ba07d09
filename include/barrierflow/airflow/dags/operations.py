"""What the savepoint, restore and maintenance DAGs share.

:func:`operation_dag` is their common DAG header (one run at a time, the
settings' start date and retries, no catch-up); :func:`fail_without_retry`
turns an error a retry cannot fix into an immediate failure; :func:`xcom_json`
is the plain-JSON form of a result returned as XCom.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from barrierflow.airflow.dags.settings import DagSettings

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["operation_dag", "fail_without_retry", "xcom_json"]

_log = logging.getLogger("barrierflow.airflow.dags")


def operation_dag(
    *,
    dag_id: str,
    description: str,
    settings: DagSettings,
    params: Mapping[str, Any],
    doc_md: str,
    tag: str,
    schedule: str | None = None,
) -> "DAG":
    """A DAG for one barrierflow operation, tagged ``barrierflow`` and ``tag`` (manual when no schedule)."""
    from airflow.sdk import DAG

    return DAG(
        dag_id=dag_id,
        description=description,
        schedule=schedule,
        start_date=settings.start_date,
        catchup=False,
        max_active_runs=1,
        default_args=settings.default_args(),
        params=dict(params),
        doc_md=doc_md,
        tags=["barrierflow", tag],
    )


@contextmanager
def fail_without_retry(what: str | None, *errors: type[BaseException]) -> Iterator[None]:
    """Fail the task at once on ``errors``: a retry of the same request cannot fix them.

    The message is ``"<what>: <error>"`` (just the error when ``what`` is None),
    followed by the ``dropped`` and ``missing`` lists an error may carry
    (an incompatible restore point).
    """
    from airflow.sdk.exceptions import AirflowFailException

    try:
        yield
    except errors as exc:
        details = ""
        for label in ("dropped", "missing"):
            items = getattr(exc, label, None)
            if items:
                details += f"\n  {label}: {', '.join(items)}"
        message = f"{what}: {exc}{details}" if what else f"{exc}{details}"
        _log.error("%s", message)
        raise AirflowFailException(message) from exc


def xcom_json(doc: Any) -> Any:
    """JSON types only (tuples become lists), as the XCom shown in the UI."""
    return json.loads(json.dumps(doc, default=str))
