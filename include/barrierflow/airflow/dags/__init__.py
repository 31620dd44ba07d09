"""barrierflow on Airflow 3: ``<kind>_dag`` modules build the DAGs, ``factory`` gives them by id to the files in
``dags/``. Importing this package does not import Airflow, so ``environment`` can configure Airflow first."""

from __future__ import annotations

import importlib
from typing import Any

_KINDS = ("pipeline", "savepoint", "restore", "reprocess", "maintenance")
_HOMES = {f"build_{kind}_dag": f"{kind}_dag" for kind in _KINDS} | {f"{kind}_dags": "factory" for kind in _KINDS}
_HOMES |= {"DagSettings": "settings", "configure_airflow": "environment", "migrate_metadata_db": "environment"}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    # Lazy: importing barrierflow.airflow.dags must not import Airflow before it is configured.
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
