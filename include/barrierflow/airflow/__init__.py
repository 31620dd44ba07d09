"""Airflow: the DAGs of every registered pipeline and the checkpoints page."""
