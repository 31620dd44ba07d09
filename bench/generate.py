"""Deterministic generator of the benchmark event stream (JSON Lines files).

Each line is ``{"event_id": "e<n>", "sensor_id": "s<key>", "ts": <millis>,
"temperature": <2-decimal float>}``. Lines are built column-wise with Arrow
compute kernels and written straight from the resulting string buffer, so
millions of lines take seconds. Every file is written under a dot-prefixed
temporary name and renamed into place, so a reader listing the directory
never sees a partial file.

CLI: ``python bench/generate.py OUT_DIR --events N --keys K --files F --seed S``
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["generate", "generate_incremental", "event_file_name"]

BASE_TS_MS = 1_700_000_000_000
EVENT_INTERVAL_MS = 10
TS_JITTER_MS = 500
TEMPERATURE_MEAN = 20.0
TEMPERATURE_STDDEV = 8.0
LINES_PER_WRITE = 500_000


def event_file_name(file_number: int) -> str:
    """Name of the ``file_number``-th (1-based) event file."""
    return f"events-{file_number:06d}.jsonl"


def _as_strings(values: np.ndarray) -> pa.Array:
    """Decimal string representation of an integer numpy array."""
    return pc.cast(pa.array(values), pa.string())


def _temperature_strings(centi_degrees: np.ndarray) -> pa.Array:
    """Render hundredths of a degree as decimal strings with exactly two decimals."""
    sign = pa.array(np.where(centi_degrees < 0, "-", ""))
    magnitude = np.abs(centi_degrees)
    whole = _as_strings(magnitude // 100)
    hundredths = pc.utf8_lpad(_as_strings(magnitude % 100), width=2, padding="0")
    return pc.binary_join_element_wise(sign, whole, ".", hundredths, "")


def _json_lines(event_ids: np.ndarray, key_ids: np.ndarray, ts: np.ndarray, centi_degrees: np.ndarray) -> pa.Array:
    """One newline-terminated JSON object per event, as an Arrow string array."""
    return pc.binary_join_element_wise(
        '{"event_id": "e',
        _as_strings(event_ids),
        '", "sensor_id": "s',
        _as_strings(key_ids),
        '", "ts": ',
        _as_strings(ts),
        ', "temperature": ',
        _temperature_strings(centi_degrees),
        "}\n",
        "",
    )


def _string_buffer(lines: pa.Array) -> memoryview:
    """The concatenated bytes of a null-free string array, without copying."""
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]]


def _write_event_file(path: Path, first_event_id: int, key_ids: np.ndarray, rng: np.random.Generator) -> None:
    """Write one event file atomically; events get consecutive ids and timestamps."""
    count = len(key_ids)
    event_ids = np.arange(first_event_id, first_event_id + count, dtype=np.int64)
    jitter = rng.integers(-TS_JITTER_MS, TS_JITTER_MS + 1, size=count)
    ts = BASE_TS_MS + event_ids * EVENT_INTERVAL_MS + jitter
    centi_degrees = np.rint(rng.normal(TEMPERATURE_MEAN, TEMPERATURE_STDDEV, size=count) * 100).astype(np.int64)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        for start in range(0, count, LINES_PER_WRITE):
            chunk = slice(start, start + LINES_PER_WRITE)
            out.write(_string_buffer(_json_lines(event_ids[chunk], key_ids[chunk], ts[chunk], centi_degrees[chunk])))
    os.replace(tmp, path)


def _split_sizes(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` sizes differing by at most one."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def generate(
    out_dir: str | Path, events: int = 5_000_000, keys: int = 100_000, files: int = 20, seed: int = 42
) -> list[Path]:
    """Write ``events`` events over ``keys`` uniformly random keys into ``files`` files.

    Timestamps increase with the global event index (plus jitter), so they
    increase roughly with the file index. Returns the written paths in order.
    """
    if events < 1 or keys < 1 or files < 1:
        raise ValueError("events, keys and files must all be positive")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    first_event_id = 0
    for number, size in enumerate(_split_sizes(events, files), start=1):
        path = out / event_file_name(number)
        _write_event_file(path, first_event_id, rng.integers(0, keys, size=size), rng)
        paths.append(path)
        first_event_id += size
    return paths


def generate_incremental(
    out_dir: str | Path, keys: int = 1_000_000, changed_fraction: float = 0.01, seed: int = 42
) -> list[Path]:
    """Write the incremental-checkpoint scenario: two files.

    File 1 holds exactly one event for each of ``keys`` keys (in random order);
    file 2 holds one event for each of ``round(keys * changed_fraction)``
    distinct keys chosen at random. Returns the two paths.
    """
    changed = round(keys * changed_fraction)
    if keys < 1 or not 1 <= changed <= keys:
        raise ValueError("need keys >= 1 and 1 <= keys * changed_fraction <= keys")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    first, second = out / event_file_name(1), out / event_file_name(2)
    _write_event_file(first, 0, rng.permutation(keys), rng)
    _write_event_file(second, keys, rng.choice(keys, size=changed, replace=False), rng)
    return [first, second]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write events-NNNNNN.jsonl files into")
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    started = time.perf_counter()
    paths = generate(args.out_dir, args.events, args.keys, args.files, args.seed)
    elapsed = time.perf_counter() - started
    size_mb = sum(p.stat().st_size for p in paths) / 1e6
    print(f"wrote {args.events:,} events over {args.keys:,} keys into {len(paths)} files", end=" ")
    print(f"({size_mb:,.1f} MB) in {elapsed:.1f}s")


if __name__ == "__main__":
    main()
