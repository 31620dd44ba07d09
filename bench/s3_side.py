"""The S3 variants of the benchmarks: landing files and warehouse on the loopback S3 server.

:class:`LoopbackS3` starts ``python -m barrierflow.tools.local_s3`` (moto's
server, conditional writes made atomic) on a free loopback port, creates a
bucket and uploads a landing directory to it. The engine then runs exactly as
in the local runs, with ``s3://`` URIs and the standard AWS environment
(``engine_side.run_engine(..., warehouse=..., env=...)``).

The emulator runs on the same two cores as the engine, so its CPU time is
taken from the engine's: :meth:`LoopbackS3.cpu_seconds` (the server's user +
system time from ``/proc``) over the run gives how much of the S3 figure is
the emulator rather than the engine. :func:`same_tables` checks that the S3
run wrote what the local run wrote.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Mapping

__all__ = ["LoopbackS3", "same_tables", "describe_s3"]

BUCKET = "bench"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopbackS3:
    """The loopback S3 server for one benchmark: ``with LoopbackS3(log) as s3: ...``."""

    def __init__(self, log: Path) -> None:
        port = _free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "barrierflow.tools.local_s3", "--host", "127.0.0.1", "--port", str(port)]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the loopback S3 server did not start; see {log}") from None
                time.sleep(0.1)
        self._client().create_bucket(Bucket=BUCKET)

    def _client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip

    def uri(self, key: str) -> str:
        return f"s3://{BUCKET}/{key}"

    def upload(self, local_dir: Path, prefix: str) -> str:
        """Every file under ``local_dir`` to ``s3://bench/<prefix>/`` (same relative names); returns that URI."""
        client = self._client()
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local_dir).as_posix()}")
        return self.uri(prefix)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> "LoopbackS3":
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def same_tables(local_root: str, s3_root: str, names: list[str], env: Mapping[str, str]) -> list[str]:
    """The tables (relative to each pipeline root) whose rows differ between the local and the S3 run; [] when all agree."""
    from deltalake import DeltaTable

    options = {"AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"], "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}  # fmt: skip
    differ = []
    for name in names:
        local = DeltaTable(f"{local_root}/{name}").to_pandas()
        remote = DeltaTable(f"{s3_root}/{name}", storage_options=options).to_pandas()
        columns = sorted(c for c in local.columns if c not in ("_epoch", "_updated_at_ms", "_committed_at"))
        if list(sorted(remote.columns)) != sorted(local.columns):
            differ.append(f"{name} (columns)")
            continue
        a = local[columns].sort_values(columns).reset_index(drop=True)
        b = remote[columns].sort_values(columns).reset_index(drop=True)
        if not a.equals(b):
            differ.append(f"{name} ({len(a)} local rows, {len(b)} on S3)")
    return differ


def describe_s3(engine: dict[str, Any], local: dict[str, Any], sss_events_per_s: float, emulator_cpu_s: float) -> str:
    """The S3 run's line: its figure beside the local one, and the emulator's share of the machine."""
    share = emulator_cpu_s / (2 * engine["processing_s"]) if engine["processing_s"] else 0.0
    return (
        f"S3 (landing and warehouse on the loopback S3 server): {engine['events_per_s']:,.0f} ev/s "
        f"(local {local['events_per_s']:,.0f}) -> ratio {engine['events_per_s'] / sss_events_per_s:.3f} against the "
        f"same local SSS figure; steady epoch {engine['steady_epoch_s']:.2f}s (local {local['steady_epoch_s']:.2f}s); "
        f"the emulator used {emulator_cpu_s:.1f} CPU-s during the {engine['processing_s']:.1f} s of processing: "
        f"{share:.0%} of the machine's two cores"
    )
