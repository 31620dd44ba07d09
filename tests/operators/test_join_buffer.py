"""A buffered join record reads back as it was written, for every type a join side may carry (random records, fixed seed)."""

from __future__ import annotations

import random
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from barrierflow.operators.join_buffer import record_json, record_values

I64 = np.iinfo(np.int64)
DAY_MS = 86_400_000
_FLOATS = [
    float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 5e-324, -1.7976931348623157e308, 1e-3, 9999999.999, 1e7, 1e23, 0.1,
]  # fmt: skip
_CHARS = ['"', "\\", "/", "\x00", "\x01", "\x08", "\t", "\n", "\x0c", "\r", "\x1f", "\x7f", "é", "\u2028", "\ufb01", "😀", "{", ":"]  # fmt: skip
_TYPES = {
    "s": pa.string(), "ls": pa.large_string(), "sv": pa.string_view(), "i8": pa.int8(), "i16": pa.int16(), "i32": pa.int32(),
    "i64": pa.int64(), "u8": pa.uint8(), "u16": pa.uint16(), "u32": pa.uint32(), "u64": pa.uint64(), "f16": pa.float16(),
    "f32": pa.float32(), "f64": pa.float64(), "dec": pa.decimal128(10, 2), "dec38": pa.decimal128(38, 18),
    "tiny": pa.decimal128(18, 8), "whole": pa.decimal128(5, 0), "dec256": pa.decimal256(76, 20), "flag": pa.bool_(),
    "day": pa.date32(), "day64": pa.date64(), "utc": pa.timestamp("us", tz="UTC"), "paris": pa.timestamp("us", tz="Europe/Paris"),
    "local": pa.timestamp("us"), "secs": pa.timestamp("s"), "ms": pa.timestamp("ms", tz="UTC"), "ns": pa.timestamp("ns"),
    "raw": pa.binary(), "lraw": pa.large_binary(), "fixed": pa.binary(3), "nothing": pa.null(),
    "words": pa.dictionary(pa.int32(), pa.string()), "ints": pa.list_(pa.int32()), "texts": pa.large_list(pa.string()),
    "pair": pa.list_(pa.float64(), 2), "times": pa.list_(pa.timestamp("us", tz="UTC")),
    "point": pa.struct([("x", pa.int64()), ("at", pa.timestamp("us")), ("inner", pa.struct([("d", pa.decimal128(9, 3))]))]),
    "tags": pa.map_(pa.string(), pa.float64()), "by_int": pa.map_(pa.int32(), pa.date32()),
    "by_time": pa.map_(pa.timestamp("us", tz="UTC"), pa.decimal128(10, 2)), "by_float": pa.map_(pa.float32(), pa.binary()),
    "by_flag": pa.map_(pa.bool_(), pa.string()), "by_dec": pa.map_(pa.decimal128(10, 2), pa.int8()),
    "by_raw": pa.map_(pa.binary(), pa.int64()), "by_day": pa.map_(pa.date32(), pa.list_(pa.string())),
    "by_point": pa.map_(pa.struct([("x", pa.int32()), ("t", pa.timestamp("us"))]), pa.string()),
    "nested": pa.list_(pa.map_(pa.string(), pa.struct([("v", pa.float32()), ("b", pa.binary())]))),
    "nothing_inside": pa.struct([]), 'we"ird\\ näme\n': pa.string(),
}  # fmt: skip


def _storage(type_: pa.DataType) -> pa.DataType:
    """``type_`` with times and dates as their integers (Python's datetime holds only years 1 to 9999)."""
    if pa.types.is_timestamp(type_) or pa.types.is_date64(type_):
        return pa.int64()
    if pa.types.is_date32(type_):
        return pa.int32()
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_storage(f.type)) for f in type_])
    if pa.types.is_map(type_):
        return pa.map_(_storage(type_.key_type), _storage(type_.item_type))
    if pa.types.is_fixed_size_list(type_):
        return pa.list_(_storage(type_.value_type), type_.list_size)
    if pa.types.is_large_list(type_):
        return pa.large_list(_storage(type_.value_type))
    if pa.types.is_list(type_):
        return pa.list_(_storage(type_.value_type))
    return type_


