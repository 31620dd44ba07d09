"""Warehouse storage: URIs, put-if-absent objects and small JSON documents.

Every location is a URI string so that nothing above this module assumes a
local path. Only the local file system (``/path`` or ``file://``) is wired up
in this release; object stores come with their own issue and plug in here.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any
from urllib.parse import urlparse

from barrierflow.errors import ConfigurationError, StorageError

__all__ = [
    "join_uri",
    "local_path",
    "normalize_uri",
    "put_if_absent",
    "read_json",
    "write_json_if_absent",
    "exists",
    "remove_tree",
    "remove_document",
    "list_dir",
    "file_size",
    "arrow_filesystem",
]


def normalize_uri(uri: str) -> str:
    """Return an absolute URI; plain paths become absolute local paths."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else uri
        return os.path.abspath(os.path.expanduser(path))
    raise ConfigurationError(
        f"unsupported warehouse URI {uri!r}: this release supports local paths "
        "and file:// URIs"
    )


def local_path(uri: str) -> str:
    """The local file-system path behind a URI."""
    return normalize_uri(uri)


def join_uri(base: str, *parts: str) -> str:
    """Join URI segments with '/' regardless of the platform."""
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def exists(uri: str) -> bool:
    return os.path.exists(local_path(uri))


def arrow_filesystem(uri: str) -> "tuple[Any, str]":
    """The pyarrow file system and path behind ``uri``: how executor tasks write files."""
    from pyarrow import fs

    return fs.LocalFileSystem(), local_path(uri)


def file_size(uri: str) -> int:
    return os.path.getsize(local_path(uri))


def list_dir(uri: str) -> list[str]:
    """Names in a directory, sorted; empty when it does not exist."""
    path = local_path(uri)
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def put_if_absent(uri: str, data: bytes) -> bool:
    """Atomically create ``uri`` with ``data`` unless it already exists.

    Returns True when this call created the object, False when another writer
    got there first. The content is fully durable before it becomes visible:
    it is written and fsynced under a unique temporary name, then hard-linked
    to its final name, which fails if the name is taken.
    """
    path = local_path(uri)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, path)
            created = True
        except FileExistsError:
            created = False
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if created:
            _fsync_dir(directory)
        return created
    except OSError as exc:
        raise StorageError(f"cannot write {uri}: {exc}") from exc


def write_json_if_absent(uri: str, document: Any) -> bool:
    return put_if_absent(uri, json.dumps(document, sort_keys=True, indent=1).encode())


def read_json(uri: str) -> Any | None:
    """The JSON document at ``uri``, or None when it does not exist."""
    try:
        with open(local_path(uri), "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StorageError(f"cannot read {uri}: {exc}") from exc


def remove_document(uri: str) -> None:
    """Delete the document at ``uri``; a missing one is fine."""
    try:
        os.unlink(local_path(uri))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StorageError(f"cannot delete {uri}: {exc}") from exc


def remove_tree(uri: str) -> None:
    shutil.rmtree(local_path(uri), ignore_errors=True)


def _fsync_dir(directory: str) -> None:
    # Makes the new directory entry itself durable (POSIX needs both fsyncs).
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
