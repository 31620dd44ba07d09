"""A landing-directory file source with per-file line positions as offsets.

Files are taken in lexicographic name order; names starting with ``.`` or
``_`` are still being written and are ignored. Offsets are the position after
the last record consumed: ``{"file": name, "line": lines consumed in it or
None when the whole file is consumed}``. A barrier also lists the exact file
ranges of its epoch, so replay never depends on listing the directory again.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import pyarrow as pa

from barrierflow.errors import PipelineDefinitionError, SourceError
from barrierflow.sources.base import SourceBatch
from barrierflow.storage import join_uri, local_path, normalize_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FileSource", "RecordError", "LineParser"]

_CHUNK_BYTES = 16 * 1024 * 1024


class RecordError(ValueError):
    """Raised by a line parser: the message is the dead-letter reason."""


LineParser = Callable[[str], Mapping[str, Any]]


@dataclass(frozen=True)
class FileSource:
    """Replayable source over files landing in a directory.

    Exactly one of ``schema`` (parse JSON natively in Spark against this
    schema) or ``parser`` (a Python function validating one line, run in
    batches with Arrow; ``parser_schema`` is the schema of what it returns)
    is used for JSON Lines. Parquet files are read with their own schema.
    """

    source_id: str
    path: str
    format: str = "jsonl"
    schema: pa.Schema | None = None
    parser: LineParser | None = None
    parser_schema: pa.Schema | None = None
    max_files_per_epoch: int = 10
    max_records_per_epoch: int | None = None
    suffixes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.format not in ("jsonl", "parquet"):
            raise PipelineDefinitionError(f"source {self.source_id}: format must be 'jsonl' or 'parquet'")
        if self.format == "jsonl" and (self.parser is None) == (self.schema is None):
            raise PipelineDefinitionError(
                f"source {self.source_id}: give exactly one of schema= (native JSON parsing) "
                "or parser= with parser_schema= (Python validation)"
            )
        if self.parser is not None and self.parser_schema is None:
            raise PipelineDefinitionError(f"source {self.source_id}: parser= needs parser_schema=")
        if self.max_files_per_epoch < 1:
            raise PipelineDefinitionError(f"source {self.source_id}: max_files_per_epoch must be >= 1")
        if self.max_records_per_epoch is not None and self.max_records_per_epoch < 1:
            raise PipelineDefinitionError(f"source {self.source_id}: max_records_per_epoch must be >= 1")

    # -- planning ---------------------------------------------------------

    @property
    def _suffixes(self) -> tuple[str, ...]:
        return self.suffixes or ((".jsonl", ".json") if self.format == "jsonl" else (".parquet",))

    def _eligible(self, arrival_cutoff_ms: int | None) -> list[str]:
        directory = local_path(self.path)
        if not os.path.isdir(directory):
            raise SourceError(
                f"source {self.source_id}: landing directory {directory} does not exist; "
                "create it or pass --param landing_dir=<existing directory>"
            )
        names = []
        for entry in os.scandir(directory):
            if entry.name.startswith((".", "_")) or not entry.name.endswith(self._suffixes):
                continue
            if not entry.is_file():
                continue
            if arrival_cutoff_ms is not None and entry.stat().st_mtime * 1000 > arrival_cutoff_ms:
                continue
            names.append(entry.name)
        return sorted(names)

    def plan(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> dict[str, Any]:
        pos_file = start["file"] if start else None
        pos_line = start["line"] if start else None
        remaining: list[tuple[str, int]] = []
        for name in self._eligible(arrival_cutoff_ms):
            if pos_file is None or name > pos_file:
                remaining.append((name, 0))
            elif name == pos_file and pos_line is not None:
                remaining.append((name, pos_line))
        ranges: list[list[Any]] = []
        budget = self.max_records_per_epoch
        for name, from_line in remaining[: self.max_files_per_epoch]:
            full = join_uri(normalize_uri(self.path), name)
            if budget is None:
                ranges.append([name, from_line, None, os.path.getsize(local_path(full))])
                continue
            total = self._count_records(full)
            available = total - from_line
            if available <= budget:
                ranges.append([name, from_line, None, os.path.getsize(local_path(full))])
                budget -= available
            else:
                ranges.append([name, from_line, from_line + budget, os.path.getsize(local_path(full))])
                budget = 0
            if budget == 0:
                break
        if not ranges:
            return {"file": pos_file, "line": pos_line, "files": []}
        last_name, _, last_to, _ = ranges[-1]
        return {"file": last_name, "line": last_to, "files": ranges}

    def has_records(self, end: Mapping[str, Any]) -> bool:
        return bool(end.get("files"))

    def _count_records(self, uri: str) -> int:
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(local_path(uri)).metadata.num_rows
        return _count_lines(local_path(uri))

    def describe(self) -> dict[str, Any]:
        return {"type": "file", "id": self.source_id, "format": self.format, "path": self.path}

    # -- reading ----------------------------------------------------------

    def read(self, spark: "SparkSession", end: Mapping[str, Any], parallelism: int) -> SourceBatch:
        ranges = end.get("files") or []
        base = normalize_uri(self.path)
        for name, *_ in ranges:
            if not os.path.exists(local_path(join_uri(base, name))):
                raise SourceError(
                    f"source {self.source_id}: file {name} recorded in the barrier is gone; "
                    "landing files must be kept until their epoch is completed"
                )
        if self.format == "parquet":
            return self._read_parquet(spark, base, ranges)
        return self._read_jsonl(spark, base, ranges, parallelism)

    def _tasks(self, base: str, ranges: list[list[Any]]) -> list[tuple[str, str, int, int, int, int]]:
        # (name, path, from_line, to_line (-1: to the end), byte_start, byte_end)
        tasks = []
        for name, from_line, to_line, size in ranges:
            path = local_path(join_uri(base, name))
            if from_line == 0 and to_line is None and size > _CHUNK_BYTES:
                chunks = math.ceil(size / _CHUNK_BYTES)
                for i in range(chunks):
                    tasks.append((name, path, 0, -1, i * _CHUNK_BYTES, min(size, (i + 1) * _CHUNK_BYTES)))
            else:
                tasks.append((name, path, from_line, -1 if to_line is None else to_line, 0, -1))
        return tasks

    def _read_jsonl(
        self, spark: "SparkSession", base: str, ranges: list[list[Any]], parallelism: int
    ) -> SourceBatch:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        tasks = self._tasks(base, ranges)
        task_schema = "name string, path string, from_line long, to_line long, byte_start long, byte_end long"
        tasks_df = spark.createDataFrame(tasks or [], task_schema).repartition(max(1, len(tasks)))
        source_id = self.source_id
        if self.parser is not None:
            assert self.parser_schema is not None
            out_schema = _parsed_schema(self.parser_schema)
            parser = self.parser
            parser_schema = self.parser_schema

            def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    for task in batch.to_pylist():
                        yield from _parse_task(task, parser, parser_schema, out_schema)

            parsed = tasks_df.mapInArrow(parse_batches, from_arrow_schema(out_schema))
        else:
            assert self.schema is not None
            spark_schema = from_arrow_schema(self.schema)

            def raw_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    for task in batch.to_pylist():
                        yield from _raw_task(task)

            raw = tasks_df.mapInArrow(raw_batches, from_arrow_schema(_RAW_SCHEMA))
            value = F.from_json("_raw", spark_schema, {"mode": "PERMISSIVE"})
            raw = raw.withColumn("_value", value)
            required = [F.col(f"_value.{f.name}").isNull() for f in self.schema if not f.nullable]
            bad = F.col("_value").isNull()
            for cond in required:
                bad = bad | cond
            parsed = raw.select(
                "_file",
                "_line",
                "_raw",
                F.when(F.col("_error").isNotNull(), F.col("_error"))
                .when(bad, F.lit(f"not a JSON object matching the schema {self.schema.to_string(show_schema_metadata=False)!r}".replace("\n", ", ")))
                .alias("_error"),
                "_value.*",
            )
        parsed = parsed.withColumn("_source", F.lit(source_id)).persist()
        records = parsed.where(F.col("_error").isNull()).drop("_error", "_raw")
        fields = [f.name for f in (self.parser_schema if self.parser is not None else self.schema)]  # type: ignore[union-attr]
        records = records.select(*fields, "_source", "_file", "_line")
        dead = parsed.where(F.col("_error").isNotNull()).select(
            F.col("_source").alias("source"),
            F.col("_file").alias("source_file"),
            F.col("_line").alias("line"),
            F.col("_raw").alias("raw"),
            F.col("_error").alias("reason"),
        )
        return SourceBatch(records=records, dead_letters=dead, shared=(parsed,))

    def _read_parquet(self, spark: "SparkSession", base: str, ranges: list[list[Any]]) -> SourceBatch:
        from pyspark.sql import functions as F

        frames = []
        for name, from_line, to_line, _ in ranges:
            df = spark.read.parquet(local_path(join_uri(base, name))).select(
                "*", F.col("_metadata.row_index").alias("_row_index")
            )
            df = df.where(F.col("_row_index") >= from_line)
            if to_line is not None:
                df = df.where(F.col("_row_index") < to_line)
            frames.append(
                df.withColumn("_source", F.lit(self.source_id))
                .withColumn("_file", F.lit(name))
                .withColumn("_line", F.col("_row_index") + 1)
                .drop("_row_index")
            )
        if not frames:
            raise SourceError(f"source {self.source_id}: nothing to read in an empty range")
        records = frames[0]
        for other in frames[1:]:
            records = records.unionByName(other)
        empty = spark.createDataFrame([], "source string, source_file string, line long, raw string, reason string")
        return SourceBatch(records=records, dead_letters=empty)


_RAW_SCHEMA = pa.schema(
    [("_file", pa.string()), ("_line", pa.int64()), ("_raw", pa.string()), ("_error", pa.string())]
)


def _parsed_schema(parser_schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            *parser_schema,
            pa.field("_file", pa.string()),
            pa.field("_line", pa.int64()),
            pa.field("_raw", pa.string()),
            pa.field("_error", pa.string()),
        ]
    )


def _count_lines(path: str) -> int:
    count = 0
    last = b"\n"
    with open(path, "rb") as fh:
        while block := fh.read(8 * 1024 * 1024):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (0 if last == b"\n" else 1)


def _iter_lines(task: Mapping[str, Any]) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) of the lines a read task owns.

    A byte-range task owns the lines that start inside [byte_start, byte_end);
    its first line number is one plus the newlines before byte_start.
    """
    path, start, end = task["path"], task["byte_start"], task["byte_end"]
    from_line, to_line = task["from_line"], task["to_line"]
    with open(path, "rb") as fh:
        if end < 0:
            lines = fh.read().split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()  # a trailing newline ends the last line, it does not start one
            stop = len(lines) if to_line < 0 else min(to_line, len(lines))
            for idx in range(from_line, stop):
                yield idx + 1, lines[idx]
            return
        first = start
        if start > 0:
            fh.seek(start - 1)
            if fh.read(1) != b"\n":
                fh.readline()  # the rest of a line that the previous task owns
                first = fh.tell()
        line_no = 1 + _count_newlines_before(fh, first)
        fh.seek(first)
        pos = first
        while pos < end:
            raw = fh.readline()
            if not raw:
                break
            pos += len(raw)
            yield line_no, raw[:-1] if raw.endswith(b"\n") else raw
            line_no += 1


