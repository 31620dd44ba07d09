"""Airflow plugin: barrierflow's checkpoints page (parts in ``barrierflow.airflow.ui``)."""

from airflow.plugins_manager import AirflowPlugin

from barrierflow.airflow.ui.plugin import PLUGIN_NAME, external_view_spec, fastapi_app_spec, run_view_spec


class BarrierflowPlugin(AirflowPlugin):
    name = PLUGIN_NAME
    fastapi_apps = [fastapi_app_spec()]
    external_views = [external_view_spec(), run_view_spec()]
