"""The checkpoints page's unit tests need neither Airflow's database nor the Spark engine.

``tests/airflow/conftest.py`` migrates Airflow's metadata database and
starts this process's Spark engine for every test below it (autouse
fixtures: the DAG tests run ``dag.test()``). The page's parts are plain
Python over a warehouse (``ui_warehouse.py``): these overrides, by the same
names, keep them milliseconds each and free of any JVM.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def airflow_db() -> None:
    """No metadata database, no engine."""


@pytest.fixture(autouse=True)
def fresh_assets() -> None:
    """No assets to retire."""
