"""The epoch lease: at most one process runs a pipeline's epochs, across machines.

One document (``<pipeline>/_lease``) written only with conditional writes (put-if-absent, compare-and-swap), locally as on
``s3://``. A holder proves it is alive by heart-beating, never by host name or pid. Protocol (the code marks the steps alike):

1. **Read** the document and its version. None: create it, held by us, put-if-absent; losing that race means reading again.
2. **Released** (the last holder let go): take it with compare-and-swap against the version read; losing means reading again.
3. **Held by another process**: expired when this process has seen the same version for ``ttl_s`` of its own monotonic clock (a:
   clock skew cannot matter), or when its heartbeat is older than ``2 x ttl_s`` by this machine's clock (b: clocks may differ by
   up to ``ttl_s``; spares the wait after a holder died long ago). Expired: take it as in 2; else
   :class:`~barrierflow.core.errors.EpochInProgressError` names the holder and when its lease would expire.
4. **Heartbeat**: a thread swaps in a new heartbeat every ``ttl_s / 4``; a failed swap means another process took the lease over.
5. **Check** before each barrier and vote: :meth:`EpochLease.check` raises :class:`~barrierflow.core.errors.LeaseLostError` once
   the lease is lost, or when no heartbeat succeeded for ``ttl_s`` (another process may judge it expired).
6. **Release**: swap in a released document (kept for the next holder's compare-and-swap); a lost lease stays with its new holder.

What a process that lost the lease may still have in flight is safe by the checkpoint protocol: the first durable vote wins, every
commit carries the fencing token."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from barrierflow.core.errors import ConfigurationError, EpochInProgressError, LeaseLostError, StorageError
from barrierflow.storage import objects

__all__ = ["EpochLease", "lease_ttl_s", "TTL_ENV", "DEFAULT_TTL_S"]

_log = logging.getLogger(__name__)

TTL_ENV = "BARRIERFLOW_LEASE_TTL_SECONDS"
DEFAULT_TTL_S = 30.0


def lease_ttl_s() -> float:
    """The lease's time to live: ``$BARRIERFLOW_LEASE_TTL_SECONDS`` or 30 s."""
    raw = os.environ.get(TTL_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_TTL_S
    with contextlib.suppress(ValueError):
        if 1.0 <= (value := float(raw)) <= 3600.0:
            return value
    raise ConfigurationError(f"{TTL_ENV}={raw!r} is invalid: expected seconds between 1 and 3600")


@dataclass
class EpochLease:
    """The lease at ``uri`` for ``pipeline``; ``clock`` and ``monotonic`` are replaceable in tests."""

    uri: str
    pipeline: str
    ttl_s: float = field(default_factory=lease_ttl_s)
    owner: str = field(default_factory=lambda: f"pid {os.getpid()} on {socket.gethostname()}")
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    heartbeat: bool = True

    def __post_init__(self) -> None:
        self._token: str | None = None
        self._version: str | None = None
        self._sequence, self._last_beat = 0, 0.0
        self._lost: str | None = None
        self._beat_error: str | None = None
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None
        # The holder's version this process saw first, and when (rule 3a).
        self._seen: tuple[str, float] | None = None

    @property
    def taken(self) -> bool:
        """Whether this process took the lease (and has not released it); it may have lost it since."""
        return self._token is not None

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lease, trying until ``wait_s`` has passed (a crashed holder expires within ``ttl_s``)."""
        deadline = self.monotonic() + wait_s
        while True:
            try:
                self.try_acquire()
                return
            except EpochInProgressError:
                if self.monotonic() >= deadline:
                    raise
            time.sleep(min(1.0, self.ttl_s / 8, max(0.05, deadline - self.monotonic())))

    def try_acquire(self) -> None:
        """One attempt (steps 1-3); :class:`EpochInProgressError` while another process holds it."""
        if self._token is not None:
            raise EpochInProgressError(f"this process already holds the epoch lease of {self.pipeline}")
        for _ in range(8):  # each pass follows a race lost to another contender
            found = objects.read_versioned(self.uri)  # 1
            token = uuid.uuid4().hex
            if found is None:
                if objects.put_if_absent(self.uri, self._document(token, 1)):
                    self._taken(token, 1, None)
                    return
                continue
            data, version = found
            holder = _parse(self.uri, data)
            if not holder.get("released") and not self._expired(holder, version):  # 3
                raise EpochInProgressError(self._busy_message(holder))
            sequence = int(holder.get("sequence", 0)) + 1
            swapped = objects.compare_and_swap(self.uri, self._document(token, sequence), version)  # 2, 3
            if swapped is not None:
                self._taken(token, sequence, swapped)
                return
        raise EpochInProgressError(f"could not take the epoch lease of {self.pipeline}: other processes kept racing for it")

    def _expired(self, holder: dict[str, Any], version: str) -> bool:
        now = self.monotonic()
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
        if now - self._seen[1] >= self.ttl_s:  # 3a
            return True
        ttl = float(holder.get("ttl_s", self.ttl_s))
        return self.clock() - float(holder.get("heartbeat_at", 0.0)) > 2 * max(ttl, self.ttl_s)  # 3b

    def _busy_message(self, holder: dict[str, Any]) -> str:
        seen_for = self.monotonic() - self._seen[1] if self._seen else 0.0
        ttl = float(holder.get("ttl_s", self.ttl_s))
        beat = datetime.fromtimestamp(float(holder.get("heartbeat_at", 0.0)), timezone.utc).isoformat(timespec="seconds")
        return (
            f"pipeline {self.pipeline} is running elsewhere ({holder.get('owner', 'an unknown holder')}, last "
            f"heartbeat at {beat}); epochs of one pipeline never run concurrently. If that process died, its "
            f"lease expires {max(0.0, ttl - seen_for):.0f} s after its last heartbeat is seen unchanged "
            f"(lease time to live {ttl:.0f} s, ${TTL_ENV})"
        )

    def _document(self, token: str, sequence: int, *, released: bool = False) -> bytes:
        doc = {
            "pipeline": self.pipeline, "token": token, "owner": self.owner, "sequence": sequence,
            "heartbeat_at": self.clock(), "ttl_s": self.ttl_s, "released": released,
        }  # fmt: skip
        return json.dumps(doc, sort_keys=True).encode()

    def _taken(self, token: str, sequence: int, version: str | None) -> None:
        if version is None:  # put-if-absent does not return the version: read it
            found = objects.read_versioned(self.uri)
            if found is None or _parse(self.uri, found[0]).get("token") != token:
                # Only another process's expiry judgement can take it this fast.
                raise EpochInProgressError(f"the epoch lease of {self.pipeline} was taken over as soon as it was taken")
            version = found[1]
        with self._lock:
            self._token, self._version, self._sequence = token, version, sequence
            self._lost, self._last_beat, self._seen = None, self.monotonic(), None
        if self.heartbeat:
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat_loop, name=f"lease-{self.pipeline}", daemon=True)
            self._thread.start()

    def beat(self) -> bool:
        """One heartbeat (step 4); False once the lease is lost."""
        with self._lock:
            if self._token is None or self._lost is not None or self._version is None:
                return False
            try:
                version = objects.compare_and_swap(self.uri, self._document(self._token, self._sequence + 1), self._version)
            except StorageError as exc:  # the store is unreachable: step 5 judges by the last success
                self._beat_error = str(exc)
                return True
            if version is None:
                current = objects.read_bytes(self.uri)
                holder = _parse(self.uri, current) if current else {}
                self._lost = f"taken over by {holder.get('owner', 'another process')}" if current else "its document was deleted"
                return False
            self._sequence += 1
            self._version, self._beat_error = version, None
            self._last_beat = self.monotonic()
            return True

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            if not self.beat():
                return

    def check(self) -> None:
        """Step 5: raise :class:`LeaseLostError` unless this process still surely holds the lease."""
        with self._lock:
            if self._token is None:
                raise LeaseLostError(f"this process does not hold the epoch lease of {self.pipeline}")
            if self._lost is not None:
                raise LeaseLostError(f"the epoch lease of {self.pipeline} was lost ({self._lost}); nothing more is committed")
            silent = self.monotonic() - self._last_beat
            if silent >= self.ttl_s:
                cause = f"; the last attempt failed: {self._beat_error}" if self._beat_error else ""
                raise LeaseLostError(
                    f"the epoch lease of {self.pipeline} had no successful heartbeat for {silent:.0f} s (time to "
                    f"live {self.ttl_s:.0f} s): another process may hold it; nothing more is committed{cause}"
                )

    def release(self) -> None:
        """Step 6: let go (stops the heartbeat); a lost lease is left to whoever holds it now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
            self._thread = None
        with self._lock:
            token, version, lost = self._token, self._version, self._lost
            self._token, self._version = None, None
            if token is None or version is None or lost is not None:
                return
            try:
                objects.compare_and_swap(self.uri, self._document(token, self._sequence + 1, released=True), version)
            except StorageError as exc:  # often called while another error unwinds: do not mask it
                _log.warning("could not release the epoch lease of %s (it expires by itself): %s", self.pipeline, exc)


def _parse(uri: str, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        # Not ours to interpret: never judged expired by content, only by time (rule 3a).
        return {"owner": f"an unreadable lease document at {uri}", "heartbeat_at": time.time()}
    return doc
