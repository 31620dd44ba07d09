"""Executors read Parquet data files wherever they are stored: Spark natively on local disk, Python tasks on S3.

Spark here has no S3A jars (Maven is unreachable), so files on an object
store are read by Python tasks through pyarrow's S3 file system, configured
by the standard AWS environment of the executors. Either way the rows stay
on the executors: the driver only passes file names. The counterpart of
:mod:`barrierflow.storage.staging`, where executors write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.core.errors import StorageError
from barrierflow.storage import objects

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["PATH_COLUMN", "ROW_INDEX_COLUMN", "parquet_schema", "read_parquet_files"]

PATH_COLUMN = "_path"  # with ``with_path``: the URI of the file a row came from, as given
ROW_INDEX_COLUMN = "_row_index"  # with ``with_row_index``: the row's position in its file, from 0
_MAX_TASKS = 64


def read_parquet_files(
    spark: "SparkSession",
    uris: Sequence[str],
    schema: pa.Schema,
    *,
    with_path: bool = False,
    with_row_index: bool = False,
    sizes: Mapping[str, int] | None = None,
) -> "DataFrame":
    """The rows of the Parquet files ``uris`` with the columns of ``schema``, read on the executors.

    A column of ``schema`` missing from a file reads as nulls, as Spark's
    reader does. ``with_path`` adds :data:`PATH_COLUMN` holding each row's
    file exactly as it appears in ``uris``; ``with_row_index`` adds
    :data:`ROW_INDEX_COLUMN`, the row's position in its file. ``sizes``
    (URI -> bytes) are sizes recorded when the read was planned: a Python
    task refuses a file whose size differs (it would read other rows).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    uris = list(uris)
    extra = [pa.field(PATH_COLUMN, pa.string())] if with_path else []
    extra += [pa.field(ROW_INDEX_COLUMN, pa.int64())] if with_row_index else []
    out = pa.schema([*schema, *extra])
    if not uris:
        return spark.createDataFrame([], from_arrow_schema(out))
    if all(objects.is_local(uri) for uri in uris):
        by_path = {objects.local_path(uri): uri for uri in uris}
        frame = spark.read.schema(from_arrow_schema(schema)).parquet(*by_path)
        if with_path:
            # Spark names the file as a URI-encoded file: URI ('+' left as is,
            # so escaped before decoding); map it back to the name given.
            local = F.url_decode(F.replace(F.regexp_replace("_metadata.file_path", "^file:(//)?", ""), F.lit("+"), F.lit("%2B")))
            names = F.create_map(*[x for path, uri in by_path.items() for x in (F.lit(path), F.lit(uri))])
            frame = frame.withColumn(PATH_COLUMN, names[local])
        if with_row_index:
            frame = frame.withColumn(ROW_INDEX_COLUMN, F.col("_metadata.row_index"))
        return frame
    tasks = min(len(uris), _MAX_TASKS)
    listing = spark.createDataFrame([(uri,) for uri in uris], "uri string").repartition(tasks)
    read = partial(_read_files, schema, with_path, with_row_index, dict(sizes or {}))
    return listing.mapInArrow(read, from_arrow_schema(out))


def parquet_schema(uri: str) -> pa.Schema:
    """The Arrow schema in the footer of the Parquet file ``uri`` (only the footer is read)."""
    try:
        with objects.open_input(uri) as fh:
            return pq.ParquetFile(fh).schema_arrow
    except (OSError, pa.ArrowInvalid) as exc:
        raise StorageError(f"cannot read the Parquet footer of {uri}: {exc}") from exc


def _read_files(
    schema: pa.Schema, with_path: bool, with_row_index: bool, sizes: Mapping[str, int], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A Python task: every row of each listed file, conformed to ``schema``, one row group at a time."""
    for batch in batches:
        for uri in batch.column(0).to_pylist():
            filesystem, path = objects.arrow_filesystem(uri)
            try:
                source = filesystem.open_input_file(path)
                if uri in sizes and source.size() != sizes[uri]:
                    raise StorageError(
                        f"{uri} has {source.size()} bytes, {sizes[uri]} when its read was planned: "
                        "a file must never change once it is read (land new data as a new file)"
                    )
                parquet = pq.ParquetFile(source)
                first = 0
                for group in range(parquet.num_row_groups):
                    table = _conform(parquet.read_row_group(group), schema, uri)
                    if with_path:
                        table = table.append_column(PATH_COLUMN, pa.array([uri] * table.num_rows, pa.string()))
                    if with_row_index:
                        index = pa.array(range(first, first + table.num_rows), pa.int64())
                        table = table.append_column(ROW_INDEX_COLUMN, index)
                    first += table.num_rows
                    yield from table.to_batches()
            except (OSError, pa.ArrowInvalid) as exc:
                raise StorageError(f"cannot read {uri}: {exc}") from exc


def _conform(table: pa.Table, schema: pa.Schema, uri: str) -> pa.Table:
    columns = []
    for field in schema:
        index = table.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        try:
            columns.append(table.column(index).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise StorageError(
                f"{uri}: column {field.name!r} is {table.schema.field(index).type}, which does not read as {field.type}"
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)