def _count_newlines_before(fh: Any, offset: int) -> int:
    fh.seek(0)
    count, remaining = 0, offset
    while remaining > 0:
        block = fh.read(min(remaining, 8 * 1024 * 1024))
        if not block:
            break
        count += block.count(b"\n")
        remaining -= len(block)
    return count


def _decode(raw: bytes) -> tuple[str, str | None]:
    text = raw[:-1] if raw.endswith(b"\r") else raw
    try:
        return text.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return text.decode("utf-8", errors="replace"), f"not valid UTF-8: {exc.reason} at byte {exc.start}"


def _raw_task(task: Mapping[str, Any], batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    files, lines, raws, errors = [], [], [], []
    for line_no, raw in _iter_lines(task):
        text, error = _decode(raw)
        if not text.strip():
            continue  # blank lines are skipped, by definition not records
        files.append(task["name"])
        lines.append(line_no)
        raws.append(text)
        errors.append(error)
        if len(files) >= batch_rows:
            yield pa.RecordBatch.from_arrays(
                [pa.array(files), pa.array(lines, pa.int64()), pa.array(raws), pa.array(errors, pa.string())],
                schema=_RAW_SCHEMA,
            )
            files, lines, raws, errors = [], [], [], []
    if files:
        yield pa.RecordBatch.from_arrays(
            [pa.array(files), pa.array(lines, pa.int64()), pa.array(raws), pa.array(errors, pa.string())],
            schema=_RAW_SCHEMA,
        )


def _parse_task(
    task: Mapping[str, Any],
    parser: LineParser,
    parser_schema: pa.Schema,
    out_schema: pa.Schema,
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    rows: list[dict[str, Any]] = []
    null_record = {f.name: None for f in parser_schema}
    for line_no, raw in _iter_lines(task):
        text, error = _decode(raw)
        if not text.strip():
            continue
        record: Mapping[str, Any] = null_record
        if error is None:
            try:
                record = parser(text)
            except RecordError as exc:
                error = str(exc) or "invalid record"
            except Exception as exc:  # a parser bug must not crash the epoch
                error = f"parser failed: {type(exc).__name__}: {exc}"
        rows.append(
            {
                **(null_record if error else record),
                "_file": task["name"],
                "_line": line_no,
                "_raw": text if error else None,
                "_error": error,
            }
        )
        if len(rows) >= batch_rows:
            yield pa.RecordBatch.from_pylist(rows, schema=out_schema)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=out_schema)