def _char(rng: random.Random) -> str:
    """Any character but a surrogate (Arrow's strings are UTF-8)."""
    return chr(rng.choice([rng.randrange(32, 0xD800), rng.randrange(0xE000, 0x110000)]))


def _value(rng: random.Random, type_: pa.DataType, nulls: bool = True) -> Any:
    """A random value of ``type_`` in its storage form, null one time in six."""
    if pa.types.is_null(type_) or (nulls and rng.random() < 1 / 6):
        return None
    if pa.types.is_dictionary(type_):
        return rng.choice(["a", "b", "é\n"])
    if pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_string_view(type_):
        return "".join(rng.choice(_CHARS) if rng.random() < 0.5 else _char(rng) for _ in range(rng.randrange(8)))
    if pa.types.is_boolean(type_):
        return rng.random() < 0.5
    if pa.types.is_integer(type_):
        info = np.iinfo(type_.to_pandas_dtype())
        return rng.choice([int(info.min), int(info.max), 0, rng.randint(int(info.min), int(info.max))])
    if pa.types.is_floating(type_):
        bits = rng.getrandbits(64)
        value = rng.choice([*_FLOATS, struct.unpack("<d", bits.to_bytes(8, "little"))[0], rng.uniform(-1e9, 1e9)])
        narrow = {16: np.float16, 32: np.float32}.get(type_.bit_width)
        with np.errstate(over="ignore"):
            return value if narrow is None else float(np.array(value).astype(narrow))
    if pa.types.is_decimal(type_):
        digits = rng.randrange(type_.precision + 1)
        return Decimal(rng.choice([-1, 1]) * rng.randrange(10**digits)).scaleb(-type_.scale)
    if pa.types.is_date32(type_):
        return rng.choice([rng.randint(-(2**31), 2**31 - 1), rng.randint(-800_000, 3_000_000), 0])
    if pa.types.is_date64(type_):
        return rng.randint(-(2**31), 2**31 - 1) * DAY_MS
    if pa.types.is_timestamp(type_):  # any microsecond but a long's least (NumPy's NaT); nanoseconds of whole microseconds
        us = rng.choice([int(I64.max), int(I64.min) + 1, 253402300800 * 10**6, rng.randint(int(I64.min) + 1, int(I64.max))])
        us = rng.choice([us, rng.randint(-(10**16), 10**16)])
        scale = {"s": 10**6, "ms": 1000, "us": 1, "ns": 1000}[type_.unit]
        whole = us // scale if us >= 0 else -(-us // scale)
        return whole * 1000 if type_.unit == "ns" else whole
    if pa.types.is_fixed_size_binary(type_):
        return rng.randbytes(type_.byte_width)
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return rng.randbytes(rng.randrange(6))
    if pa.types.is_struct(type_):
        return {f.name: _value(rng, f.type) for f in type_}
    if pa.types.is_map(type_):
        keys = {repr(k): k for k in (_value(rng, type_.key_type, nulls=False) for _ in range(rng.randrange(4)))}
        return [(k, _value(rng, type_.item_type)) for k in keys.values()]
    size = type_.list_size if pa.types.is_fixed_size_list(type_) else rng.randrange(4)
    return [_value(rng, type_.value_type) for _ in range(size)]


def _canonical(value: Any) -> Any:
    """A value to compare exactly: a float by its text (NaN equal to NaN, -0.0 unequal to 0.0)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def test_every_record_reads_back_as_it_was_written() -> None:
    rng = random.Random(54)
    fields = [pa.field(name, type_) for name, type_ in _TYPES.items()]
    columns = [pa.array([_value(rng, f.type) for _ in range(400)], _storage(f.type)).cast(f.type) for f in fields]
    records = pa.Table.from_arrays(columns, schema=pa.schema(fields))
    records = pa.concat_tables([records, pa.Table.from_pylist([{}], schema=records.schema)])  # and a row of nulls only
    for rows in (records, records.slice(7, 50)):  # slices too: arrays not starting at offset 0
        written = record_json(rows, fields)
        assert written.type == pa.string() and written.null_count == 0
        read = record_values(written, fields)
        assert read.schema == pa.schema([f.with_nullable(True) for f in fields])
        for field in fields:
            expected, found = (t[field.name].cast(_storage(field.type)).to_pylist() for t in (rows, read))
            assert _canonical(found) == _canonical(expected), field.name
