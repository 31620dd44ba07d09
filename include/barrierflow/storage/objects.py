"""Warehouse storage by URI scheme: put-if-absent, compare-and-swap, small documents.

Every location is a URI string, so nothing above this module assumes a local path:

- local paths and ``file://`` URIs: put-if-absent is an fsynced temporary file hard-linked to its name (the link fails
  if the name is taken); compare-and-swap replaces the file under an exclusive ``flock`` of a sidecar ``.<name>.lock``,
  its version being the inode, size and modification time of the file read;
- ``s3://bucket/key`` through boto3, configured by the standard AWS environment: put-if-absent is a PUT with
  ``If-None-Match: *`` and compare-and-swap a PUT with ``If-Match: <ETag>``; S3 answers 412 to the writer that lost.
  No check-then-put anywhere.

A conditional PUT whose answer is lost is retried (:func:`_s3_conditional_put`). Executors do their object-store I/O
through pyarrow (:func:`arrow_filesystem`); Delta commits go through delta-rs (same AWS environment).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from barrierflow.core.errors import ConfigurationError, StorageError

__all__ = [
    "join_uri", "local_path", "is_local", "normalize_uri", "put_if_absent", "read_bytes", "read_versioned",
    "compare_and_swap", "read_json", "write_json_if_absent", "exists", "remove_tree", "remove_document", "list_dir",
    "walk", "list_files", "open_input", "prune_empty_dirs", "sync_file", "StoredFile", "file_size", "arrow_filesystem",
]  # fmt: skip

_T = TypeVar("_T")
# Attempts of one conditional PUT whose outcome was unknown (transport error, 5xx).
_CONDITIONAL_ATTEMPTS = 5


def normalize_uri(uri: str) -> str:
    """An absolute URI: plain paths become absolute local paths; ``s3://bucket/key`` loses trailing slashes."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else uri
        return os.path.abspath(os.path.expanduser(path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ConfigurationError(f"URI {uri!r} names no bucket: expected s3://<bucket>[/<key prefix>]")
        return uri.rstrip("/") if parsed.path.strip("/") else f"s3://{parsed.netloc}"
    raise ConfigurationError(f"unsupported URI {uri!r}: allowed are local paths, file:// URIs and s3://<bucket>/<prefix>")


def is_local(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file")


def local_path(uri: str) -> str:
    """The local file-system path behind a local URI; a :class:`StorageError` for an object-store URI."""
    normalized = normalize_uri(uri)
    if not is_local(normalized):
        raise StorageError(f"{uri} is on an object store, and this operation needs a local path")
    return normalized


def join_uri(base: str, *parts: str) -> str:
    """Join URI segments with '/' regardless of the platform."""
    return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])


def exists(uri: str) -> bool:
    """Whether an object or a directory (on S3: any key under the prefix) is at ``uri``."""
    if is_local(uri):
        return os.path.exists(local_path(uri))
    bucket, key = _s3_location(uri)
    if key and _s3_call(uri, "read", lambda c: _s3_head(c, bucket, key)) is not None:
        return True
    prefix = f"{key}/" if key else ""
    listed = _s3_call(uri, "list", lambda c: c.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1))
    return bool(listed.get("KeyCount"))


def file_size(uri: str) -> int:
    if is_local(uri):
        return os.path.getsize(local_path(uri))
    bucket, key = _s3_location(uri)
    head = _s3_call(uri, "read", lambda c: _s3_head(c, bucket, key))
    if head is None:
        raise StorageError(f"cannot read {uri}: no such object")
    return int(head["ContentLength"])


def list_dir(uri: str) -> list[str]:
    """Names directly under a directory (on S3: a prefix), sorted; empty when there are none."""
    if is_local(uri):
        try:
            return sorted(os.listdir(local_path(uri)))
        except FileNotFoundError:
            return []
    found, directories = _s3_list(uri, one_level=True)
    return sorted(({item["Key"] for item in found} | set(directories)) - {""})


@dataclass(frozen=True)
class StoredFile:
    """A file (an object) found by :func:`walk` or :func:`list_files`: its path under the root, size, modification time."""

    path: str  # '/'-separated, relative to the listed root
    size: int
    modified_ns: int  # since the Unix epoch; S3 keeps whole seconds

    @property
    def modified_at(self) -> float:
        return self.modified_ns / 1e9

    @classmethod
    def of_s3(cls, item: dict[str, Any]) -> "StoredFile":
        """An entry of :func:`_s3_list`."""
        return cls(item["Key"], int(item["Size"]), int(item["LastModified"].timestamp()) * 10**9)


