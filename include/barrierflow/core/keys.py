"""Key groups: every key hashes into one of a fixed number of key groups, the pipeline's max parallelism.

A key's group is ``pmod(xxhash64(key columns), key_groups)`` exactly as Spark's SQL function ``xxhash64`` computes it (seed 42,
the columns folded left to right, each hashed with the previous hash as seed, a null leaving it unchanged), so that state written
by any release of barrierflow, and any reader computing it with Spark, agrees on where a key lives. Per type, as Spark hashes it:

- boolean: the 4-byte int 1 or 0; int8, int16, int32, date: the 4-byte int;
- int64, timestamp (in microseconds): the 8-byte long;
- float32, float64: the IEEE bits as an int / long, -0.0 as 0.0, NaN canonical;
- decimal of precision 18 or less: the unscaled value as a long;
- string, binary: the bytes (a string's UTF-8).

Every type hashes vectorized (NumPy's wrapping uint64 arithmetic is XXH64's), strings and binaries per length (one of 32 bytes or
more by the ``xxhash`` library). Other types are refused when the pipeline is planned.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

__all__ = ["SEED", "hashable_key_type", "key_groups", "xxhash64"]

SEED = 42
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


_INT_TYPES = (pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32(), pa.date32())  # as Spark's int
_BYTES_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def hashable_key_type(type_: pa.DataType) -> bool:
    """Whether a key column of this type has a key group (see the module docstring)."""
    return bool(
        type_ in _INT_TYPES + _BYTES_TYPES + (pa.float32(), pa.float64())
        or pa.types.is_integer(type_)
        or pa.types.is_timestamp(type_)
        or pa.types.is_decimal(type_)
        and type_.precision <= 18
    )


def key_groups(keys: pa.Table, groups: int) -> pa.Array:
    """Each row's key group (int32): ``pmod(xxhash64(*keys.columns), groups)``."""
    hashes = np.full(keys.num_rows, SEED, dtype=np.uint64)
    for column in keys.columns:
        hashes = xxhash64(column, hashes)
    return pa.array((hashes.view(np.int64) % groups).astype(np.int32), pa.int32())


def xxhash64(column: "pa.Array | pa.ChunkedArray", seeds: np.ndarray) -> np.ndarray:
    """Spark's xxhash64 of each value of ``column``, each with its seed; a null keeps its seed."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    type_ = column.type
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if type_ in _BYTES_TYPES:
        hashed = _hash_bytes(column, seeds)
    elif type_ in _INT_TYPES:
        hashed = _hash_fixed(_filled(column.cast(pa.int32()), np.int32), seeds)
    elif pa.types.is_integer(type_):
        hashed = _hash_fixed(_filled(column.cast(pa.int64()), np.int64), seeds)
    elif pa.types.is_timestamp(type_):
        micros = column.cast(pa.timestamp("us", tz=type_.tz)).cast(pa.int64())
        hashed = _hash_fixed(_filled(micros, np.int64), seeds)
    elif pa.types.is_float32(type_) or pa.types.is_float64(type_):
        wide = pa.types.is_float64(type_)
        values = _filled(column, np.float64 if wide else np.float32)
        values = np.where(values == 0, values.dtype.type(0.0), values)  # -0.0 hashes as 0.0
        bits = np.where(np.isnan(values), 0x7FF8000000000000 if wide else 0x7FC00000, values.view(np.int64 if wide else np.int32))
        hashed = _hash_fixed(bits.astype(np.int64 if wide else np.int32), seeds)
    elif pa.types.is_decimal(type_) and type_.precision <= 18:
        unscaled = [0 if v is None else int(v.scaleb(type_.scale)) for v in column.to_pylist()]
        hashed = _hash_fixed(np.array(unscaled, dtype=np.int64), seeds)
    else:
        raise TypeError(
            f"a key column of type {type_} has no key group; key columns may be booleans, integers, floats, strings, "
            "binaries, dates, timestamps or decimals of precision 18 at most"
        )
    return np.where(valid, hashed, seeds)


def _filled(column: pa.Array, dtype: Any) -> np.ndarray:
    """The values as a NumPy array (nulls as zero: their hash is discarded)."""
    return np.asarray(pc.fill_null(column, pa.scalar(0, column.type) if not pa.types.is_floating(column.type) else 0.0)
                      .to_numpy(zero_copy_only=False), dtype=dtype)  # fmt: skip


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _xxh64(data: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of each row of ``data`` (uint8, rows of one length under 32 bytes), each with its seed: 8-, 4-, 1-byte steps."""
    size = data.shape[1]
    with np.errstate(over="ignore"):
        h = seeds + _P5 + np.uint64(size)
        for at in range(0, size - 7, 8):
            h ^= _rotl(np.ascontiguousarray(data[:, at : at + 8]).view("<u8").ravel() * _P2, 31) * _P1
            h = _rotl(h, 27) * _P1 + _P4
        for at in range(size // 8 * 8, size - 3, 4):  # at most once
            h ^= np.ascontiguousarray(data[:, at : at + 4]).view("<u4").ravel().astype(np.uint64) * _P1
            h = _rotl(h, 23) * _P2 + _P3
        for at in range(size // 4 * 4, size):
            h ^= data[:, at].astype(np.uint64) * _P5
            h = _rotl(h, 11) * _P1
        h = (h ^ (h >> np.uint64(33))) * _P2
        h = (h ^ (h >> np.uint64(29))) * _P3
        return h ^ (h >> np.uint64(32))


def _hash_fixed(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of 4- or 8-byte values, their little-endian bytes (Spark's ``hashInt`` / ``hashLong``)."""
    return _xxh64(values.astype(values.dtype.newbyteorder("<")).view(np.uint8).reshape(len(values), values.dtype.itemsize), seeds)


def _hash_bytes(column: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of each value's bytes: vectorised per length under 32 bytes, else by the ``xxhash`` library (a null's: discarded)."""
    _, offsets_buffer, data_buffer = column.buffers()
    wide = column.type in (pa.large_string(), pa.large_binary())
    offsets = np.frombuffer(offsets_buffer, np.int64 if wide else np.int32)[column.offset : column.offset + len(column) + 1]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1].astype(np.int64), np.diff(offsets)
    hashed = np.empty(len(column), np.uint64)
    order = np.argsort(lengths, kind="stable")
    sizes, firsts = np.unique(lengths[order], return_index=True)
    for size, rows in zip(sizes.tolist(), np.split(order, firsts[1:])):
        if size < 32:
            hashed[rows] = _xxh64(data[starts[rows, None] + np.arange(size)], seeds[rows])
        else:
            hashed[rows] = [xxhash.xxh64_intdigest(data[starts[r] : starts[r] + size].tobytes(), int(seeds[r])) for r in rows]
    return hashed
