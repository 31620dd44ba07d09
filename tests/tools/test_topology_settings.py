"""docker-compose.yaml and the Docker-less topology run the same services with the same commands."""

from __future__ import annotations

from pathlib import Path

import yaml

from barrierflow.tools.topology import SERVICES, TopologyConfig, service_command, service_environment

ROOT = Path(__file__).resolve().parents[2]


def test_every_compose_service_is_a_topology_service_run_by_the_shared_command() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())["services"]
    assert list(compose) == list(SERVICES)
    for name, service in compose.items():
        assert service["command"] == ["python", "-m", "barrierflow.tools.topology", "serve", name]
        assert service["network_mode"] == "host"  # every address 127.0.0.1, as without Docker
        assert service["environment"] == {"BARRIERFLOW_TOPOLOGY_HOME": "/app/topology"}


def test_the_settings_travel_through_the_environment(tmp_path: Path) -> None:
    config = TopologyConfig(home=tmp_path, s3_port=9100, master_port=7100, worker_ui_ports=(8100, 8101), bucket="b-1")
    assert TopologyConfig.from_env(config.to_env()) == config
    assert TopologyConfig.from_env({}).home == (Path.cwd() / "topology")
    worker = service_command("spark-worker-2", config)
    assert worker[worker.index("--webui-port") + 1] == "8101" and "spark://127.0.0.1:7100" in worker
    env = service_environment("scheduler", config, base={})
    assert env["BARRIERFLOW_WAREHOUSE"] == "s3://b-1/warehouse" and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9100"
    assert env["BARRIERFLOW_SPARK_MASTER"] == "spark://127.0.0.1:7100"
