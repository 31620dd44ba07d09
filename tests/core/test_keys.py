"""The vectorised XXH64 of ``core.keys`` against the ``xxhash`` library (Spark's own check: tests/integration/test_key_groups.py)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from barrierflow.core.keys import xxhash64


@pytest.mark.parametrize("type_", [pa.binary(), pa.large_binary(), pa.string(), pa.large_string()])
def test_bytes_of_every_length_hash_as_xxh64_with_each_rows_seed(type_: pa.DataType) -> None:
    rng = random.Random(3)
    raw = [None if rng.random() < 0.1 else bytes(rng.randrange(256) for _ in range(rng.randrange(70))) for _ in range(2000)]
    values = raw if pa.types.is_binary(type_) or pa.types.is_large_binary(type_) else [
        None if v is None else v.decode("latin-1") for v in raw
    ]  # fmt: skip
    seeds = np.array([rng.randrange(2**64) for _ in values], np.uint64)
    column = pa.array(values, type_).slice(5)  # an offset into the buffers
    expected = [
        int(seed) if v is None else xxhash.xxh64_intdigest(v.encode() if isinstance(v, str) else v, int(seed))
        for v, seed in zip(values[5:], seeds[5:])
    ]  # fmt: skip
    assert xxhash64(column, seeds[5:]).tolist() == expected


def test_fixed_width_values_hash_as_xxh64_of_their_little_endian_bytes() -> None:
    values = np.array([0, -1, 2**63 - 1, -(2**63), 123456789], np.int64)
    seeds = np.array([42, 0, 7, 2**64 - 1, 42], np.uint64)
    assert xxhash64(pa.array(values), seeds).tolist() == [
        xxhash.xxh64_intdigest(int(v).to_bytes(8, "little", signed=True), int(s)) for v, s in zip(values, seeds)
    ]
    small = pa.array(values.astype(np.int32))
    assert xxhash64(small, seeds).tolist() == [
        xxhash.xxh64_intdigest(int(v).to_bytes(4, "little", signed=True), int(s)) for v, s in zip(values.astype(np.int32), seeds)
    ]


@pytest.mark.parametrize("type_", [pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.binary()])
def test_an_empty_column_hashes_to_nothing(type_: pa.DataType) -> None:
    assert xxhash64(pa.array([], type_), np.zeros(0, np.uint64)).tolist() == []
