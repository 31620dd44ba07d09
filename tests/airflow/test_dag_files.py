"""The DAG files in ``dags/``: they import cleanly, do no work, and declare what the brief asks.

Parsing happens in the DAG processor every few seconds, so importing a DAG
file must not start Spark, touch the warehouse or scan the landing directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from barrierflow.airflow.dags.environment import repo_root
from barrierflow.airflow.dags.settings import MAINTENANCE_DAG_ID
from barrierflow.plan.registry import get_pipeline, pipeline_names
from readme_example import TARGET as README_TARGET
from readme_example import write_readme_module

DAGS_FOLDER = repo_root() / "dags"


def _dag_ids(names: list[str]) -> list[str]:
    kinds = ("", "_savepoint", "_restore", "_reprocess")
    return sorted([f"barrierflow_{p}{kind}" for p in names for kind in kinds] + [MAINTENANCE_DAG_ID])


EXPECTED_IDS = _dag_ids(pipeline_names())

# Fills a DagBag from dags/ in a fresh interpreter, recording every directory
# listing and every file opened under the warehouse or the landing directory.
_PARSE_SCRIPT = textwrap.dedent(
    """
    import builtins, json, os, sys, time
    watched = [os.environ["BARRIERFLOW_WAREHOUSE"], os.environ["BARRIERFLOW_SENSOR_STATS__LANDING_DIR"]]
    touched = []

    def spy(fn):
        def wrapper(path=".", *args, **kwargs):
            text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
            if text and any(os.path.abspath(text).startswith(w) for w in watched):
                touched.append(f"{fn.__name__} {text}")
            return fn(path, *args, **kwargs)
        return wrapper

    os.scandir, os.listdir, builtins.open = spy(os.scandir), spy(os.listdir), spy(builtins.open)
    from airflow.dag_processing.dagbag import DagBag

    started = time.monotonic()
    bag = DagBag(dag_folder=sys.argv[1])
    elapsed = time.monotonic() - started
    print(json.dumps({
        "dag_ids": sorted(bag.dag_ids),
        "errors": {k: str(v) for k, v in bag.import_errors.items()},
        "seconds": elapsed,
        "files": {os.path.basename(s.file): s.duration.total_seconds() for s in bag.dagbag_stats},
        "touched": touched,
        "spark_imported": "pyspark.sql" in sys.modules,
        "jvm": "pyspark.java_gateway" in sys.modules,
    }))
    sys.stdout.flush()
    os._exit(0)
    """
)


@pytest.fixture(scope="module", params=["local", "s3"])
def parsed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The DagBag's figures with a local warehouse, and with an ``s3://`` one (which tasks refuse, but parsing must not).

    A user's pipeline (the README's example, saved as a module on the path) is
    registered through ``$BARRIERFLOW_PIPELINES``: it gets its DAGs too.
    """
    base = tmp_path_factory.mktemp("parse")
    write_readme_module(base / "user_code")
    env = {
        **os.environ,
        "BARRIERFLOW_WAREHOUSE": str(base / "warehouse") if request.param == "local" else "s3://bucket/warehouse",
        "BARRIERFLOW_SENSOR_STATS__LANDING_DIR": str(base / "landing"),
        "BARRIERFLOW_PIPELINES": README_TARGET,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(base / "user_code"), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _PARSE_SCRIPT, str(DAGS_FOLDER)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["base"] = base
    return result


def test_every_dag_file_imports_without_errors(parsed: dict[str, Any]) -> None:
    assert parsed["errors"] == {}
    assert parsed["dag_ids"] == _dag_ids([*pipeline_names(), "clicks"])


def test_importing_the_dag_files_does_no_work(parsed: dict[str, Any]) -> None:
    assert not parsed["spark_imported"] and not parsed["jvm"], "a DAG file imported Spark"
    assert parsed["touched"] == [], f"a DAG file read the warehouse or the landing directory: {parsed['touched']}"
    assert not (parsed["base"] / "warehouse").exists(), "a DAG file created the warehouse"
    assert not (parsed["base"] / "landing").exists()
    # The DAG processor re-parses these files continuously: each must stay far below
    # its import timeout (30 s by default). Generous bounds: the test machines are shared.
    assert max(parsed["files"].values()) < 15, parsed["files"]
    assert parsed["seconds"] < 30, parsed["seconds"]


def test_dag_files_are_thin() -> None:
    for path in sorted(DAGS_FOLDER.glob("*.py")):
        code = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith(("#", '"""'))]
        assert len(code) <= 4, f"{path.name} should only import a factory and publish its DAGs"


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    return bag


def test_every_task_retries_with_exponential_backoff(dagbag: Any) -> None:
    for dag_id in EXPECTED_IDS:
        for task in dagbag.get_dag(dag_id).tasks:
            assert task.retries >= 1, (dag_id, task.task_id)
            assert task.retry_exponential_backoff > 1, (dag_id, task.task_id)
            assert task.max_retry_delay is not None, (dag_id, task.task_id)


def test_runs_never_overlap(dagbag: Any) -> None:
    for dag_id in EXPECTED_IDS:
        dag = dagbag.get_dag(dag_id)
        assert dag.max_active_runs == 1, dag_id
        assert dag.catchup is False, dag_id


