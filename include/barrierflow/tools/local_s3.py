"""A local S3 endpoint for development and tests: moto's server, with its conditional writes made atomic.

moto (5.2.5) checks a conditional PUT's condition and stores the object as two steps, on a thread per request, so two racing
conditional PUTs can both succeed; S3 decides each atomically, and the checkpoint protocol depends on it (first barrier wins, one
lease holder). So this server runs moto's application one request at a time; a request's body is read before its turn and its
answer written after, so a slow client holds nobody up."""

from __future__ import annotations

import argparse
import io
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["main", "serialized", "serve"]

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serialized(app: WsgiApp) -> WsgiApp:
    """``app`` run under one lock: each request sees the effects of every earlier one, and none of a later one."""
    lock = threading.Lock()

    def handle(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = environ.get("CONTENT_LENGTH")
        if length:
            environ["wsgi.input"] = io.BytesIO(environ["wsgi.input"].read(int(length)))
        elif environ.get("wsgi.input_terminated"):  # chunked: the server de-chunks up to the last chunk
            environ["wsgi.input"] = io.BytesIO(environ["wsgi.input"].read())
        with lock:
            answer = app(environ, start_response)
            try:
                body = b"".join(answer)
            finally:
                close = getattr(answer, "close", None)
                if close is not None:
                    close()
        return [body]

    return handle


def serve(host: str, port: int, *, access_log: bool = False) -> None:
    """Serve moto's S3 (and its other services) on ``host:port`` until interrupted; ``access_log``: a line per request."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    class Dispatcher(DomainDispatcherApplication):
        """moto's dispatcher, remembering each Host header's service (deciding it lists moto's package
        directory: a quarter of this server's CPU, paid under the lock)."""

        def get_backend_for_host(self, host: str | None) -> Any:
            if host not in services:
                services[host] = super().get_backend_for_host(host)
            return services[host]

    services: dict[str | None, Any] = {}
    if not access_log:  # werkzeug's line per request cost another tenth of the CPU
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    run_simple(host, port, serialized(Dispatcher(create_backend_app)), threaded=True, request_handler=MotoRequestHandler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m barrierflow.tools.local_s3", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--access-log", action="store_true", help="log a line per request on stderr")
    args = parser.parse_args(argv)
    serve(args.host, args.port, access_log=args.access_log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
