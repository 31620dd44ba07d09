"""``make run``: a local Airflow with barrierflow's DAGs and plugin, plus a live input stream.

From a fresh clone, ``python -m barrierflow.tools.devserver``:

1. configures Airflow through environment variables
   (:func:`barrierflow.airflow.dags.environment.airflow_environment`): ``AIRFLOW_HOME``
   at ``<repo>/.airflow``, its metadata database in an embedded PostgreSQL
   (:mod:`barrierflow.tools.metadata_db`, in ``.airflow/postgres``, on a free loopback
   port, started first and stopped last; ``--metadata-db sqlite`` for SQLite),
   LocalExecutor, the project's ``dags/`` and ``plugins/``, DAGs unpaused at creation,
   ``BARRIERFLOW_WAREHOUSE=<repo>/warehouse`` and
   ``BARRIERFLOW_SENSOR_STATS__LANDING_DIR=<repo>/landing``;
2. fixes the login: user ``admin`` of the simple auth manager, password ``admin``
   unless ``--password``/``$BARRIERFLOW_DEV_PASSWORD``;
3. starts the warm Spark engine (:class:`barrierflow.execution.engine.LocalEngine`, Spark
   Connect on 127.0.0.1:``--engine-port``) as the ``spark_connect_default`` connection;
   once it listens it runs a few throwaway epochs (:mod:`barrierflow.tools.warmup`)
   while Airflow starts, so that the first scheduled epochs do not pay for a cold JVM;
   the input generator starts at the same time;
4. runs what ``airflow standalone`` runs (``db migrate``, API server, DAG processor,
   scheduler, triggerer) as child processes, the API server on 127.0.0.1 and up before
   the scheduler starts. Not ``airflow standalone`` itself: it also starts log servers
   on every network interface (ports 8793/8794, no setting changes the address); here
   ``--skip-serve-logs``, and the API server reads the task logs from ``AIRFLOW_HOME/logs``;
5. starts the DAG processor once the first one-minute interval holding generated input
   has ended: with ``catchup=False`` a new DAG's first run is the interval that ended
   last before it was parsed, so that run commits input rather than reporting "no new
   input"; then unpauses ``barrierflow_sensor_stats`` (a DAG paused by an earlier
   configuration stays paused otherwise);
6. writes a ``sensor_stats`` input file into the landing directory every few seconds
   (:mod:`barrierflow.demo.datagen`, published atomically), after the files already there;
7. prints the URL and the login, writes ``.airflow/barrierflow-stack.json`` (read by
   ``barrierflow airflow ...``), and runs until Ctrl-C or SIGTERM; then stops every
   process it started through :func:`~barrierflow.tools.devserver.processes.stop_process_tree`:
   SIGTERM to each component (scheduler first, API server last), then SIGTERM and
   SIGKILL to whatever is left of the process tree. As a *child subreaper* (Linux), this
   process keeps task processes that moved into their own process groups, and their
   Spark JVMs, in its tree.

The browser tests start exactly this. Modules: ``environment`` (steps 1, 2 and 7: the
constants, :class:`DevServerConfig`, the files the stack writes), ``client`` (Airflow's
REST API), ``processes`` (steps 4 and 7), ``generator`` (step 6), ``console`` (prefixed
output) and ``server`` (:func:`run`, the order of it all).
"""

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
from barrierflow.tools.devserver.generator import InputGenerator
from barrierflow.tools.devserver.processes import AirflowProcesses
from barrierflow.tools.devserver.server import first_interval_end

# What code outside the package imports from it.
__all__ = [
    "DEFAULT_PASSWORD", "DEFAULT_USER", "STACK_FILE", "AirflowProcesses", "ApiClient", "DevServerConfig",
    "InputGenerator", "devserver_environment", "first_interval_end", "free_port", "port_in_use", "write_password_file",
]  # fmt: skip