@pytest.mark.parametrize("pipeline", pipeline_names())
def test_pipeline_dag_shape(dagbag: Any, pipeline: str) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    dag = dagbag.get_dag(f"barrierflow_{pipeline}")
    order = ["barrier", "process", "commit", "catch_up"]
    for upstream, downstream in zip(order, order[1:]):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    process = dag.get_task("process")  # the default: a Spark Connect client of the warm engine
    assert not isinstance(process, SparkSubmitOperator) and "warm Spark engine" in process.doc_md
    from barrierflow.airflow.dags import build_pipeline_dag
    from barrierflow.airflow.dags.params import unset_required_params
    from barrierflow.airflow.dags.settings import DagSettings

    submitted = build_pipeline_dag(pipeline, DagSettings(warehouse="/wh", process_mode="spark-submit")).get_task("process")
    assert isinstance(submitted, SparkSubmitOperator)
    assert submitted.application.endswith("spark_jobs/process_epoch.py") and Path(submitted.application).is_file()
    assert submitted._conn_id == "spark_default"

    if unset_required_params(get_pipeline(pipeline)):
        assert dag.schedule is None  # a required parameter has no default: manual runs only
    else:
        assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"  # real data intervals: the barrier's bound
        assert dag.timetable.expression == "* * * * *" and dag.start_date is not None
    for task_id in ("barrier", "commit"):
        assert dag.get_task(task_id).doc_md or dag.get_task(task_id).doc


@pytest.mark.parametrize("pipeline", pipeline_names())
def test_pipeline_params_are_typed(dagbag: Any, pipeline: str) -> None:
    definition = get_pipeline(pipeline)
    params = dagbag.get_dag(f"barrierflow_{pipeline}").params
    for declared in definition.params:
        param = params.get_param(declared.name)
        types = param.schema["type"] if isinstance(param.schema["type"], list) else [param.schema["type"]]
        assert declared.json_type in types
        assert param.description
        if declared.minimum is not None:
            assert param.schema["minimum"] == declared.minimum
        if not declared.required:
            assert param.value == declared.default
    assert params.get_param("catch_up_epochs").schema == {"type": "integer", "minimum": 1, "title": "catch_up_epochs"}


def test_required_param_default_comes_from_the_environment(tmp_path: Path) -> None:
    from barrierflow.airflow.dags import build_pipeline_dag
    from barrierflow.airflow.dags.settings import DagSettings

    settings = DagSettings(warehouse=str(tmp_path / "wh"))
    env = {"BARRIERFLOW_SENSOR_STATS__LANDING_DIR": "/data/landing", "BARRIERFLOW_SENSOR_STATS__PARALLELISM": "4"}
    dag = build_pipeline_dag("sensor_stats", settings, environ=env)
    assert dag.params["landing_dir"] == "/data/landing"
    assert dag.params["parallelism"] == 4
    assert dag.params.get_param("landing_dir").schema["type"] == "string"
    assert dag.timetable.expression == "* * * * *"
    unset = build_pipeline_dag("sensor_stats", settings, environ={})
    assert unset.params["landing_dir"] is None  # nullable: the first task says how to set it
    # Every scheduled run would fail without landing_dir: manual runs only, and the docs say why.
    assert unset.schedule is None
    assert "manual runs only until `BARRIERFLOW_SENSOR_STATS__LANDING_DIR` is set" in unset.doc_md
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("pipeline", pipeline_names())
def test_each_sink_is_an_asset_of_commit(dagbag: Any, pipeline: str) -> None:
    dag = dagbag.get_dag(f"barrierflow_{pipeline}")
    pipe = get_pipeline(pipeline).build({p.name: "/x" for p in get_pipeline(pipeline).params if p.required})
    sinks = [n.sink.name for n in pipe.sinks] + pipe.side_output_names()
    outlets = dag.get_task("commit").outlets
    assert [a.name for a in outlets] == [f"barrierflow.{pipeline}.{s}" for s in sinks]
    warehouse = os.environ["BARRIERFLOW_WAREHOUSE"]
    assert [a.uri for a in outlets] == [f"file://{warehouse}/{pipeline}/sinks/{s}" for s in sinks]
    assert [a.name for a in dag.get_task("catch_up").outlets] == [a.name for a in outlets]
    for task_id in ("barrier", "process"):
        assert not dag.get_task(task_id).outlets


def test_doc_md_explains_pipeline_params_outputs_and_query(dagbag: Any) -> None:
    doc = dagbag.get_dag("barrierflow_sensor_stats").doc_md
    for needle in (
        "Dedup by ``event_id``",  # the pipeline's docstring
        "`landing_dir`",
        "BARRIERFLOW_SENSOR_STATS__LANDING_DIR",
        "`sensor_totals`",
        "barrierflow.sensor_stats.sensor_totals",
        "barrierflow query sensor_stats",
        "barrierflow_sensor_stats_savepoint",
    ):
        assert needle in doc, needle


def test_operations_dags(dagbag: Any) -> None:
    savepoint = dagbag.get_dag("barrierflow_sensor_stats_savepoint")
    assert savepoint.schedule is None
    assert {k: savepoint.params[k] for k in savepoint.params} == {"savepoint_name": "", "description": "", "stop_pipeline": False}
    assert [t.task_id for t in savepoint.tasks] == ["savepoint"]
    restore = dagbag.get_dag("barrierflow_sensor_stats_restore")
    assert restore.schedule is None
    assert set(restore.params) == {"savepoint", "epoch", "allow_non_restored_state", "rewind_sinks", "parallelism"}
    assert restore.params.get_param("epoch").schema["type"] == ["null", "integer"]
    maintenance = dagbag.get_dag(MAINTENANCE_DAG_ID)
    assert maintenance.schedule == "@daily"
    assert maintenance.params["retained_checkpoints"] == 10 and maintenance.params["vacuum_retention_hours"] == 168
    assert sorted(t.task_id for t in maintenance.tasks) == sorted(f"maintain_{p}" for p in pipeline_names())
