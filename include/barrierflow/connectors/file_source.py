"""A landing-directory file source with per-file line positions as offsets.

Files are taken in lexicographic name order; names starting with ``.`` or
``_`` are still being written and are ignored. Offsets are the position after
the last record consumed: ``{"file": name, "line": lines consumed in it or
None when the whole file is consumed}``. A barrier also lists the exact file
ranges of its epoch, so replay never depends on listing the directory again.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeVar

import pyarrow as pa

from barrierflow.connectors.dead_letters import (
    DeadLetterReason,
    checked_rows,
    first_problem,
    problem,
    reason_and_detail,
    record_checks,
    whole_file_dead_letters,
)
from barrierflow.connectors.schema_check import ColumnMismatch, schema_mismatches
from barrierflow.connectors.source import SEQ, Backlog, RecordCounter, SourceBatch, arrival_seq
from barrierflow.core.errors import BlockedInputError, PipelineDefinitionError, SourceError, StorageError
from barrierflow.execution.spark import session_cached
from barrierflow.execution.table_files import ROW_INDEX_COLUMN, parquet_schema, read_parquet_files
from barrierflow.storage import objects
from barrierflow.storage.objects import join_uri, local_path, normalize_uri

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["FileSource", "LateFiles", "RecordError", "LineParser", "count_records_on_executors"]

_CHUNK_BYTES = 16 * 1024 * 1024
# Smaller ranges than this cost more in task overhead than they gain in parallelism.
_MIN_CHUNK_BYTES = 1024 * 1024
# Files up to this size are read whole by Spark (a JVM string per file).
_WHOLETEXT_MAX_BYTES = 256 * 1024 * 1024
# Files counted per planning job: enough for both cores of a small cluster, few beyond the record budget.
_COUNT_BATCH_FILES = 8


class RecordError(ValueError):
    """Raised by a line parser: the line is a dead letter with this ``reason`` code and the message as its detail."""

    def __init__(self, detail: str, reason: DeadLetterReason = DeadLetterReason.INVALID_RECORD) -> None:
        super().__init__(detail)
        self.reason = reason


LineParser = Callable[[str], Mapping[str, Any]]
_T = TypeVar("_T")


class LateFiles(str, enum.Enum):
    """What a file source does with a file landing with a name at or before its position (already passed).

    Barriers record their epochs' file lists, so taking such a file later is
    as exactly-once as taking it in order; only the arrival order differs.
    """

    NEXT_EPOCH = "next_epoch"  # the default: read it whole in the next epoch, ahead of the files after the position
    DEAD_LETTER = "dead_letter"  # one dead letter for the whole file (reason late_file); it is never read
    REFUSE = "refuse"  # the pipeline is blocked (BlockedInputError) until the file is moved


@dataclass(frozen=True)
class FileSource:
    """Replayable source over files landing in a directory.

    Exactly one of ``schema`` (parse JSON natively in Spark against this
    schema) or ``parser`` (a Python function validating one line, run in
    batches with Arrow; ``parser_schema`` is the schema of what it returns)
    is used for JSON Lines. Parquet files are read as ``schema``: a file
    whose columns do not fit it is a dead letter as a whole (see
    :meth:`_read_parquet`).

    ``max_records_per_epoch`` cuts epochs inside files, as ranges of lines
    (rows). Planning then needs the records of the files it may take: the
    checkpoint coordinator counts them with executor tasks (a small Spark job,
    :func:`count_records_on_executors`), so the planner never reads input.
    In the Airflow DAG's spark-submit mode the barrier task then starts a Spark
    application for that job (``$BARRIERFLOW_SPARK_MASTER``, or ``local[*]``).
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
    # A file landing with a name at or before the stream position: see LateFiles.
    late_files: LateFiles = LateFiles.NEXT_EPOCH
    # How many of the largest names read the offsets keep, to name late files.
    late_file_window: int = 100

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "late_files", LateFiles(self.late_files))
        except ValueError:
            raise PipelineDefinitionError(
                f"source {self.source_id}: late_files must be one of {', '.join(repr(p.value) for p in LateFiles)}, "
                f"got {self.late_files!r}"
            ) from None
        if self.late_file_window < 1:
            raise PipelineDefinitionError(f"source {self.source_id}: late_file_window must be >= 1")
        if self.format not in ("jsonl", "parquet"):
            raise PipelineDefinitionError(f"source {self.source_id}: format must be 'jsonl' or 'parquet'")
        if self.format == "jsonl" and (self.parser is None) == (self.schema is None):
            raise PipelineDefinitionError(
                f"source {self.source_id}: give exactly one of schema= (native JSON parsing) "
                "or parser= with parser_schema= (Python validation)"
            )
        if self.format == "parquet" and (self.schema is None or self.parser is not None):
            # As Spark's streaming file source: files landing later must not change the records' schema.
            raise PipelineDefinitionError(
                f"source {self.source_id}: a Parquet source needs schema= (the columns and types of its records; "
                "a file that does not fit it is dead-lettered whole) and takes no parser="
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

    def _listing(self) -> list[objects.StoredFile]:
        """Every complete input file in the landing directory (see :meth:`_arrivals`)."""
        directory = normalize_uri(self.path)
        if objects.is_local(directory) and not objects.exists(directory):
            raise SourceError(
                f"source {self.source_id}: landing directory {directory} does not exist; "
                "create it or pass --param landing_dir=<existing directory>"
            )
        return [
            found for found in objects.list_files(directory)
            if not found.path.startswith((".", "_")) and found.path.endswith(self._suffixes)
        ]

    def _arrivals(self, arrival_cutoff_ms: int | None) -> dict[str, int]:
        """Name -> arrival (modification time, ns) of every complete file that arrived by the cut-off.

        Names starting with '.' or '_' are files still being written (or
        not data); an object store's PUT is atomic, so there every listed
        object is complete. S3 keeps modification times in whole seconds.
        """
        arrived = {}
        for found in self._listing():
            if arrival_cutoff_ms is not None and found.modified_ns > arrival_cutoff_ms * 1_000_000:
                continue
            arrived[found.path] = found.modified_ns
        return arrived

    def _late_files(self, start: Mapping[str, Any] | None, arrivals: Mapping[str, int]) -> tuple[list[str], int]:
        """Files that landed behind the stream position since it passed them: (the ones named, how many in all).

        Files are read in name order, so a file sorting at or before the
        position that was not read landed late. The offsets count the files
        read (``consumed``) and keep the :attr:`late_file_window` largest
        names read (``recent``): a file unread but within that window is
        named; one further behind is only counted.
        """
        if not start or start.get("file") is None:
            return [], 0
        pos_file, consumed = start["file"], int(start.get("consumed", 0))
        behind = [name for name in arrivals if name <= pos_file]
        unread = len(behind) - consumed
        if unread <= 0:
            return [], 0
        recent = start.get("recent") or []
        # Every name read is in ``recent`` until the window fills; after that, those from its first on.
        floor = "" if len(recent) >= consumed else (recent[0] if recent else None)
        known = set(recent)
        named = sorted(n for n in behind if floor is not None and n >= floor and n not in known)
        return named, max(unread, len(named))

    def _refuse_late(self, named: list[str], count: int, pos_file: str) -> BlockedInputError:
        shown = ", ".join(repr(n) for n in named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
        unnamed = count - len(named)
        what = f"file(s) {shown}" if named else ""
        if unnamed > 0:
            what += (" and " if what else "") + (
                f"{unnamed} file(s) too far behind to tell from files already read (only the last "
                f"{self.late_file_window} names read are kept)"
            )
        return BlockedInputError(
            f"source {self.source_id}: {what} landed in {self.path} sorting at or before the stream position "
            f"{pos_file!r}: files are read in name order. late_files={self.late_files.value!r} refuses them. "
            "Set late_files='next_epoch' (read them in the next epoch) or 'dead_letter' (one dead letter per file); "
            "or move each to a name after the position but before files still to land"
        )

    def earliest_arrival_ms(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> int | None:
        """When the earliest file not yet (wholly) consumed arrived, in ms rounded up; None if none."""
        pos_file = start["file"] if start else None
        pos_line = start["line"] if start else None
        arrivals = self._arrivals(arrival_cutoff_ms)
        waiting = [
            mtime_ns
            for name, mtime_ns in arrivals.items()
            if pos_file is None or name > pos_file or (name == pos_file and pos_line is not None)
        ]
        named, count = self._late_files(start, arrivals)
        # Late files are input too (refused ones as well: planning then says why).
        if count:
            late = [arrivals[n] for n in named] if count == len(named) else [t for n, t in arrivals.items() if n <= str(pos_file)]
            waiting += late
        # Rounded up: a cut-off at this millisecond still takes the file.
        return -(-min(waiting) // 1_000_000) if waiting else None

    def plan(
        self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None, counter: RecordCounter | None = None
    ) -> dict[str, Any]:
        """End offsets: the next files in name order, files that landed behind the position by ``late_files``.

        1. Late files (see :meth:`_late_files`): refused with a
           :class:`BlockedInputError`, or taken whole in this epoch (ahead of
           the others), or listed under ``late`` as whole-file dead letters.
           A file too far behind to be named is always refused.
        2. The files after the position, up to ``max_files_per_epoch`` and
           ``max_records_per_epoch``, as ranges of lines (rows); ``counter``
           counts the records of the files this may take, a few at a time.
        3. The new position: the last range's end; ``consumed`` and
           ``recent`` take every file read or dead-lettered.
        """
        pos_file = start["file"] if start else None
        pos_line = start["line"] if start else None
        consumed = int(start.get("consumed", 0)) if start else 0
        recent = list(start.get("recent") or []) if start else []
        arrivals = self._arrivals(arrival_cutoff_ms)
        eligible = sorted(arrivals)
        base = normalize_uri(self.path)
        # 1. Late files.
        named, count = self._late_files(start, arrivals)
        if count and (self.late_files is LateFiles.REFUSE or count > len(named)):
            raise self._refuse_late(named, count, str(pos_file))
        sizes = {name: objects.file_size(join_uri(base, name)) for name in named}
        taken = [[n, 0, None, sizes[n]] for n in named] if self.late_files is LateFiles.NEXT_EPOCH else []
        dead = [[n, sizes[n]] for n in named] if self.late_files is LateFiles.DEAD_LETTER else []
        # 2. The files after the position.
        remaining: list[tuple[str, int]] = []
        for name in eligible:
            if pos_file is None or name > pos_file:
                remaining.append((name, 0))
            elif name == pos_file and pos_line is not None:
                remaining.append((name, pos_line))
        ranges: list[list[Any]] = []
        budget = self.max_records_per_epoch
        candidates = remaining[: self.max_files_per_epoch]
        counts: dict[str, int] = {}
        for i, (name, from_line) in enumerate(candidates):
            full = join_uri(base, name)
            if budget is None:
                ranges.append([name, from_line, None, objects.file_size(full)])
                continue
            if full not in counts:
                counts.update(self._counted([join_uri(base, n) for n, _ in candidates[i : i + _COUNT_BATCH_FILES]], counter))
            available = counts[full] - from_line
            if available <= budget:
                ranges.append([name, from_line, None, objects.file_size(full)])
                budget -= available
            else:
                ranges.append([name, from_line, from_line + budget, objects.file_size(full)])
                budget = 0
            if budget == 0:
                break
        # 3. The new position.
        new_names = named + [name for name, *_ in ranges if name != pos_file]
        if ranges:
            pos_file, _, pos_line, _ = ranges[-1]
        end: dict[str, Any] = {
            "file": pos_file,
            "line": pos_line,
            "files": taken + ranges,
            "consumed": consumed + len(new_names),
            "recent": sorted(set(recent).union(new_names))[-self.late_file_window :],
        }
        if dead:
            end["late"] = dead
        return end

    def has_records(self, end: Mapping[str, Any]) -> bool:
        return bool(end.get("files") or end.get("late"))

    def backlog(self, end: Mapping[str, Any] | None) -> Backlog:
        """Files after the position (the one partly read included) and late files not yet taken."""
        listing = self._listing()
        pos_file = end["file"] if end else None
        pos_line = end["line"] if end else None
        named, _ = self._late_files(end, {f.path: f.modified_ns for f in listing})
        waiting = [
            f for f in listing
            if pos_file is None or f.path > pos_file or (f.path == pos_file and pos_line is not None) or f.path in named
        ]
        oldest = min((f.modified_ns for f in waiting), default=None)
        return Backlog(len(waiting), sum(f.size for f in waiting), -(-oldest // 1_000_000) if oldest is not None else None)

    def _counted(self, uris: list[str], counter: RecordCounter | None) -> Mapping[str, int]:
        if counter is None:
            raise SourceError(
                f"source {self.source_id}: max_records_per_epoch needs the records of the files counted by executors: "
                "plan epochs through the checkpoint coordinator (or pass plan() a counter)"
            )
        counts = counter(uris, self.format)
        if set(counts) != set(uris):
            raise SourceError(f"source {self.source_id}: records counted for {sorted(counts)}, asked for {sorted(uris)}")
        return counts

    def describe(self) -> dict[str, Any]:
        return {"type": "file", "id": self.source_id, "format": self.format, "path": self.path}

    # -- reading ----------------------------------------------------------

    def read(
        self, spark: "SparkSession", end: Mapping[str, Any], parallelism: int, source_index: int = 0, ordered: bool = True,
        keys: Mapping[str, str] | None = None,
    ) -> SourceBatch:
        ranges = end.get("files") or []
        base = normalize_uri(self.path)
        fields = self.schema if self.schema is not None else self.parser_schema
        keys = {k: op for k, op in (keys or {}).items() if fields is not None and k in fields.names}
        for name, *_ in ranges:
            if not objects.exists(join_uri(base, name)):
                raise BlockedInputError(
                    f"source {self.source_id}: file {name} recorded in the barrier is gone; "
                    "landing files must be kept until their epoch is completed"
                )
        # Files that landed behind the position, set aside whole (late_files='dead_letter').
        late = [
            (name, None, problem(DeadLetterReason.LATE_FILE, f"landed after the stream had passed its name ({size} bytes, never read)"))
            for name, size in end.get("late") or []
        ]
        if self.format == "parquet":
            return self._read_parquet(spark, base, ranges, source_index, keys, late)
        whole_files = all(from_line == 0 and to_line is None for _, from_line, to_line, _ in ranges)
        # Spark's own readers need a file system it can open; object-store files are read by Python tasks.
        if not ordered and not late and self.parser is None and ranges and whole_files and objects.is_local(base):
            unordered = self._read_jsonl_unordered(spark, base, ranges, keys)
            if unordered is not None:
                return unordered
        batch = self._read_jsonl(spark, base, ranges, source_index, parallelism, keys)
        if late:
            assert batch.dead_letters is not None
            batch = dataclasses.replace(
                batch, dead_letters=batch.dead_letters.unionByName(whole_file_dead_letters(spark, self.source_id, late))
            )
        return batch

    def _read_jsonl_unordered(
        self, spark: "SparkSession", base: str, ranges: list[list[Any]], keys: Mapping[str, str] | None = None
    ) -> SourceBatch | None:
        """Whole files parsed by Spark's JSON reader in one pass, split across cores, without line numbers.

        Spark's JSON reader and ``from_json`` (the ordered read) run the same
        parser on the same ``\\n``-separated lines, with four differences:
        the reader takes a top-level array as several records, decodes the
        raw bytes (lenient with some invalid UTF-8), skips a byte-order mark
        and guesses UTF-16/32 from NUL bytes. So the batch is good only for
        files whose bytes rule all four out. No file is read here: a Spark
        job checks the bytes (:func:`_plain_input_job`) in a background
        thread while the epoch runs, and the batch's ``plain_input`` says
        whether they passed; if not, the runtime discards the attempt and
        computes the epoch again with ordered reads. A line is blank, good or
        bad by the rules of the ordered read, so with plain input and no bad
        line both reads give the same records. Bad lines are only counted
        (the batch's ``observation``); dead letters need line numbers, so an
        epoch with any bad line is computed again with the ordered read too.

        Returns ``None`` (use the ordered read) when names or recorded sizes
        alone rule the check out: a path with a glob character (Spark would
        match it as a pattern, not as the file) or a file too large to check
        as one value (:data:`_PLAIN_CHECK_MAX_BYTES`).
        """
        assert self.schema is not None
        paths = [local_path(join_uri(base, name)) for name, *_ in ranges]
        if any(_GLOB_CHARS.intersection(path) for path in paths):
            return None
        if any(size > _PLAIN_CHECK_MAX_BYTES for *_, size in ranges):
            return None
        # Empty files hold no line and Spark's file sources skip them.
        checked = [path for path, (*_, size) in zip(paths, ranges) if size > 0]
        plain_input = _in_background(_plain_input_job, spark, checked)
        batch = self._json_reader_batch(spark, paths, tuple(sorted(keys or {})))
        return dataclasses.replace(batch, plain_input=plain_input)

    def _json_reader_batch(self, spark: "SparkSession", paths: list[str], keys: tuple[str, ...] = ()) -> SourceBatch:
        """The lazy plan of :meth:`_read_jsonl_unordered`: good records, counted lines."""
        from pyspark.sql import Observation
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.sql.types import StringType, StructField, StructType

        assert self.schema is not None
        fields = [f.name for f in self.schema]
        corrupt = _unused_name("_corrupt_line", fields)
        schema = StructType([*from_arrow_schema(self.schema).fields, StructField(corrupt, StringType())])
        parsed = (
            spark.read.schema(schema)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", corrupt)
            .option("lineSep", "\n")
            .json(paths)
        )
        required = tuple(f.name for f in self.schema if not f.nullable)
        text_keys = tuple(k for k in keys if pa.types.is_string(self.schema.field(k).type))
        good, counts = session_cached(
            ("json_reader_checks", corrupt, required, keys, text_keys), lambda: _line_checks(corrupt, required, keys, text_keys)
        )
        observation = Observation()
        records = parsed.observe(observation, *counts).where(good).select(*fields)
        return SourceBatch(records=records, dead_letters=None, observation=observation)

    def _tasks(
        self, base: str, ranges: list[list[Any]], chunk_bytes: int | None = None
    ) -> list[tuple[str, int, str, int, int, int, int, int]]:
        # (name, file index in the epoch, path, from_line, to_line (-1: to the end), byte_start, byte_end, size)
        chunk_bytes = chunk_bytes or _CHUNK_BYTES
        tasks = []
        for fidx, (name, from_line, to_line, size) in enumerate(ranges):
            path = join_uri(base, name)  # a local path, or a URI the tasks open through the storage layer
            if from_line == 0 and to_line is None and size > chunk_bytes:
                chunks = math.ceil(size / chunk_bytes)
                for i in range(chunks):
                    tasks.append((name, fidx, path, 0, -1, i * chunk_bytes, min(size, (i + 1) * chunk_bytes), size))
            else:
                tasks.append((name, fidx, path, from_line, -1 if to_line is None else to_line, 0, -1, size))
        return tasks

    def _lines(self, spark: "SparkSession", base: str, ranges: list[list[Any]], parallelism: int) -> "DataFrame":
        """The epoch's non-blank lines for ``from_json``: ``_fidx, _line, _raw, _error`` (read natively).

        Spark reads each file whole and splits it on newlines, which numbers
        lines exactly and keeps parsing in the JVM; files too large for one
        string are read in byte ranges by Python tasks instead. Lines are then
        spread over ``parallelism`` partitions for parsing. (A line parser
        reads its lines in Python: :meth:`_parsed_lines`.)
        """
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        # Spark reads local files itself; too large ones, and files on an object store, are read by Python tasks.
        by_spark = objects.is_local(base)
        big = [[name, f, t, size, fidx] for fidx, (name, f, t, size) in enumerate(ranges) if size > _WHOLETEXT_MAX_BYTES or not by_spark]
        whole = [(fidx, name, f, t) for fidx, (name, f, t, size) in enumerate(ranges) if size <= _WHOLETEXT_MAX_BYTES and by_spark]
        lines = None
        if whole:
            # One relation over every file (one listing, one plan, small files
            # packed into few tasks); each row says which file it is.
            text = spark.read.text([local_path(join_uri(base, name)) for _, name, _, _ in whole], wholetext=True)
            # Spark gives the name URI-encoded; '+' is left as is, so it is
            # escaped before decoding (which would read it as a space).
            name = F.url_decode(F.replace(F.col("_metadata.file_name"), F.lit("+"), F.lit("%2B")))

            def by_name(value: Callable[[int, int, int | None], int | None], kind: str) -> "Column":
                entries = [x for fidx, n, f, t in whole for x in (F.lit(n), F.lit(value(fidx, f, t)).cast(kind))]
                return F.create_map(*entries)[name]

            fidx = by_name(lambda fidx, f, t: fidx, "int")
            # A name that does not map back would lose its lines: fail instead.
            fidx = F.when(fidx.isNull(), F.raise_error(F.concat(F.lit("unmapped input file "), name))).otherwise(fidx)
            # One trailing newline ends the last line; it does not start another.
            split = F.split(F.regexp_replace("value", "\\n\\z", ""), "\n", -1)
            # Splitting decodes the file (invalid bytes become U+FFFD), so
            # validity is judged on the file's raw bytes first.
            exploded = text.select(
                fidx.alias("_fidx"),
                by_name(lambda fidx, f, t: f, "long").alias("_from"),
                by_name(lambda fidx, f, t: t, "long").alias("_to"),
                F.is_valid_utf8("value").alias("_file_ok"),
                F.posexplode(split).alias("_pos", "_raw"),
            )
            lines = exploded.where(
                (F.col("_pos") >= F.col("_from")) & (F.col("_to").isNull() | (F.col("_pos") < F.col("_to")))
            ).select(
                F.col("_fidx").cast("int").alias("_fidx"),
                (F.col("_pos") + 1).cast("long").alias("_line"),
                F.col("_raw"),
                (~F.col("_file_ok") & F.col("_raw").contains("\ufffd")).alias("_bad_utf8"),
            )
        if lines is not None:
            raw = F.regexp_replace("_raw", "\r\\z", "")
            lines = lines.select(
                "_fidx",
                "_line",
                raw.alias("_raw"),
                F.when(F.col("_bad_utf8"), F.lit(problem(DeadLetterReason.INVALID_UTF8, "not valid UTF-8 (shown with U+FFFD replacements)")))
                .cast("string")
                .alias("_error"),
            ).where(~F.regexp_like("_raw", F.lit("(?U)^\\s*$")))
            lines = lines.repartition(max(2, parallelism))
        if big:
            big_files = {fidx for *_, fidx in big}
            tasks = [t for t in self._tasks(base, ranges) if t[1] in big_files]
            tasks_df = spark.createDataFrame(tasks, _TASK_SCHEMA).repartition(len(tasks))

            def raw_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    for task in batch.to_pylist():
                        yield from _raw_task(task)

            chunked = tasks_df.mapInArrow(raw_batches, from_arrow_schema(_RAW_SCHEMA))
            lines = chunked if lines is None else lines.unionByName(chunked)
        if lines is None:
            lines = spark.createDataFrame([], from_arrow_schema(_RAW_SCHEMA))
        return lines

    def _parsed_lines(
        self, spark: "SparkSession", base: str, ranges: list[list[Any]], parallelism: int, keys: Mapping[str, str] | None = None
    ) -> "DataFrame":
        """The epoch's non-blank lines through the line parser: its fields, ``_fidx, _line, _raw, _error``.

        The parser runs in Python anyway, so each Python task reads its
        byte range or line range (:meth:`_tasks`) itself, splits it into
        numbered lines with Arrow (:func:`_raw_task`) and parses them:
        no line crosses between the JVM and Python, and no shuffle spreads
        them. Whole files are cut into about ``parallelism`` ranges, so even
        a one-file epoch parses on every core.
        """
        from pyspark.sql.pandas.types import from_arrow_schema

        assert self.parser is not None and self.parser_schema is not None
        out_schema = _parsed_schema(self.parser_schema)
        tasks = self._tasks(base, ranges, _parse_chunk_bytes(ranges, parallelism))
        if not tasks:
            return spark.createDataFrame([], from_arrow_schema(out_schema))
        parser, parser_schema = self.parser, self.parser_schema
        key_list = sorted((keys or {}).items())

        def parse_tasks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for task in batch.to_pylist():
                    for lines in _raw_task(task):
                        yield _parse_lines(lines, parser, parser_schema, out_schema, key_list)

        tasks_df = spark.createDataFrame(tasks, _TASK_SCHEMA).repartition(len(tasks))
        return tasks_df.mapInArrow(parse_tasks, from_arrow_schema(out_schema))

    def _read_jsonl(
        self, spark: "SparkSession", base: str, ranges: list[list[Any]], source_index: int, parallelism: int = 2,
        keys: Mapping[str, str] | None = None,
    ) -> SourceBatch:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.sql.types import StringType, StructField

        source_id = self.source_id
        keys = dict(keys or {})
        if self.parser is not None:
            parsed = self._parsed_lines(spark, base, ranges, parallelism, keys)
        else:
            assert self.schema is not None
            fields = self.schema.names
            corrupt = _unused_name("_corrupt_line", fields)
            spark_schema = from_arrow_schema(self.schema).add(StructField(corrupt, StringType()))
            raw = self._lines(spark, base, ranges, parallelism)
            options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
            raw = raw.withColumn("_value", F.from_json("_raw", spark_schema, options))
            error = F.coalesce(F.col("_error"), _json_line_problem(self.schema, corrupt, keys))
            parsed = raw.select(
                "_fidx",
                "_line",
                # Keep the raw text only for dead letters: the cache stays small.
                F.when(error.isNotNull(), F.col("_raw")).alias("_raw"),
                error.alias("_error"),
                *[F.col("_value").getField(name).alias(name) for name in fields],
            )
        parsed = parsed.persist()
        fields = [f.name for f in (self.parser_schema if self.parser is not None else self.schema)]  # type: ignore[union-attr]
        records = parsed.where(F.col("_error").isNull()).select(
            *fields, arrival_seq(source_index, F.col("_fidx"), F.col("_line")).alias(SEQ)
        )
        names = F.array(*[F.lit(name) for name, *_ in ranges]) if ranges else F.array().cast("array<string>")
        reason, detail = reason_and_detail(F.col("_error"))
        dead = parsed.where(F.col("_error").isNotNull()).select(
            F.lit(source_id).alias("source"),
            F.element_at(names, F.col("_fidx") + 1).alias("source_file"),
            F.col("_line").alias("line"),
            F.col("_raw").alias("raw"),
            reason.alias("reason"),
            detail.alias("detail"),
        )
        return SourceBatch(records=records, dead_letters=dead, shared=(parsed,), files=tuple(name for name, *_ in ranges))

    def _read_parquet(
        self, spark: "SparkSession", base: str, ranges: list[list[Any]], source_index: int, keys: Mapping[str, str],
        whole_files: Sequence[tuple[str, str | None, str]],
    ) -> SourceBatch:
        """The epoch's rows of its Parquet files as the source's ``schema``; files that cannot be are dead letters.

        1. Each file's footer (metadata only) is checked against the schema:
           a file that is not readable Parquet, or whose columns do not read
           as the schema's (:func:`schema_mismatches`), becomes one dead
           letter for the whole file and the epoch goes on without it.
        2. The other files are read by executors with their own column types
           (Spark's reader for local files, Python tasks for object stores),
           then widened to the schema's; an absent nullable column is null.
        3. Rows missing a required field or a key are dead letters
           (:func:`record_checks`), each with its row number from 1.
        """
        from pyspark.sql import functions as F

        assert self.schema is not None
        frames: list["DataFrame"] = []
        whole_files = list(whole_files)
        for fidx, (name, from_line, to_line, size) in enumerate(ranges):
            uri = join_uri(base, name)
            # 1. The footer only.
            try:
                found = parquet_schema(uri)
            except StorageError as exc:
                whole_files.append((name, None, problem(DeadLetterReason.UNREADABLE_FILE, f"not a readable Parquet file: {exc}")))
                continue
            mismatches = schema_mismatches(self.schema, found, absent_nullable_ok=True)
            mismatches += [m for m in _unreadable_columns(self.schema, found) if m not in mismatches]
            if mismatches:
                detail = "; ".join(m.describe() for m in mismatches)
                whole_files.append((name, _schema_text(found), problem(DeadLetterReason.INCOMPATIBLE_SCHEMA, detail)))
                continue
            # 2. Read as written, then widened.
            present = pa.schema([found.field(f.name) for f in self.schema if f.name in found.names])
            sizes = {uri: size} if size is not None and size >= 0 else None
            df = read_parquet_files(spark, [uri], present, with_row_index=True, sizes=sizes)
            df = df.where(F.col(ROW_INDEX_COLUMN) >= from_line)
            if to_line is not None:
                df = df.where(F.col(ROW_INDEX_COLUMN) < to_line)
            frames.append(df.select(*_widened(self.schema, present), F.lit(fidx).alias("_fidx"), (F.col(ROW_INDEX_COLUMN) + 1).alias("_line")))
        # 3. Row checks.
        return checked_rows(
            spark, frames, self.schema, keys,
            source_id=self.source_id, names=[name for name, *_ in ranges], source_index=source_index, whole_files=whole_files,
        )


def _widened(schema: pa.Schema, present: pa.Schema) -> list["Column"]:
    """``schema``'s columns from a frame holding ``present`` (same names, narrower or equal types)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    return [
        (F.col(f.name) if f.name in present.names else F.lit(None)).cast(from_arrow_type(f.type)).alias(f.name)
        for f in schema
    ]


def _unreadable_columns(schema: pa.Schema, found: pa.Schema) -> list[ColumnMismatch]:
    """Columns of ``found`` the source needs whose type Spark cannot represent (e.g. unsigned integers)."""
    from pyspark.sql.pandas.types import from_arrow_type

    unreadable = []
    for f in schema:
        if f.name in found.names and found.get_all_field_indices(f.name) == [found.get_field_index(f.name)]:
            try:
                from_arrow_type(found.field(f.name).type)
            except (TypeError, NotImplementedError):
                unreadable.append(ColumnMismatch(f.name, f.type, found.field(f.name).type))
    return unreadable


# size: the file's size when the barrier was planned (-1: not recorded); a task refuses a file that changed.
_TASK_SCHEMA = "name string, fidx int, path string, from_line long, to_line long, byte_start long, byte_end long, size long"
_RAW_SCHEMA = pa.schema(
    [("_fidx", pa.int32()), ("_line", pa.int64()), ("_raw", pa.string()), ("_error", pa.string())]
)


def _parse_chunk_bytes(ranges: list[list[Any]], parallelism: int) -> int:
    """Byte range per parsing task: whole files split about ``parallelism`` ways, within [1 MiB, 16 MiB]."""
    whole_bytes = sum(size for _, from_line, to_line, size in ranges if from_line == 0 and to_line is None)
    return min(_CHUNK_BYTES, max(_MIN_CHUNK_BYTES, math.ceil(whole_bytes / max(1, parallelism))))


def _parsed_schema(parser_schema: pa.Schema) -> pa.Schema:
    """The parsed lines: the parser's fields (nullable: a dead letter has none), then line and problem."""
    return pa.schema(
        [
            *(f.with_nullable(True) for f in parser_schema),
            pa.field("_fidx", pa.int32()),
            pa.field("_line", pa.int64()),
            pa.field("_raw", pa.string()),
            pa.field("_error", pa.string()),
        ]
    )


def _json_line_problem(schema: pa.Schema, corrupt: str, keys: Mapping[str, str]) -> "Column":
    """Why a line ``from_json`` parsed into ``_value`` is not a record (a :func:`problem` string), or null.

    Whether a line is a record is decided exactly as the JSON reader's
    :func:`_line_checks` decides it: no corrupt value (``from_json`` sets
    ``corrupt`` when the line is not JSON, not an object, or a value does not
    convert to its field's type, instead of leaving that field null), every
    required field and key present and not null, string keys not empty. The
    other expressions only name the reason, for lines already found bad.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    raw, value = F.col("_raw"), F.col("_value")
    first = F.regexp_extract(raw, r"^\s*(\S)", 1)
    scalar = F.get_json_object(raw, "$").isNotNull() | (F.trim(raw) == F.lit("null"))
    not_an_object = (
        F.when(first == F.lit("["), F.lit(problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON array, not an object")))
        .when(F.json_object_keys(raw).isNotNull(), None)
        .when(first == F.lit('"'), F.lit(problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON string, not an object")))
        .when(scalar, F.lit(problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON number, boolean or null, not an object")))
        .otherwise(F.lit(problem(DeadLetterReason.NOT_JSON, "not valid JSON")))
    )
    # Each field again as its JSON text: a value that is there as text but
    # not in the typed parse did not convert to the field's type.
    as_text = F.from_json(raw, StructType([StructField(f.name, StringType()) for f in schema]))
    wrong = [
        F.when(
            as_text.getField(f.name).isNotNull() & value.getField(f.name).isNull(),
            F.concat(F.lit(f"{f.name}: "), F.substring(as_text.getField(f.name), 1, 100), F.lit(f" is not {f.type}")),
        )
        for f in schema
        if not pa.types.is_string(f.type)
    ]
    described = F.concat_ws("; ", *wrong) if wrong else F.lit("")
    wrong_type = F.when(
        described != F.lit(""), F.concat(F.lit(f"{DeadLetterReason.WRONG_TYPE.value}: "), described)
    ).otherwise(
        F.lit(problem(DeadLetterReason.WRONG_TYPE, f"does not match the schema {_schema_text(schema)}"))
    )
    # A top-level array is never a record, whatever from_json makes of it
    # (Spark's JSON reader would take its elements as records; such files are
    # never read by it, see _plain_input_job).
    problem_of: Column | None = F.when(
        value.isNull() | value.getField(corrupt).isNotNull() | (first == F.lit("[")), F.coalesce(not_an_object, wrong_type)
    )
    problem_of = first_problem(record_checks(value.getField, schema, keys), problem_of)
    assert problem_of is not None
    return problem_of


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def _line_checks(
    corrupt: str, required: tuple[str, ...], keys: tuple[str, ...] = (), text_keys: tuple[str, ...] = ()
) -> tuple["Column", list["Column"]]:
    """The JSON reader's good-record condition and the ``good``/``bad`` line counts.

    A line is good by the same rules as in the ordered read
    (:func:`_json_line_problem`): parsed without a corrupt value, its
    required fields and keys not null, its string keys not empty.
    """
    from pyspark.sql import functions as F

    good = F.col(corrupt).isNull()
    for name in (*required, *keys):
        good = good & F.col(name).isNotNull()
    for name in text_keys:
        good = good & (F.col(name) != F.lit(""))
    # The reader skips lines of JSON whitespace; other blank lines come back
    # as corrupt and are skipped here, as the ordered read does.
    blank = F.coalesce(F.regexp_like(corrupt, F.lit("(?U)^\\s*$")), F.lit(False))
    return good, [F.count_if(good).alias("good"), F.count_if(~good & ~blank).alias("bad")]


# Spark expands these in a path as a glob pattern (``SparkHadoopUtil.isGlobPath``).
_GLOB_CHARS = frozenset("{}[]*?\\")
# Bytes checked as one value per file: the file's bytes plus, for the array
# rule, a JVM string of them (up to twice as large). The same bound as a
# whole-file read in the ordered read; larger files are read in chunks there.
_PLAIN_CHECK_MAX_BYTES = _WHOLETEXT_MAX_BYTES
# A line (``\n``-separated) with a ``[`` before its first ``{``: a Java regex
# found in ``"\n" + text`` (``(?m)^`` would also match after ``\r`` and other
# line terminators; ``(?:\A|\n)`` measured slower than the extra ``\n``).
_ARRAY_LINE = r"\n[^{\n]*\["


def _plain_input_job(spark: "SparkSession", paths: list[str]) -> bool:
    """Whether Spark's JSON reader reads these files' lines exactly as ``from_json`` would.

    True when every file is valid UTF-8 with no NUL byte and no byte-order
    mark, and no line has a ``[`` before its first ``{`` (so no line is a
    top-level array). One Spark job with native expressions: the executors
    read the files (one binary value per file, so each must be well under
    2 GiB) and the driver gets one row back. ``paths`` must be literal (no
    glob character) and name non-empty files, each giving one row.
    """
    from pyspark.sql import functions as F

    if not paths:
        return True
    content = F.col("content")
    text = content.cast("string")  # the raw bytes, not decoded
    clean = (
        F.is_valid_utf8(text)
        & ~F.contains(content, F.unhex(F.lit("00")))
        & ~F.contains(content, F.unhex(F.lit("EFBBBF")))
    )
    # The text is only matched when it is valid UTF-8 and has a bracket at all.
    lines = F.concat(F.lit("\n"), text)
    no_array_line = ~F.contains(content, F.unhex(F.lit("5B"))) | ~F.regexp_like(lines, F.lit(_ARRAY_LINE))
    plain = F.when(clean, no_array_line).otherwise(F.lit(False))
    files = spark.read.format("binaryFile").load(paths)
    row = files.agg(F.count(F.lit(1)).alias("files"), F.bool_and(plain).alias("plain")).collect()[0]
    # A file Spark did not read (or read twice) is not known to be plain.
    return row["files"] == len(paths) and row["plain"] is True


def _in_background(fn: Callable[..., _T], *args: Any) -> "Future[_T]":
    """``fn(*args)`` in a new daemon thread; its result (or exception) in the returned future.

    A thread per call rather than a shared pool: nothing to reinitialise
    after a fork, and the interpreter does not wait for it at exit.
    """
    future: "Future[_T]" = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="barrierflow-plain-input", daemon=True).start()
    return future


def _unused_name(prefix: str, taken: list[str]) -> str:
    name = prefix
    while name in taken:
        name = "_" + name
    return name


def count_records_on_executors(spark: "SparkSession", uris: Sequence[str], fmt: str) -> dict[str, int]:
    """Records in each file (lines of JSON Lines, rows of Parquet), counted by executor tasks, one per file."""
    if not uris:
        return {}
    files = spark.createDataFrame([(uri,) for uri in uris], "uri string").repartition(len(uris))
    rows = files.mapInArrow(functools.partial(_count_batches, fmt), "uri string, records long").collect()
    return {row["uri"]: int(row["records"]) for row in rows}


def _count_batches(fmt: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        uris = batch.column("uri").to_pylist()
        yield pa.RecordBatch.from_pydict(
            {"uri": uris, "records": [count_records(uri, fmt) for uri in uris]},
            schema=pa.schema([("uri", pa.string()), ("records", pa.int64())]),
        )


def count_records(uri: str, fmt: str) -> int:
    """Records in one file, where it is read (an executor task)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            with objects.open_input(uri) as fh:
                return int(pq.ParquetFile(fh).metadata.num_rows)
        except (OSError, pa.ArrowInvalid):
            return 0  # not Parquet: taken whole, and dead-lettered whole when read
    return _count_lines(uri)


def _count_lines(path: str) -> int:
    count = 0
    last = b"\n"
    with objects.open_input(path) as fh:
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
    with objects.open_input(path) as fh:
        _check_unchanged(fh, task)
        if end < 0:
            lines = fh.read().split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()  # a trailing newline ends the last line, it does not start one
            stop = len(lines) if to_line < 0 else min(to_line, len(lines))
            for idx in range(from_line, stop):
                yield idx + 1, lines[idx]
            return
        first = _first_owned_offset(fh, start)
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


def _check_unchanged(fh: Any, task: Mapping[str, Any]) -> None:
    """Refuse a file whose size differs from the one its barrier recorded: its epoch would read other lines."""
    planned = task.get("size", -1)
    if planned is None or planned < 0:
        return
    actual = fh.seek(0, 2)
    fh.seek(0)
    if actual != planned:
        raise SourceError(
            f"landing file {task['name']} has {actual} bytes, {planned} when its epoch was planned: a landed file "
            "must never change (land new data as a new file, named after the last)"
        )


def _first_owned_offset(fh: Any, start: int) -> int:
    """Offset of the first line starting at or after ``start`` (a range owns those)."""
    if start == 0:
        return 0
    fh.seek(start - 1)
    if fh.read(1) == b"\n":
        return start
    fh.readline()  # the rest of a line that the previous range owns
    return int(fh.tell())


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
        detail = f"not valid UTF-8: {exc.reason} at byte {exc.start}"
        return text.decode("utf-8", errors="replace"), problem(DeadLetterReason.INVALID_UTF8, detail)


def _read_task_bytes(task: Mapping[str, Any]) -> tuple[int, bytes]:
    """(number of the first line, bytes of the lines the task owns)."""
    path, start, end = task["path"], task["byte_start"], task["byte_end"]
    with objects.open_input(path) as fh:
        _check_unchanged(fh, task)
        if end < 0:
            data = fh.read()
            from_line, to_line = task["from_line"], task["to_line"]
            if from_line == 0 and to_line < 0:
                return 1, data
            lines = data.split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            stop = len(lines) if to_line < 0 else min(to_line, len(lines))
            return from_line + 1, b"".join(line + b"\n" for line in lines[from_line:stop])
        first = _first_owned_offset(fh, start)
        line_no = 1 + _count_newlines_before(fh, first)
        fh.seek(first)
        data = fh.read(max(0, end - first))
        if data and not data.endswith(b"\n"):
            data += fh.readline()  # finish the last line that starts in this range
        return line_no, data


def _raw_task(task: Mapping[str, Any]) -> Iterator[pa.RecordBatch]:
    """The task's non-blank lines as Arrow, split and decoded without Python loops."""
    import pyarrow.compute as pc

    first_line, data = _read_task_bytes(task)
    if not data:
        return
    lines = pc.list_flatten(pc.split_pattern(pa.array([data], pa.binary()), b"\n"))
    if data.endswith(b"\n"):
        lines = lines.slice(0, len(lines) - 1)  # a trailing newline ends a line, it does not start one
    numbers = pa.array(range(first_line, first_line + len(lines)), pa.int64())
    try:
        text = pc.replace_substring_regex(lines.cast(pa.string()), pattern="\r$", replacement="")
    except pa.ArrowInvalid:
        yield from _raw_task_per_line(task)  # invalid UTF-8 somewhere: find it line by line
        return
    keep = pc.invert(pc.equal(pc.utf8_trim_whitespace(text), ""))
    text, numbers = text.filter(keep), numbers.filter(keep)
    fidx = pa.array([task["fidx"]] * len(text), pa.int32())
    errors = pa.nulls(len(text), pa.string())
    yield pa.RecordBatch.from_arrays([fidx, numbers, text, errors], schema=_RAW_SCHEMA)


def _raw_task_per_line(task: Mapping[str, Any], batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    fidx, lines, raws, errors = [], [], [], []
    for line_no, raw in _iter_lines(task):
        text, error = _decode(raw)
        if not text.strip():
            continue  # blank lines are skipped, by definition not records
        fidx.append(task["fidx"])
        lines.append(line_no)
        raws.append(text)
        errors.append(error)
        if len(fidx) >= batch_rows:
            yield pa.RecordBatch.from_arrays(
                [pa.array(fidx, pa.int32()), pa.array(lines, pa.int64()), pa.array(raws), pa.array(errors, pa.string())],
                schema=_RAW_SCHEMA,
            )
            fidx, lines, raws, errors = [], [], [], []
    if fidx:
        yield pa.RecordBatch.from_arrays(
            [pa.array(fidx, pa.int32()), pa.array(lines, pa.int64()), pa.array(raws), pa.array(errors, pa.string())],
            schema=_RAW_SCHEMA,
        )


def _parse_lines(
    batch: pa.RecordBatch,
    parser: LineParser,
    parser_schema: pa.Schema,
    out_schema: pa.Schema,
    keys: list[tuple[str, str]] | tuple[()] = (),
) -> pa.RecordBatch:
    """Run the line parser over a batch of lines; a line it refuses is a dead letter.

    Its :class:`RecordError` gives the reason and detail; a returned record
    is a dead letter too when a non-nullable field or a key (``(column,
    operator id)`` pairs) is missing or null, a string key is empty, or a
    value does not convert to its field's type (never coerced to null).
    Built column by column (no dict per output row): the wrapper around the
    parser cost as much as the parser itself.
    """
    raws = batch.column("_raw").to_pylist()
    errors = batch.column("_error").to_pylist()
    required = [f.name for f in parser_schema if not f.nullable]
    records: list[Mapping[str, Any] | None] = []
    for i, text in enumerate(raws):
        if errors[i] is not None:
            records.append(None)
            continue
        try:
            record = parser(text)
        except RecordError as exc:
            errors[i] = problem(exc.reason, str(exc) or "invalid record")
        except Exception as exc:  # a parser bug must not crash the epoch
            errors[i] = problem(DeadLetterReason.PARSER_FAILED, f"{type(exc).__name__}: {exc}")
        else:
            errors[i] = _record_problem(record, required, keys)
            if errors[i] is None:
                records.append(record)
                continue
        records.append(None)
    fields = []
    for spec in parser_schema:
        values = [None if r is None else r.get(spec.name) for r in records]
        accepts = _python_values_of(spec.type)
        if accepts is not None and not all(v is None or accepts(v) for v in values):
            # pyarrow would convert these (1.5 to 1, True to 1): the line is a dead letter instead.
            for i, v in enumerate(values):
                if v is not None and not accepts(v):
                    errors[i] = _wrong_type(spec, v)
                    records[i] = values[i] = None
        try:
            fields.append(pa.array(values, type=spec.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            fields.append(_convert_per_value(values, spec, records, errors))
    kept_raw = [None if r is not None else text for r, text in zip(records, raws)]
    return pa.RecordBatch.from_arrays(
        [
            *fields,
            batch.column("_fidx").cast(pa.int32()),
            batch.column("_line").cast(pa.int64()),
            pa.array(kept_raw, type=pa.string()),
            pa.array(errors, type=pa.string()),
        ],
        schema=out_schema,
    )


def _record_problem(record: Mapping[str, Any], required: list[str], keys: Any) -> str | None:
    if not isinstance(record, Mapping):
        return problem(DeadLetterReason.PARSER_FAILED, f"the parser returned a {type(record).__name__}, not a mapping")
    for name in required:
        if record.get(name) is None:
            return problem(DeadLetterReason.MISSING_FIELD, f"required field {name} is missing or null")
    for name, operator_id in keys:
        value = record.get(name)
        if value is None:
            return problem(DeadLetterReason.NULL_KEY, f"key {name} of operator {operator_id} is missing or null")
        if value == "":
            return problem(DeadLetterReason.EMPTY_KEY, f"key {name} of operator {operator_id} is empty")
    return None


def _convert_per_value(
    values: list[Any], field: pa.Field, records: list[Mapping[str, Any] | None], errors: list[str | None]
) -> pa.Array:
    """A column some value of which does not convert: that value's line becomes a dead letter (its record dropped)."""
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            pa.array([value], type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            errors[i] = _wrong_type(field, value)
            records[i] = None
            values[i] = None
    return pa.array(values, type=field.type)


def _wrong_type(field: pa.Field, value: Any) -> str:
    return problem(DeadLetterReason.WRONG_TYPE, f"{field.name}: {str(value)[:100]} is not {field.type}")


def _python_values_of(arrow_type: pa.DataType) -> Callable[[Any], bool] | None:
    """Which Python values a parser may return for a field of this type; None: whatever pyarrow takes."""
    if pa.types.is_integer(arrow_type):
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if pa.types.is_floating(arrow_type):
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return lambda v: isinstance(v, str)
    if pa.types.is_boolean(arrow_type):
        return lambda v: isinstance(v, bool)
    if pa.types.is_timestamp(arrow_type):
        return lambda v: isinstance(v, datetime.datetime)
    return None
