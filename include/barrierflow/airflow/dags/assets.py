"""A pipeline's sinks as Airflow assets, so downstream DAGs can schedule on its output.

Asset name ``barrierflow.<pipeline>.<sink>``; URI the sink's Delta table
(``file:///<warehouse>/<pipeline>/sinks/<sink>``). Finding the sinks builds the
pipeline (declaring operators only: no Spark, no data read) with
:func:`~barrierflow.airflow.dags.params.introspection_params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from barrierflow.airflow.dags.params import introspection_params
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import normalize_uri

if TYPE_CHECKING:
    from airflow.sdk import Asset

__all__ = ["SinkInfo", "pipeline_sinks", "sink_assets", "asset_name", "ASSET_GROUP"]

ASSET_GROUP = "barrierflow"


@dataclass(frozen=True)
class SinkInfo:
    """One exactly-once output table of a pipeline."""

    name: str
    mode: str  # append | upsert | side output (late records of a window)
    uri: str
    key: tuple[str, ...] = ()


def asset_name(pipeline: str, sink: str) -> str:
    return f"barrierflow.{pipeline}.{sink}"


def pipeline_sinks(definition: PipelineDefinition, warehouse: str, environ: Mapping[str, str] | None = None) -> list[SinkInfo]:
    """Sinks and side outputs of the pipeline, in declaration order."""
    pipe = definition.build(introspection_params(definition, environ))
    # Names only (at DAG parse time): a warehouse the tasks will refuse still parses.
    layout = PipelineLayout(normalize_uri(warehouse), definition.name)
    sinks = [SinkInfo(n.sink.name, n.sink.mode, _file_uri(layout.sink_table(n.sink.name)), n.sink.key) for n in pipe.sinks]
    sinks += [SinkInfo(name, "side output", _file_uri(layout.sink_table(name))) for name in pipe.side_output_names()]
    return sinks


def sink_assets(sinks: list[SinkInfo], pipeline: str) -> list["Asset"]:
    from airflow.sdk import Asset

    return [
        Asset(
            name=asset_name(pipeline, sink.name),
            uri=sink.uri,
            group=ASSET_GROUP,
            extra={"pipeline": pipeline, "sink": sink.name, "mode": sink.mode, "format": "delta"},
        )
        for sink in sinks
    ]


def _file_uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"
