"""A real S3 endpoint on loopback for tests: moto's server (5.2.5 honours If-None-Match and If-Match).

It runs through ``barrierflow.tools.local_s3``, which makes each conditional write
atomic as on S3 (moto alone lets two racing writers both win).

Each pytest process starts one server the first time a test needs it; the
tests reach it through the standard AWS environment variables, as users
reach theirs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["S3Server", "start_s3_server", "aws_env"]


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def aws_env(endpoint: str) -> dict[str, str]:
    """The environment a client of ``endpoint`` needs (credentials moto accepts, a region, plain HTTP)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def start_s3_server(log: Path, wait_s: float = 60.0) -> S3Server:
    """Start the local S3 endpoint on a free loopback port; returns once it answers."""
    from barrierflow.tools.devserver import free_port

    port = free_port()
    command = [sys.executable, "-m", "barrierflow.tools.local_s3", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(command)} exited {process.returncode}; see {log}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
            return S3Server(endpoint, process)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{' '.join(command)} did not answer within {wait_s:.0f} s; see {log}")
