"""The epoch lease (barrierflow.checkpointing.lease) on both storage schemes: taken once, kept by heartbeats, expired by time."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from barrierflow.checkpointing.lease import TTL_ENV, EpochLease, lease_ttl_s
from barrierflow.core.errors import ConfigurationError, EpochInProgressError, LeaseLostError
from barrierflow.storage import objects

TTL_S = 0.6


def _lease(uri: str, owner: str, **kwargs: object) -> EpochLease:
    return EpochLease(uri, "pipe", ttl_s=TTL_S, owner=owner, **kwargs)  # type: ignore[arg-type]


def test_exactly_one_of_racing_processes_takes_the_lease(store_root: str) -> None:
    uri = objects.join_uri(store_root, "pipe", "_lease")
    contenders = [_lease(uri, f"contender {i}", heartbeat=False) for i in range(6)]
    start = threading.Barrier(len(contenders))

    def take(lease: EpochLease) -> bool:
        start.wait()
        try:
            lease.try_acquire()
            return True
        except EpochInProgressError:
            return False

    with ThreadPoolExecutor(max_workers=len(contenders)) as pool:
        won = list(pool.map(take, contenders))
    assert won.count(True) == 1
    winner = contenders[won.index(True)]
    assert json.loads(objects.read_bytes(uri) or b"{}")["owner"] == winner.owner
    winner.check()


def test_a_heart_beating_holder_keeps_the_lease_past_its_time_to_live(store_root: str) -> None:
    uri = objects.join_uri(store_root, "_lease")
    holder = _lease(uri, "holder")
    holder.acquire()
    contender = _lease(uri, "contender", heartbeat=False)
    try:
        deadline = time.monotonic() + 4 * TTL_S
        while time.monotonic() < deadline:
            with pytest.raises(EpochInProgressError, match="running elsewhere \\(holder, last heartbeat"):
                contender.try_acquire()
            time.sleep(TTL_S / 5)
        holder.check()  # still surely held
        assert json.loads(objects.read_bytes(uri) or b"{}")["sequence"] > 3  # it did beat
    finally:
        holder.release()
    contender.acquire()  # released: taken at once
    contender.release()


def test_a_holder_that_stops_heart_beating_is_replaced_after_the_expiry_and_learns_it_lost(store_root: str) -> None:
    uri = objects.join_uri(store_root, "_lease")
    crashed = _lease(uri, "crashed", heartbeat=False)  # as if killed: no more heartbeats
    crashed.acquire()
    successor = _lease(uri, "successor", heartbeat=False)
    started = time.monotonic()
    with pytest.raises(EpochInProgressError, match="expires"):
        successor.acquire(wait_s=TTL_S / 3)
    successor.acquire(wait_s=4 * TTL_S)
    assert time.monotonic() - started >= TTL_S  # never before the time to live has passed unchanged
    successor.check()
    # The old holder comes back (a long pause, not a crash): its next heartbeat fails, and it stops.
    assert crashed.beat() is False
    with pytest.raises(LeaseLostError, match="taken over by successor"):
        crashed.check()
    crashed.release()  # leaves the successor's lease alone
    assert json.loads(objects.read_bytes(uri) or b"{}")["owner"] == "successor"
    successor.release()


def test_a_heartbeat_older_than_twice_the_time_to_live_expires_at_once(store_root: str) -> None:
    uri = objects.join_uri(store_root, "_lease")
    _lease(uri, "long gone", heartbeat=False, clock=lambda: time.time() - 10 * TTL_S).acquire()
    started = time.monotonic()
    _lease(uri, "next", heartbeat=False).acquire(wait_s=0)
    assert time.monotonic() - started < TTL_S


def test_a_holder_without_a_successful_heartbeat_for_the_time_to_live_stops(tmp_path: object) -> None:
    now = [100.0]
    lease = EpochLease(str(tmp_path) + "/_lease", "pipe", ttl_s=30, owner="me", monotonic=lambda: now[0], heartbeat=False)
    lease.acquire()
    now[0] += 29
    lease.check()
    now[0] += 1
    with pytest.raises(LeaseLostError, match="no successful heartbeat for 30 s"):
        lease.check()
    assert lease.beat() is True  # the store answers again: held, and judged afresh
    lease.check()
    lease.release()
    with pytest.raises(LeaseLostError, match="does not hold"):
        lease.check()


def test_time_to_live_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TTL_ENV, raising=False)
    assert lease_ttl_s() == 30.0
    monkeypatch.setenv(TTL_ENV, "12.5")
    assert lease_ttl_s() == 12.5
    for bad in ("0", "soon", "7200"):
        monkeypatch.setenv(TTL_ENV, bad)
        with pytest.raises(ConfigurationError, match="between 1 and 3600"):
            lease_ttl_s()
