"""The local S3 endpoint decides conditional writes atomically, as S3 does."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from barrierflow.tools.local_s3 import serialized


def _check_then_put_app() -> Callable[..., list[bytes]]:
    """A WSGI app with moto's shape: look for the key, pause, store it (412 if it was there)."""
    stored: dict[str, bytes] = {}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        key = environ["PATH_INFO"]
        exists = key in stored
        time.sleep(0.01)  # the window moto leaves between its check and its write
        if exists:
            start_response("412 Precondition Failed", [])
            return [b""]
        stored[key] = environ["wsgi.input"].read()
        start_response("200 OK", [])
        return [b"ok"]

    return app


def _winners(app: Callable[..., Any], writers: int = 8) -> int:
    start = threading.Barrier(writers)

    def put(i: int) -> str:
        statuses: list[str] = []
        body = f"writer-{i}".encode()
        environ = {"PATH_INFO": "/bucket/key", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
        start.wait()
        b"".join(app(environ, lambda status, headers: statuses.append(status)))
        return statuses[0]

    with ThreadPoolExecutor(writers) as pool:
        return [status.startswith("200") for status in pool.map(put, range(writers))].count(True)


def test_racing_conditional_puts_have_exactly_one_winner() -> None:
    assert _winners(_check_then_put_app()) > 1  # the race the endpoint exists to close
    assert _winners(serialized(_check_then_put_app())) == 1


def test_a_stalled_chunked_upload_holds_nobody_up(s3_bucket: str) -> None:
    """A client that starts a chunked PUT and stalls must not block the endpoint (its body is read outside the lock)."""
    import http.client
    import os
    import socket
    from urllib.parse import urlparse

    from barrierflow.storage import objects

    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    bucket = s3_bucket.removeprefix("s3://")
    stalled = socket.create_connection((endpoint.hostname, endpoint.port))
    try:
        stalled.sendall(
            f"PUT /{bucket}/stalled HTTP/1.1\r\nHost: {endpoint.netloc}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab".encode()
        )
        time.sleep(0.5)  # the server is now waiting for the rest of that body
        assert objects.put_if_absent(f"{s3_bucket}/other", b"x")  # answered all the same
        chunked = http.client.HTTPConnection(endpoint.hostname, endpoint.port, timeout=10)
        chunked.request("PUT", f"/{bucket}/chunked", body=iter([b"hello ", b"world"]), encode_chunked=True)
        assert chunked.getresponse().status == 200
        assert objects.read_bytes(f"{s3_bucket}/chunked") == b"hello world"
    finally:
        stalled.close()
