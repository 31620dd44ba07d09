"""The engine's columns: what barrierflow adds to records and state rows, and how arrival positions are packed.

User columns never start with ``_``; every engine column does:

- ``_seq``: a record's arrival position, one long packing (source index, file index within the epoch, line): :func:`arrival_seq`.
  A flat_map's outputs add sub-positions ``_seq_1``, ``_seq_2``... (their index among their input's outputs); together, a unique
  position derived from the records alone, so order never depends on parallelism.
- ``_key_group``: a state row's key group (:mod:`barrierflow.core.keys`).
- ``_epoch``: the epoch that wrote a row (every table).
- ``_deleted``, ``_updated_at_ms``: a state row's tombstone and write time.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import pyarrow as pa

__all__ = [
    "SEQ", "KEY_GROUP", "EPOCH", "DELETED", "UPDATED_AT", "FILE_BITS", "LINE_BITS",
    "arrival_seq", "file_position", "seq_parts", "position_columns", "user_columns", "is_engine_column",
]  # fmt: skip

SEQ = "_seq"
KEY_GROUP = "_key_group"
EPOCH = "_epoch"
DELETED = "_deleted"
UPDATED_AT = "_updated_at_ms"

FILE_BITS, LINE_BITS = 20, 36  # ``_seq``: source (7 bits), file (20 bits), line (36 bits)
_SUB_POSITION = re.compile(r"^_seq_([0-9]+)$")


def file_position(source_index: int, file_index: int) -> int:
    """A file's position among all sources' files of an epoch: the top bits of its records' ``_seq``."""
    return source_index << FILE_BITS | file_index


def arrival_seq(source_index: int, file_index: int, lines: "np.ndarray | pa.Array") -> pa.Array:
    """``_seq`` of the records at ``lines`` (line numbers, from 1) of one file."""
    base = file_position(source_index, file_index) << LINE_BITS
    return pa.array(np.asarray(lines, dtype=np.int64) + base, pa.int64())


def seq_parts(seq: "pa.Array | pa.ChunkedArray") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of :func:`arrival_seq`: each position's source index, file position (:func:`file_position`) and line."""
    values = np.asarray(seq.to_numpy(zero_copy_only=False), dtype=np.int64)
    return values >> (FILE_BITS + LINE_BITS), values >> LINE_BITS, values & ((1 << LINE_BITS) - 1)


def position_columns(columns: Sequence[str]) -> list[str]:
    """The arrival-position columns among ``columns``, most significant first: ``_seq``, ``_seq_1``, ..."""
    subs = sorted((int(m.group(1)), c) for c in columns if (m := _SUB_POSITION.match(c)))
    return [SEQ, *[c for _, c in subs]] if SEQ in columns else [c for _, c in subs]


def is_engine_column(name: str) -> bool:
    return name.startswith("_")


def user_columns(columns: Sequence[str]) -> list[str]:
    """Columns that belong to the records (not the engine's ``_`` columns)."""
    return [c for c in columns if not is_engine_column(c)]
