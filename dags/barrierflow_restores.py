"""Airflow DAGs ``barrierflow_<pipeline>_restore``: restore from a savepoint or a retained epoch."""

from barrierflow.airflow.dags import restore_dags

globals().update(restore_dags())
