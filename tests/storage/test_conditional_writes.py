"""barrierflow.storage.objects's conditional writes on both schemes: a local directory and S3 (moto's server on loopback)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest

from barrierflow.storage import objects


def _race(writers: int, write: Callable[[int], Any]) -> list[Any]:
    """``write(i)`` for every writer at once (a barrier releases them together)."""
    start = threading.Barrier(writers)

    def go(i: int) -> Any:
        start.wait()
        return write(i)

    with ThreadPoolExecutor(max_workers=writers) as pool:
        return list(pool.map(go, range(writers)))


def test_put_if_absent_exactly_one_of_racing_writers_wins(store_root: str) -> None:
    uri = objects.join_uri(store_root, "epochs", "7", "manifest.json")
    results = _race(8, lambda i: objects.put_if_absent(uri, f"writer-{i}".encode()))
    assert results.count(True) == 1
    assert objects.read_bytes(uri) == f"writer-{results.index(True)}".encode()
    assert objects.list_dir(objects.join_uri(store_root, "epochs", "7")) == ["manifest.json"]


def test_compare_and_swap_replaces_only_the_version_read(store_root: str) -> None:
    uri = objects.join_uri(store_root, "doc")
    assert objects.read_versioned(uri) is None
    assert objects.compare_and_swap(uri, b"x", "any-version") is None  # nothing to swap
    assert objects.put_if_absent(uri, b"one")
    data, first = objects.read_versioned(uri)  # type: ignore[misc]
    assert data == b"one"
    second = objects.compare_and_swap(uri, b"two", first)
    assert second is not None and second != first
    assert objects.read_versioned(uri) == (b"two", second)
    assert objects.compare_and_swap(uri, b"three", first) is None  # stale version: refused, nothing written
    assert objects.read_bytes(uri) == b"two"


def test_compare_and_swap_exactly_one_of_racing_writers_wins(store_root: str) -> None:
    uri = objects.join_uri(store_root, "lease")
    objects.put_if_absent(uri, b"start")
    _, version = objects.read_versioned(uri)  # type: ignore[misc]
    results = _race(8, lambda i: objects.compare_and_swap(uri, f"writer-{i}".encode(), version))
    winners = [i for i, new in enumerate(results) if new is not None]
    assert len(winners) == 1
    assert objects.read_versioned(uri) == (f"writer-{winners[0]}".encode(), results[winners[0]])


def test_listing_existence_and_removal(store_root: str) -> None:
    for name in ("b/x", "a", "c/d/e"):
        assert objects.put_if_absent(objects.join_uri(store_root, "dir", name), b"12345")
    directory = objects.join_uri(store_root, "dir")
    assert objects.list_dir(directory) == ["a", "b", "c"]
    assert objects.list_dir(objects.join_uri(store_root, "missing")) == []
    assert objects.exists(directory) and objects.exists(objects.join_uri(directory, "c", "d"))
    assert not objects.exists(objects.join_uri(store_root, "missing"))
    assert objects.file_size(objects.join_uri(directory, "a")) == 5
    walked = sorted(objects.walk(directory), key=lambda f: f.path)
    assert [(f.path, f.size) for f in walked] == [("a", 5), ("b/x", 5), ("c/d/e", 5)]
    assert all(abs(f.modified_at - time.time()) < 300 for f in walked)
    assert list(objects.walk(objects.join_uri(store_root, "missing"))) == []
    objects.remove_document(objects.join_uri(directory, "a"))
    objects.remove_document(objects.join_uri(directory, "a"))  # again: fine
    assert objects.list_dir(directory) == ["b", "c"]
    objects.remove_tree(directory)
    assert not objects.exists(directory)
    assert objects.read_json(objects.join_uri(directory, "b", "x")) is None


def test_a_lost_acknowledgement_still_counts_as_this_writers_put(s3_bucket: str) -> None:
    """The PUT takes effect but its answer never arrives: the retry meets 412, and the bytes are ours."""
    from botocore.exceptions import ConnectionClosedError

    uri = f"{s3_bucket}/epochs/1/barrier.json"
    client = objects._s3_client()
    dropped: list[str] = []

    def drop_answer(**kwargs: Any) -> None:
        if not dropped:
            dropped.append(kwargs["model"].name)
            raise ConnectionClosedError(endpoint_url="lost on the way back")

    client.meta.events.register("after-call.s3.PutObject", drop_answer)
    try:
        assert objects.put_if_absent(uri, b"mine") is True
        assert dropped == ["PutObject"]
        assert objects.put_if_absent(uri, b"mine-again") is False  # a second write is still refused
        _, version = objects.read_versioned(uri)  # type: ignore[misc]
        dropped.clear()
        new = objects.compare_and_swap(uri, b"swapped", version)
        assert dropped == ["PutObject"] and new is not None
        assert objects.read_versioned(uri) == (b"swapped", new)
    finally:
        client.meta.events.unregister("after-call.s3.PutObject", drop_answer)


def test_an_unreachable_store_is_a_storage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from barrierflow.core.errors import StorageError
    from barrierflow.tools.devserver import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr(objects, "_CONDITIONAL_ATTEMPTS", 2)
    with pytest.raises(StorageError, match="cannot write s3://nowhere/doc"):
        objects.put_if_absent("s3://nowhere/doc", b"x")
    with pytest.raises(StorageError, match="cannot read s3://nowhere/doc"):
        objects.read_bytes("s3://nowhere/doc")
