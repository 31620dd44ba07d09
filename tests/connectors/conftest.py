"""Fixtures of the connector tests (no Spark anywhere): a landing directory, files in it, a FileSource over it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.connectors.file_source import FileSource


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    """An empty landing directory."""
    directory = tmp_path / "landing"
    directory.mkdir()
    return directory


@pytest.fixture
def write_file(landing: Path) -> Callable[..., Path]:
    """Write ``name`` in the landing directory from bytes, a str or a list of lines.

    A list of lines is joined with ``\\n`` and gets a trailing newline.
    ``mtime_ms`` pins the modification time (arrival cut-off tests).
    """

    def _write(name: str, content: bytes | str | list[str], mtime_ms: int | None = None) -> Path:
        if isinstance(content, list):
            content = "".join(f"{line}\n" for line in content)
        data = content.encode() if isinstance(content, str) else content
        path = landing / name
        path.write_bytes(data)
        if mtime_ms is not None:
            os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
        return path

    return _write


_LINE_SCHEMA = pa.schema([pa.field("value", pa.string())])


@pytest.fixture
def make_source(landing: Path) -> Callable[..., FileSource]:
    """A JSON Lines FileSource over the landing directory (parser-based)."""

    def _make(**overrides: Any) -> FileSource:
        kwargs: dict[str, Any] = {
            "source_id": "src",
            "path": str(landing),
            "format": "jsonl",
            "parser": lambda line: {"value": line},
            "parser_schema": _LINE_SCHEMA,
        }
        kwargs.update(overrides)
        return FileSource(**kwargs)

    return _make
