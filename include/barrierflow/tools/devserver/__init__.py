"""``make run``: a local Airflow with barrierflow's DAGs and plugin, plus a live input stream.

From a fresh clone, ``python -m barrierflow.tools.devserver``:

1. configures Airflow through environment variables
   (:func:`barrierflow.airflow.dags.environment.airflow_environment`): ``AIRFLOW_HOME``
   at ``<repo>/.airflow`` with its metadata database in an embedded
   PostgreSQL (:mod:`barrierflow.tools.metadata_db`: ``initdb`` into
   ``.airflow/postgres`` once, then a server on a free loopback port, started
   first and stopped last; ``--metadata-db sqlite`` for SQLite), LocalExecutor, the
   project's ``dags/`` and ``plugins/``, no examples, DAGs unpaused at
   creation, ``BARRIERFLOW_WAREHOUSE=<repo>/warehouse`` and
   ``BARRIERFLOW_SENSOR_STATS__LANDING_DIR=<repo>/landing``;
2. fixes the login: the simple auth manager with user ``admin`` and a known
   password (``admin`` unless ``--password``/``$BARRIERFLOW_DEV_PASSWORD``),
   written to the auth manager's passwords file;
3. starts the warm Spark engine (:class:`barrierflow.execution.engine.LocalEngine`, a
   Spark Connect server on 127.0.0.1, ``--engine-port``, 15002 by default) as
   the ``spark_connect_default`` connection, so epochs run on a Spark that
   stays up; once it listens it runs a few throwaway epochs
   (:mod:`barrierflow.tools.warmup`) while Airflow starts, so the first scheduled
   epochs do not pay for a cold JVM; the sensor_stats input generator starts
   at the same time;
4. runs what ``airflow standalone`` runs (``db migrate``, API server, DAG
   processor, scheduler, triggerer) as child processes, with the API server
   bound to 127.0.0.1 and up before the scheduler starts. Not ``airflow
   standalone`` itself: in Airflow 3.3 it also starts the scheduler's and
   triggerer's log servers on every network interface (ports 8793/8794, no
   setting changes the address), which a development server must not do;
   here they are skipped (``--skip-serve-logs``) and the API server reads the
   task logs from ``AIRFLOW_HOME/logs`` directly;
5. starts the DAG processor once the first one-minute interval holding
   generated input has ended: with ``catchup=False`` a new DAG's first run is
   the interval that ended last before it was parsed, so that run commits
   input rather than reporting "no new input"; then makes sure
   ``barrierflow_sensor_stats`` is unpaused (a DAG paused by an earlier
   configuration stays paused otherwise);
6. writes a ``sensor_stats`` input file into the landing directory every few
   seconds (:mod:`barrierflow.demo.datagen`: a ``.``-prefixed temporary name, then
   an atomic rename), continuing after the files already there;
7. prints the URL and the login, writes ``.airflow/barrierflow-stack.json``
   (the stack's Airflow settings, read by ``barrierflow airflow ...`` to run
   the Airflow CLI against it), and runs until Ctrl-C (or SIGTERM), then
   stops Airflow and every process it started: SIGTERM to each component
   (scheduler first, API server last), then SIGTERM and finally SIGKILL to
   whatever is left of the process tree, all through one routine
   (:func:`~barrierflow.tools.devserver.processes.stop_process_tree`). This
   process is made a *child subreaper* (Linux) so that task processes that
   moved into their own process groups, and the Spark JVMs they start, stay
   in its tree and are found and stopped too.

The browser tests start exactly this (``python -m barrierflow.tools.devserver
--port N --home ... --warehouse ... --landing ...``).

The package, one idea per module (the names below are re-exported here):

- :mod:`~barrierflow.tools.devserver.environment`: the constants, :class:`DevServerConfig`,
  the Airflow environment and the files the stack writes (steps 1, 2 and 7), loopback ports;
- :mod:`~barrierflow.tools.devserver.client`: :class:`ApiClient`, Airflow's REST API on ``httpx``;
- :mod:`~barrierflow.tools.devserver.processes`: the Airflow components as children and the
  one routine that stops processes (steps 4 and 7);
- :mod:`~barrierflow.tools.devserver.generator`: :class:`InputGenerator`, the input stream (step 6);
- :mod:`~barrierflow.tools.devserver.console`: the launcher's prefixed output;
- :mod:`~barrierflow.tools.devserver.server`: :func:`run` and :func:`main`, the order of it all.
"""

from barrierflow.tools.devserver.client import ApiClient, ApiConnectionError
from barrierflow.tools.devserver.environment import (
    DEFAULT_DAG_ID,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
    HOST,
    LANDING_ENV,
    PASSWORD_ENV,
    PIPELINE,
    STACK_FILE,
    DevServerConfig,
    devserver_environment,
    free_port,
    jwt_secret,
    port_in_use,
    write_password_file,
    write_stack_file,
)
from barrierflow.tools.devserver.generator import InputGenerator
from barrierflow.tools.devserver.processes import AirflowProcesses, become_subreaper, descendant_pids, stop_process_tree
from barrierflow.tools.devserver.server import build_parser, config_from_args, first_interval_end, main, run

__all__ = [
    # environment
    "HOST",
    "DEFAULT_PORT",
    "DEFAULT_USER",
    "DEFAULT_PASSWORD",
    "PASSWORD_ENV",
    "PIPELINE",
    "DEFAULT_DAG_ID",
    "LANDING_ENV",
    "STACK_FILE",
    "DevServerConfig",
    "devserver_environment",
    "write_stack_file",
    "write_password_file",
    "jwt_secret",
    "free_port",
    "port_in_use",
    # client
    "ApiClient",
    "ApiConnectionError",
    # generator
    "InputGenerator",
    # processes
    "AirflowProcesses",
    "stop_process_tree",
    "descendant_pids",
    "become_subreaper",
    # server
    "run",
    "main",
    "build_parser",
    "config_from_args",
    "first_interval_end",
]
