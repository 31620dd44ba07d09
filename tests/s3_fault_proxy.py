"""A fault-injecting HTTP proxy on loopback, in front of the test S3 server.

Each request is forwarded to the server unless the proxy's seeded random
choice injects a fault:

- ``error_before``: answer 503 without forwarding (nothing happened);
- ``error_after``: forward, then answer 500 instead of the server's answer
  (the request took effect, its acknowledgement says otherwise);
- ``drop_after``: forward, then close the connection without answering (a
  lost acknowledgement);
- ``reset_before``: close the connection without forwarding;
- ``delay``: wait up to ``max_delay_s``, then forward.

``faults`` counts what was injected, by kind; ``forwarded`` counts requests
that reached the server; ``retries`` counts requests that repeat one
(same method, path and query) a fault other than a delay had failed: what
the clients' retry layers and the protocol's own re-tries sent again.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

__all__ = ["FaultProxy", "FAULT_KINDS"]

FAULT_KINDS = ("error_before", "error_after", "drop_after", "reset_before", "delay")


class FaultProxy:
    """Forward to ``upstream`` (``http://host:port``), injecting each fault kind with probability ``rate / 5``."""

    def __init__(self, upstream: str, rate: float, seed: int, max_delay_s: float = 0.2) -> None:
        target = urlparse(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.rate = rate
        self.max_delay_s = max_delay_s
        self.faults: Counter[str] = Counter()
        self.forwarded = 0
        self.retries = 0
        self._failed: set[tuple[str, str]] = set()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                """The request's body, de-chunked (pyarrow's S3 client sends some uploads chunked)."""
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()  # the CRLF after each chunk
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                fault = proxy._choose((self.command, self.path))
                if fault == "reset_before":
                    self._abort()
                    return
                if fault == "error_before":
                    self._answer(503, b"<Error><Code>ServiceUnavailable</Code></Error>")
                    return
                if fault == "delay":
                    time.sleep(proxy._delay())
                status, headers, payload = proxy._forward(self.command, self.path, self.headers, body)
                if fault == "drop_after":
                    self._abort()
                elif fault == "error_after":
                    self._answer(500, b"<Error><Code>InternalError</Code></Error>")
                else:
                    self.send_response(status)
                    for name, value in headers:
                        if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(name, value)
                    # A HEAD answer has no body but the object's length.
                    length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
                    self.send_header("Content-Length", length if self.command == "HEAD" else str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)

            def _answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _abort(self) -> None:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up on a delayed or dropped answer: expected here

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    def _choose(self, request: tuple[str, str]) -> str | None:
        with self._lock:
            if request in self._failed:
                self._failed.discard(request)
                self.retries += 1
            if self._random.random() >= self.rate:
                return None
            fault = self._random.choice(FAULT_KINDS)
            self.faults[fault] += 1
            if fault != "delay":
                self._failed.add(request)
            return fault

    def _delay(self) -> float:
        with self._lock:
            return self._random.uniform(0, self.max_delay_s)

    def _forward(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            # The body goes on with its length (de-chunked by the handler).
            dropped = ("connection", "proxy-connection", "transfer-encoding", "content-length")
            forwarded = {k: v for k, v in headers.items() if k.lower() not in dropped}
            forwarded["Content-Length"] = str(len(body))
            connection.request(method, path, body=body, headers=forwarded)
            answer = connection.getresponse()
            payload = answer.read()
            with self._lock:
                self.forwarded += 1
            return answer.status, answer.getheaders(), payload
        finally:
            connection.close()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
