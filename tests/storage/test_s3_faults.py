"""Conditional writes and the lease on S3 through a fault-injecting proxy: no wrong answer, whatever fails.

The proxy (``tests/s3_fault_proxy.py``) answers 5xx before or after
forwarding, drops connections after the write took effect (lost
acknowledgements), resets them before, and delays. A call may then end in a
:class:`StorageError` (its outcome unknown), but never in a wrong answer: a
put-if-absent that says it won did win, and a compare-and-swap that returns a
version applied exactly once, on top of the version it was given.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import boto3
import pytest

from barrierflow.checkpointing.lease import EpochLease
from barrierflow.core.errors import LeaseLostError, StorageError
from barrierflow.storage import objects
from s3_fault_proxy import FaultProxy
from s3_server import aws_env


@pytest.fixture
def faulty_bucket(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FaultProxy, Any]]:
    """A versioned bucket reached through the proxy (30% of requests faulty); also a direct client for checks."""
    direct = boto3.session.Session().client("s3", **{"endpoint_url": s3_server.endpoint, **_credentials()})
    bucket = f"faults-{time.time_ns()}"
    direct.create_bucket(Bucket=bucket)
    direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    proxy = FaultProxy(s3_server.endpoint, rate=0.3, seed=20261126)
    for name, value in aws_env(proxy.endpoint).items():
        monkeypatch.setenv(name, value)
    yield f"s3://{bucket}", proxy, direct
    proxy.stop()


def _credentials() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def _digest(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()[:16]


def test_racing_put_if_absent_never_answers_wrongly(faulty_bucket: tuple[str, FaultProxy, Any]) -> None:
    root, proxy, direct = faulty_bucket
    keys, writers = 12, 6
    outcomes: dict[int, list[Any]] = {k: [None] * writers for k in range(keys)}
    start = threading.Barrier(writers)

    def race(w: int) -> None:
        start.wait()
        for k in range(keys):
            try:
                outcomes[k][w] = objects.put_if_absent(f"{root}/doc-{k}", f"writer {w} key {k}".encode())
            except StorageError:
                outcomes[k][w] = "unknown"

    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(race, range(writers)))
    for k, results in outcomes.items():
        stored = direct.get_object(Bucket=root[5:], Key=f"doc-{k}")["Body"].read().decode()
        winner = int(stored.split()[1])
        assert results.count(True) <= 1, (k, results)  # never two winners
        assert results[winner] in (True, "unknown"), (k, results, stored)  # the one stored won, or could not know
        versions = direct.list_object_versions(Bucket=root[5:], Prefix=f"doc-{k}")["Versions"]
        assert [v["Key"] for v in versions].count(f"doc-{k}") == 1, (k, versions)  # nothing replaced the first
    assert sum(proxy.faults.values()) >= 10, proxy.faults
    print(f"faults injected {dict(proxy.faults)}, requests forwarded {proxy.forwarded}")


def test_compare_and_swap_under_faults_applies_each_success_once_on_its_base(
    faulty_bucket: tuple[str, FaultProxy, Any],
) -> None:
    root, proxy, direct = faulty_bucket
    uri = f"{root}/chain"
    assert objects.put_if_absent(uri, json.dumps({"writer": "root", "n": 0, "prev": ""}).encode())
    writers, per_writer = 4, 8
    believed: list[bytes] = []
    unknown = 0
    lock = threading.Lock()

    def swap(w: int) -> None:
        nonlocal unknown
        done = 0
        for attempt in range(200):
            if done == per_writer:
                return
            try:
                found = objects.read_versioned(uri)
                assert found is not None
                data = json.dumps({"writer": w, "n": attempt, "prev": _digest(found[0])}).encode()
                if objects.compare_and_swap(uri, data, found[1]) is not None:
                    with lock:
                        believed.append(data)
                    done += 1
            except StorageError:
                with lock:
                    unknown += 1

    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(swap, range(writers)))
    history = [
        direct.get_object(Bucket=root[5:], Key="chain", VersionId=v["VersionId"])["Body"].read()
        for v in direct.list_object_versions(Bucket=root[5:], Prefix="chain")["Versions"]
    ]
    # One chain: every write was based on the content it replaced, so no update was lost or applied twice.
    successors: dict[str, list[bytes]] = {}
    for data in history:
        successors.setdefault(json.loads(data)["prev"], []).append(data)
    assert all(len(next_) == 1 for next_ in successors.values()), "two writes were based on one version"
    assert len(set(history)) == len(history) == len(successors)  # the root is keyed by its empty predecessor
    assert set(successors) - {""} <= {_digest(data) for data in history}  # each based on a version that exists
    assert set(believed) <= set(history) and len(believed) == len(set(believed))
    assert len(believed) >= writers * per_writer - unknown
    assert sum(proxy.faults.values()) >= 10, proxy.faults
    print(f"faults injected {dict(proxy.faults)}, swaps believed {len(believed)}, history {len(history)}, unknown {unknown}")


def test_two_processes_never_both_hold_the_lease_under_faults(faulty_bucket: tuple[str, FaultProxy, Any]) -> None:
    root, proxy, _ = faulty_bucket
    uri = f"{root}/pipe/_lease"
    holder = EpochLease(uri, "pipe", ttl_s=4.0, owner="holder")
    contender = EpochLease(uri, "pipe", ttl_s=4.0, owner="contender", heartbeat=False)
    holder.acquire(wait_s=30)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not contender.taken:
            try:
                contender.try_acquire()
            except Exception:  # busy, or the store failed the attempt
                time.sleep(0.5)
        states = []
        for lease in (holder, contender):
            try:
                lease.check()
                states.append(True)
            except LeaseLostError:
                states.append(False)
        assert states != [True, True], "both believe they hold the lease"
        assert sum(proxy.faults.values()) >= 1, proxy.faults
        print(f"faults injected {dict(proxy.faults)}; holder holds: {states[0]}, contender holds: {states[1]}")
    finally:
        holder.release()
        contender.release()


def test_executor_writes_and_reads_through_the_proxy_survive_its_faults(faulty_bucket: tuple[str, FaultProxy, Any]) -> None:
    """pyarrow's S3 client (what executors use) retries the proxy's faults; chunked uploads pass through whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, proxy, direct = faulty_bucket
    table = pa.table({"k": list(range(1000)), "v": [str(i) for i in range(1000)]})
    for i in range(6):
        filesystem, path = objects.arrow_filesystem(f"{root}/t/part-{i}.parquet")
        filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        pq.write_table(table, path, filesystem=filesystem)
        assert pq.read_table(path, filesystem=filesystem).equals(table)
    assert len(direct.list_objects_v2(Bucket=root.removeprefix("s3://"), Prefix="t/part-")["Contents"]) == 6
    assert sum(proxy.faults.values()) > 0
