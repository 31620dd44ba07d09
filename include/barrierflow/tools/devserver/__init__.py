"""``make run`` (README, "The two commands"): a local Airflow with barrierflow's DAGs and plugin, and live input.

``python -m barrierflow.tools.devserver``:

1. configures Airflow by environment variables: ``AIRFLOW_HOME=<repo>/.airflow``, metadata in an embedded PostgreSQL
   (:mod:`barrierflow.tools.metadata_db`, started first, stopped last; or ``--metadata-db sqlite``), LocalExecutor, ``dags/``,
   ``plugins/``, ``<repo>/warehouse``, ``<repo>/landing``;
2. fixes the login: ``admin``/``admin`` unless ``--password``/``$BARRIERFLOW_DEV_PASSWORD``;
3. starts the warm Spark engine (throwaway epochs while Airflow starts: :mod:`barrierflow.tools.warmup`) and the input generator;
4. runs what ``airflow standalone`` runs as children, but with ``--skip-serve-logs`` (its log servers listen on every interface)
   and the API server on 127.0.0.1, up before the scheduler;
5. starts the DAG processor once the first minute holding generated input has ended (a new DAG's first run is the last interval
   ended before it was parsed: it then commits input), then unpauses ``barrierflow_sensor_stats``;
6. writes a ``sensor_stats`` input file every few seconds, after those already there;
7. prints the URL and login, writes ``.airflow/barrierflow-stack.json`` (for ``barrierflow airflow``), and runs until Ctrl-C or
   SIGTERM; then stops the components (scheduler first, API server last) and what is left of its process tree, which as a Linux
   *child subreaper* keeps task processes that left their process group.

Modules: ``environment`` (steps 1, 2, 7: constants, :class:`DevServerConfig`, files), ``client``
(Airflow's REST API), ``processes`` (steps 4, 7) and ``server`` (:func:`run`, the order of it all; step 6)."""

from barrierflow.tools.devserver.client import ApiClient
from barrierflow.tools.devserver.environment import (
    DEFAULT_PASSWORD,
    DEFAULT_USER,
    STACK_FILE,
    DevServerConfig,
    devserver_environment,
    free_port,
    port_in_use,
    write_password_file,
)
from barrierflow.tools.devserver.processes import AirflowProcesses
from barrierflow.tools.devserver.server import InputGenerator, first_interval_end

# What code outside the package imports from it.
__all__ = [
    "DEFAULT_PASSWORD", "DEFAULT_USER", "STACK_FILE", "AirflowProcesses", "ApiClient", "DevServerConfig",
    "InputGenerator", "devserver_environment", "first_interval_end", "free_port", "port_in_use", "write_password_file",
]  # fmt: skip
