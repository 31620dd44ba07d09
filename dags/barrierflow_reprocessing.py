"""Airflow DAGs ``barrierflow_<pipeline>_reprocess``: restore, then replay every data interval since."""

from barrierflow.airflow.dags import reprocess_dags

globals().update(reprocess_dags())
