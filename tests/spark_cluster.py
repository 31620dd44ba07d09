"""A standalone Spark cluster on 127.0.0.1 for the tests: a master and two one-core workers from the wheel's ``spark-class``.

Started by the deployment's own service commands (:func:`barrierflow.tools.topology.service_command`,
what ``docker-compose.yaml`` runs), on free ports. Each worker has a work
directory of its own, as on separate machines. Its environment is the
caller's: the S3 endpoint's, as a deployment's nodes are configured for their
object store, and the JVM options its executors inherit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from barrierflow.tools.devserver import free_port
from barrierflow.tools.topology import TopologyConfig, service_command

__all__ = ["StandaloneCluster", "standalone_cluster"]

_SERVICES = ("spark-master", "spark-worker-1", "spark-worker-2")


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


@contextmanager
def standalone_cluster(work: Path, env: Mapping[str, str], wait_s: float = 120.0) -> Iterator[StandaloneCluster]:
    import pyspark

    config = TopologyConfig(
        home=work, master_port=free_port(), master_ui_port=free_port(), worker_ui_ports=(free_port(), free_port()),
        worker_memory="1g",
    )  # fmt: skip
    env = {**env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(Path(pyspark.__file__).parent)}
    procs = [
        subprocess.Popen(
            service_command(service, config),
            env=env,
            stdout=open(work / f"{service}.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        for service in _SERVICES
    ]
    cluster = StandaloneCluster(config.master_url, f"http://127.0.0.1:{config.master_ui_port}")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if cluster.state().get("aliveworkers") == 2:
                    break
            except (OSError, ValueError):  # not listening yet, or an empty body while the UI starts (seen in CI)
                pass
            if time.monotonic() > deadline:
                logs = "\n".join((work / f"{service}.log").read_text()[-1500:] for service in _SERVICES)
                raise RuntimeError(f"the standalone cluster did not register two workers in {wait_s:.0f} s:\n{logs}")
            time.sleep(1)
        yield cluster
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
