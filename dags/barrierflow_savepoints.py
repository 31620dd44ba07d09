"""Airflow DAGs ``barrierflow_<pipeline>_savepoint``: savepoint / stop-with-savepoint, manual runs."""

from barrierflow.airflow.dags import savepoint_dags

globals().update(savepoint_dags())