def list_files(uri: str) -> list[StoredFile]:
    """The files directly in a directory (on S3: the keys right under the prefix), sorted by name; none when absent."""
    if is_local(uri):
        try:
            entries = list(os.scandir(local_path(uri)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = [f for entry in entries if entry.is_file() and (f := _local_file(entry.path, entry.name)) is not None]
    else:
        found = [StoredFile.of_s3(item) for item in _s3_list(uri, one_level=True)[0] if item["Key"]]
    return sorted(found, key=lambda f: f.path)


def _local_file(path: str, name: str) -> StoredFile | None:
    """The file at ``path`` listed as ``name``; None when it was removed meanwhile."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return StoredFile(name, stat.st_size, stat.st_mtime_ns)


def open_input(uri: str) -> BinaryIO:
    """A buffered binary reader of the file at ``uri`` (seek, read, readline); executors read input with it."""
    if is_local(uri):
        return open(local_path(uri), "rb")
    filesystem, path = arrow_filesystem(uri)
    with _failing("read", uri):
        return io.BufferedReader(filesystem.open_input_file(path), buffer_size=8 * 1024 * 1024)


def walk(uri: str) -> Iterator[StoredFile]:
    """Every file under a directory (on S3: every key under the prefix but directory markers), at any depth."""
    if is_local(uri):
        root = local_path(uri)
        for directory, _, names in os.walk(root):
            for full in (os.path.join(directory, name) for name in names):
                if (found := _local_file(full, os.path.relpath(full, root).replace(os.sep, "/"))) is not None:
                    yield found
        return
    for item in _s3_list(uri, one_level=False)[0]:
        if item["Key"] and not item["Key"].endswith("/"):  # not a directory marker some S3 clients write
            yield StoredFile.of_s3(item)


def prune_empty_dirs(uri: str) -> None:
    """Remove the empty directories under (and including) a local directory; object stores have none."""
    if not is_local(uri):
        return
    root = local_path(uri)
    for directory, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # only succeeds when empty


def sync_file(uri: str) -> None:
    """Make a file written through :func:`arrow_filesystem` durable (an fsync locally; an S3 PUT already is)."""
    if is_local(uri):
        with _failing("sync", uri), open(local_path(uri), "rb") as fh:
            os.fsync(fh.fileno())


def read_bytes(uri: str) -> bytes | None:
    """The object at ``uri``, or None when there is none."""
    found = read_versioned(uri)
    return None if found is None else found[0]


def read_versioned(uri: str) -> tuple[bytes, str] | None:
    """The object at ``uri`` and its version (for :func:`compare_and_swap`), or None when there is none."""
    if is_local(uri):
        with _failing("read", uri), contextlib.suppress(FileNotFoundError, NotADirectoryError), open(local_path(uri), "rb") as fh:
            return fh.read(), _local_version(os.fstat(fh.fileno()))
        return None
    bucket, key = _s3_location(uri)

    def get(client: Any) -> tuple[bytes, str] | None:
        try:
            answer = client.get_object(Bucket=bucket, Key=key)
        except client.exceptions.NoSuchKey:
            return None
        return answer["Body"].read(), answer["ETag"]

    return _s3_call(uri, "read", get)


def read_json(uri: str) -> Any | None:
    """The JSON document at ``uri``, or None when it does not exist."""
    data = read_bytes(uri)
    with _failing("read", uri, ValueError):
        return None if data is None else json.loads(data)


def put_if_absent(uri: str, data: bytes) -> bool:
    """Atomically create ``uri`` with ``data`` unless it exists: True when this call created it, False when another writer did.

    Locally the content is durable before it is visible (fsynced, then hard-linked).
    """
    if not is_local(uri):
        return _s3_conditional_put(uri, data, {"IfNoneMatch": "*"}) is not None
    path = local_path(uri)
    directory = os.path.dirname(path)
    with _failing("write", uri):
        os.makedirs(directory, exist_ok=True)
        try:
            with _synced_copy(directory, data) as tmp:
                os.link(tmp, path)
        except FileExistsError:
            return False
        _fsync_dir(directory)
        return True


def compare_and_swap(uri: str, data: bytes, version: str) -> str | None:
    """Replace the object at ``uri`` with ``data`` if it is still at ``version`` (from :func:`read_versioned`).

    Returns the new version (always this call's write, applied once on ``version``), or None when another writer
    replaced or removed it since. None is conservative: after a lost acknowledgement this call's write may have landed
    and been replaced, which callers (the lease) treat as lost.
    """
    if not is_local(uri):
        return _s3_conditional_put(uri, data, {"IfMatch": version})
    path = local_path(uri)
    directory, name = os.path.split(path)
    if not os.path.exists(path):
        return None  # nothing to swap (and maybe no directory for the lock)
    # Every compare-and-swap of this name holds the same lock; put-if-absent needs none (it never replaces the file).
    with _failing("write", uri), open(os.path.join(directory, f".{name}.lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released by close
        try:
            current = _local_version(os.stat(path))
        except FileNotFoundError:
            return None
        if current != version:
            return None
        with _synced_copy(directory, data) as tmp:
            os.replace(tmp, path)
        _fsync_dir(directory)
        return _local_version(os.stat(path))


def write_json_if_absent(uri: str, document: Any) -> bool:
    return put_if_absent(uri, json.dumps(document, sort_keys=True, indent=1).encode())


def remove_document(uri: str) -> None:
    """Delete the document at ``uri``; a missing one is fine."""
    if not is_local(uri):
        bucket, key = _s3_location(uri)
        _s3_call(uri, "delete", lambda c: c.delete_object(Bucket=bucket, Key=key))
        return
    with _failing("delete", uri), contextlib.suppress(FileNotFoundError):
        os.unlink(local_path(uri))


def remove_tree(uri: str) -> None:
    """Delete a directory (on S3: every key under the prefix); a missing one is fine."""
    if is_local(uri):
        shutil.rmtree(local_path(uri), ignore_errors=True)
        return
    bucket, key = _s3_location(uri)
    keys = [{"Key": f"{key}/{item['Key']}" if key else item["Key"]} for item in _s3_list(uri, one_level=False)[0]]

    def delete(client: Any) -> None:
        for start in range(0, len(keys), 1000):  # at most 1000 keys a request
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys[start : start + 1000], "Quiet": True})

    _s3_call(uri, "delete", delete)


def arrow_filesystem(uri: str) -> "tuple[Any, str]":
    """The pyarrow file system and path behind ``uri``: how executor tasks write files."""
    from pyarrow import fs

    if is_local(uri):
        return fs.LocalFileSystem(), local_path(uri)
    bucket, key = _s3_location(uri)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {
        "region": _s3_region(),
        # Executors' reads and writes are idempotent (whole objects under unique names): retried here,
        # with backoff; bounded timeouts turn a stalled connection into a transient error.
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=10),
        "connect_timeout": 10,
        "request_timeout": 60,
        "allow_delayed_open": True,  # a small file written whole is one PUT, not a multipart upload's three
    }
    if endpoint:
        parsed = urlparse(endpoint)
        options.update(endpoint_override=parsed.netloc, scheme=parsed.scheme or "https")
    return fs.S3FileSystem(**options), f"{bucket}/{key}".rstrip("/")


@contextlib.contextmanager
def _failing(action: str, uri: str, errors: type[Exception] = OSError) -> Iterator[None]:
    """``errors`` raised in the block as a :class:`StorageError` saying what could not be done to ``uri``."""
    try:
        yield
    except errors as exc:
        raise StorageError(f"cannot {action} {uri}: {exc}") from exc


@contextlib.contextmanager
def _synced_copy(directory: str, data: bytes) -> Iterator[str]:
    """``data`` written and fsynced under a unique temporary name in ``directory``, removed after the block."""
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _local_version(stat: os.stat_result) -> str:
    # A replace always makes a new inode, and inode numbers are reused only after a delete: mtime and size tell them apart.
    return f"{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_size}"


def _fsync_dir(directory: str) -> None:
    # Makes the new directory entry itself durable (POSIX needs both fsyncs).
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- S3 helpers ----------------------------------------------------------------

_clients: dict[tuple[str | None, ...], Any] = {}
_clients_lock = threading.Lock()


def _s3_location(uri: str) -> tuple[str, str]:
    parsed = urlparse(normalize_uri(uri))
    return parsed.netloc, parsed.path.strip("/")


def _s3_region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _s3_client() -> Any:
    """A boto3 S3 client for the current AWS environment; one per distinct environment, shared by threads."""
    names = ("ENDPOINT_URL", "ENDPOINT_URL_S3", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN", "PROFILE")
    key = (*(os.environ.get(f"AWS_{name}") for name in names), _s3_region())
    with _clients_lock:
        if key not in _clients:
            import boto3
            from botocore.config import Config

            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            config = Config(
                region_name=_s3_region(),
                # Retried here, never by botocore: a conditional PUT must know whether an attempt
                # before the one answering 412 may have taken effect (_s3_conditional_put).
                retries={"mode": "standard", "total_max_attempts": 1},
                # A custom endpoint (a loopback test server, an on-premises store) takes path-style requests.
                s3={"addressing_style": "path"} if endpoint else {},
                connect_timeout=10,
                read_timeout=30,
            )
            _clients[key] = boto3.session.Session().client("s3", config=config)
        return _clients[key]


def _s3_list(uri: str, *, one_level: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects under the prefix ``uri`` (``Key`` relative to it) and, ``one_level``, the prefixes right under it."""
    bucket, key = _s3_location(uri)
    prefix = f"{key}/" if key else ""

    def listing(client: Any) -> tuple[list[dict[str, Any]], list[str]]:
        found, directories = list[dict[str, Any]](), list[str]()
        delimiter = {"Delimiter": "/"} if one_level else {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **delimiter):
            found += [{**item, "Key": item["Key"][len(prefix) :]} for item in page.get("Contents", [])]
            directories += [item["Prefix"][len(prefix) :].rstrip("/") for item in page.get("CommonPrefixes", [])]
        return found, directories

    return _s3_call(uri, "list", listing)


def _s3_head(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        return client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _retryable(exc: Exception) -> bool:
    """A transport error or a server-side error: the request may or may not have taken effect."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or exc.response.get("Error", {}).get("Code") in ("SlowDown", "RequestTimeout")
    return False


def _describe(exc: Exception) -> str:
    """An S3 client error, with what to set when it is missing configuration."""
    from botocore.exceptions import NoCredentialsError, NoRegionError

    if isinstance(exc, NoCredentialsError):
        return (
            f"{exc}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile or instance role); "
            "DAG tasks take them from the Airflow connection aws_default"
        )
    if isinstance(exc, NoRegionError):
        return f"{exc}: set AWS_REGION"
    return str(exc)


def _s3_call(uri: str, action: str, call: Callable[[Any], _T]) -> _T:
    """``call(client)``, retried on transport and server errors (it must be idempotent); errors wrapped."""
    from botocore.exceptions import BotoCoreError, ClientError

    for attempt in range(_CONDITIONAL_ATTEMPTS):
        try:
            return call(_s3_client())
        except (BotoCoreError, ClientError) as exc:
            if not _retryable(exc) or attempt + 1 == _CONDITIONAL_ATTEMPTS:
                raise StorageError(f"cannot {action} {uri}: {_describe(exc)}") from exc
            time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


def _s3_conditional_put(uri: str, data: bytes, condition: dict[str, str]) -> str | None:
    """A PUT under ``condition``: the new ETag when it took effect, None when another writer won.

    1. PUT with the condition. 412 means another writer won: None (also 404: the object to swap is gone). 409 (a
       conflicting conditional write in flight) wrote nothing: try again.
    2. A transport or server error leaves the outcome unknown: retry.
    3. A retry that meets 412 after an unknown outcome reads the object back: holding exactly these bytes, the lost
       attempt was this call's own write (the protocol's documents carry unique tokens).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _s3_location(uri)
    uncertain = False
    for attempt in range(_CONDITIONAL_ATTEMPTS):
        try:
            return str(_s3_client().put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"])  # 1
        except (BotoCoreError, ClientError) as exc:
            response: dict[str, Any] = exc.response if isinstance(exc, ClientError) else {}  # a transport error has none
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status == 412 or code == "PreconditionFailed":
                if uncertain:  # 3
                    found = read_versioned(uri)
                    return found[1] if found is not None and found[0] == data else None
                return None
            if code in ("NoSuchKey", "404") or status == 404:  # If-Match on an object removed since
                return None
            if status == 409 and attempt + 1 < _CONDITIONAL_ATTEMPTS:  # nothing written: try again
                time.sleep(0.1 * 2**attempt)
                continue
            if not _retryable(exc) or attempt + 1 == _CONDITIONAL_ATTEMPTS:
                raise StorageError(f"cannot write {uri}: {_describe(exc)}") from exc
        uncertain = True  # 2
        time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")
