"""Airflow DAGs ``barrierflow_<pipeline>``: one per registered pipeline, each run one epoch."""

from barrierflow.airflow.dags import pipeline_dags

globals().update(pipeline_dags())
