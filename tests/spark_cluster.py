"""A standalone Spark cluster on 127.0.0.1 for the tests: a master and two one-core workers from the wheel's ``spark-class``.

Each worker has a work directory of its own, as on separate machines. Its
environment is the caller's: the S3 endpoint's, as a deployment's nodes are
configured for their object store, and the JVM options its executors inherit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["StandaloneCluster", "standalone_cluster"]


@dataclass(frozen=True)
class StandaloneCluster:
    master: str  # spark://127.0.0.1:<port>
    ui: str  # the master's web UI, whose /json/ lists workers and applications

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as response:
            return dict(json.load(response))

    def completed_applications(self) -> list[str]:
        """The names of the applications that ran on this master and ended."""
        return [app["name"] for app in self.state().get("completedapps", [])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def standalone_cluster(work: Path, env: Mapping[str, str], wait_s: float = 120.0) -> Iterator[StandaloneCluster]:
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = str(spark_home / "bin" / "spark-class")
    port, ui_port = _free_port(), _free_port()
    env = {**env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(spark_home)}
    master = f"spark://127.0.0.1:{port}"
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                   "--webui-port", str(ui_port)],
        **{
            f"worker-{n}": [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1",
                            "--cores", "1", "--memory", "1g", "--webui-port", str(_free_port()),
                            "--work-dir", str(work / f"worker-{n}")]
            for n in range(2)
        },
    }  # fmt: skip
    procs = [
        subprocess.Popen(cmd, env=env, stdout=open(work / f"{name}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        for name, cmd in commands.items()
    ]
    cluster = StandaloneCluster(master, f"http://127.0.0.1:{ui_port}")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if cluster.state().get("aliveworkers") == 2:
                    break
            except (OSError, ValueError):  # not listening yet, or an empty body while the UI starts (seen in CI)
                pass
            if time.monotonic() > deadline:
                logs = "\n".join((work / f"{name}.log").read_text()[-1500:] for name in commands)
                raise RuntimeError(f"the standalone cluster did not register two workers in {wait_s:.0f} s:\n{logs}")
            time.sleep(1)
        yield cluster
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
