"""Airflow DAG ``barrierflow_maintenance``: daily checkpoint retention and vacuum of every pipeline."""

from barrierflow.airflow.dags import maintenance_dags

globals().update(maintenance_dags())
