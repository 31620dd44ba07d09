"""barrierflow.storage.objects on the local file system: URIs, put-if-absent, JSON documents (both schemes: test_conditional_writes.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from barrierflow.core.errors import ConfigurationError, StorageError
from barrierflow.storage import objects


def _temp_files(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(".tmp-")]


def test_put_if_absent_first_writer_wins(tmp_path: Path) -> None:
    uri = str(tmp_path / "docs" / "epoch-1.json")
    assert objects.put_if_absent(uri, b"first") is True
    assert objects.put_if_absent(uri, b"second") is False
    assert Path(uri).read_bytes() == b"first"
    assert _temp_files(tmp_path / "docs") == []


def test_put_if_absent_creates_missing_directories(tmp_path: Path) -> None:
    uri = str(tmp_path / "a" / "b" / "c" / "obj")
    assert objects.put_if_absent(uri, b"x")
    assert Path(uri).read_bytes() == b"x"


def test_put_if_absent_accepts_file_uris(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/obj"
    assert objects.put_if_absent(uri, b"data")
    assert (tmp_path / "obj").read_bytes() == b"data"
    assert objects.exists(uri)


def test_put_if_absent_concurrent_writers_exactly_one_wins(tmp_path: Path) -> None:
    uri = str(tmp_path / "race" / "manifest.json")
    writers = 16
    start = threading.Barrier(writers)
    results: dict[int, bool] = {}
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            start.wait()
            results[i] = objects.put_if_absent(uri, f"writer-{i}".encode())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert errors == []
    assert len(results) == writers
    winners = [i for i, created in results.items() if created]
    assert len(winners) == 1
    assert Path(uri).read_bytes() == f"writer-{winners[0]}".encode()
    assert os.listdir(tmp_path / "race") == ["manifest.json"]


def test_put_if_absent_wraps_os_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot write"):
        objects.put_if_absent(str(blocker / "child"), b"x")


def test_write_json_if_absent_and_read_json_round_trip(tmp_path: Path) -> None:
    uri = str(tmp_path / "doc.json")
    doc = {"b": [1, 2, None], "a": {"nested": True}}
    assert objects.write_json_if_absent(uri, doc) is True
    assert objects.write_json_if_absent(uri, {"other": 1}) is False
    assert objects.read_json(uri) == doc


def test_read_json_missing_is_none(tmp_path: Path) -> None:
    assert objects.read_json(str(tmp_path / "nope.json")) is None
    assert objects.read_json(str(tmp_path / "no" / "dir" / "nope.json")) is None


def test_read_json_invalid_document_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(StorageError, match="cannot read"):
        objects.read_json(str(path))


@pytest.mark.parametrize("uri", ["gs://bucket/w", "abfss://c@acct.dfs.core.windows.net/w", "s3:///no-bucket"])
def test_normalize_uri_rejects_other_schemes(uri: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        objects.normalize_uri(uri)
    assert uri in str(info.value)


def test_s3_uris_are_normalized_but_a_warehouse_stays_local() -> None:
    assert objects.normalize_uri("s3://bucket/warehouse/") == "s3://bucket/warehouse"
    assert objects.normalize_uri("s3://bucket/") == "s3://bucket"
    assert not objects.is_local("s3://bucket/w") and objects.is_local("file:///w") and objects.is_local("w")
    with pytest.raises(StorageError, match="needs a local path"):
        objects.local_path("s3://bucket/w/x")


def test_normalize_uri_local_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert objects.normalize_uri("/abs/path") == "/abs/path"
    assert objects.normalize_uri("file:///abs/path") == "/abs/path"
    assert objects.normalize_uri("rel/dir") == str(tmp_path / "rel" / "dir")
    assert objects.normalize_uri("/a/b/../c") == "/a/c"
    assert objects.normalize_uri("~/x") == os.path.join(os.path.expanduser("~"), "x")


def test_join_uri_uses_slashes() -> None:
    assert objects.join_uri("file:///w/", "/pipe/", "state") == "file:///w/pipe/state"
    assert objects.join_uri("/w") == "/w"


def test_list_dir_sorted_and_missing_is_empty(tmp_path: Path) -> None:
    for name in ("b", "a", "c"):
        (tmp_path / name).write_text("")
    assert objects.list_dir(str(tmp_path)) == ["a", "b", "c"]
    assert objects.list_dir(str(tmp_path / "missing")) == []


def test_file_size_and_remove_tree(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f").write_bytes(b"12345")
    assert objects.file_size(str(tmp_path / "t" / "f")) == 5
    objects.remove_tree(str(tmp_path / "t"))
    assert not objects.exists(str(tmp_path / "t"))
    objects.remove_tree(str(tmp_path / "t"))  # removing again is fine


def test_put_if_absent_failed_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(objects.os, "fsync", no_space)
    with pytest.raises(StorageError, match="No space left"):
        objects.put_if_absent(str(tmp_path / "obj"), b"data")
    monkeypatch.undo()
    assert not (tmp_path / "obj").exists()
    assert _temp_files(tmp_path) == [], "temporary file left behind"


def test_missing_aws_credentials_are_named_with_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: signing fails first
    with pytest.raises(StorageError, match="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY .* aws_default"):
        objects.read_bytes("s3://bucket/doc")
    with pytest.raises(StorageError, match="set AWS_ACCESS_KEY_ID"):
        objects.put_if_absent("s3://bucket/doc", b"x")


def test_walk_lists_files_not_the_directory_markers_some_clients_write(s3_bucket: str) -> None:
    import boto3

    bucket = s3_bucket.removeprefix("s3://")
    client = boto3.session.Session().client("s3")
    for key, body in (("t/_staging/", b""), ("t/_staging/e/", b""), ("t/_staging/e/part-0.parquet", b"PAR1")):
        client.put_object(Bucket=bucket, Key=key, Body=body)
    assert [(f.path, f.size) for f in objects.walk(f"{s3_bucket}/t/_staging")] == [("e/part-0.parquet", 4)]
