"""Where ``make run``'s stack lives, the environment its Airflow runs with, the files it writes (steps 1, 2 and 7
of the package), and the loopback port helpers."""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from barrierflow.airflow.dags.environment import airflow_environment
from barrierflow.airflow.dags.settings import param_env_var, pipeline_dag_id
from barrierflow.core.settings import DEFAULT_WARM_UP_EPOCHS
from barrierflow.execution.engine import DEFAULT_ENGINE_PORT, EngineConfig
from barrierflow.tools.metadata_db import EmbeddedPostgres

__all__ = [
    "HOST", "DEFAULT_PORT", "DEFAULT_USER", "DEFAULT_PASSWORD", "PASSWORD_ENV", "PIPELINE", "DAG_ID", "LANDING_ENV", "STACK_FILE",
    "DevServerConfig", "devserver_environment", "write_stack_file", "write_password_file", "free_port", "port_in_use",
]  # fmt: skip

HOST = "127.0.0.1"  # never anything but loopback: this is a development server
DEFAULT_PORT = 8080
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "admin"
PASSWORD_ENV = "BARRIERFLOW_DEV_PASSWORD"
PIPELINE = "sensor_stats"  # the pipeline whose input the generator writes
DAG_ID = pipeline_dag_id(PIPELINE)  # unpaused once it appears
LANDING_ENV = param_env_var(PIPELINE, "landing_dir")  # BARRIERFLOW_SENSOR_STATS__LANDING_DIR
STACK_FILE = "barrierflow-stack.json"
# Sized for a laptop, unless the caller's environment says otherwise.
_TUNING = {
    # LocalExecutor pre-forks one worker per parallelism slot (32 by default).
    "AIRFLOW__CORE__PARALLELISM": "8",
    # Every 30 s by default, a re-parse costs ~1 s of CPU per DAG file; a changed file is re-parsed at once anyway.
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "300",
}


@dataclass(frozen=True)
class DevServerConfig:
    """Where everything lives and how the server is reached."""

    root: Path
    home: Path
    warehouse: Path | str  # a local directory, or s3://bucket/prefix
    landing: Path
    port: int = DEFAULT_PORT
    engine_port: int = DEFAULT_ENGINE_PORT
    user: str = DEFAULT_USER
    password: str = DEFAULT_PASSWORD
    generate_every_s: float = 5.0  # 0 disables the input generator
    warm_up_epochs: int = DEFAULT_WARM_UP_EPOCHS  # throwaway epochs on the new engine (barrierflow.tools.warmup)
    metadata_db: str = "postgres"  # or "sqlite" (one writer at a time: not for the CLI beside the stack)
    db_port: int = 0  # the embedded PostgreSQL's loopback port (0: any free port)
    records_per_file: int = 200

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def engine(self) -> EngineConfig:
        return EngineConfig(host=HOST, port=self.engine_port, warm_up_epochs=self.warm_up_epochs, warm_up_session=PIPELINE)

    @property
    def postgres(self) -> EmbeddedPostgres:
        return EmbeddedPostgres(self.home / "postgres", self.db_port)

    @property
    def stack_file(self) -> Path:
        """Where a running stack writes the environment of its Airflow (``barrierflow airflow`` reads it)."""
        return self.home / STACK_FILE

    @property
    def password_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json"


def devserver_environment(config: DevServerConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every Airflow component for ``config`` (``base`` defaults to ``os.environ``)."""
    env = {
        **_TUNING,
        **(os.environ if base is None else base),
        **airflow_environment(config.home, root=config.root, warehouse=config.warehouse, engine_address=config.engine.address),
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(config.port),
        "AIRFLOW__API__BASE_URL": config.url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{config.url}/execution/",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{config.user}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(config.password_file),
        "AIRFLOW__API_AUTH__JWT_SECRET": _jwt_secret(config.home),
        LANDING_ENV: str(config.landing),
        "PYTHONUNBUFFERED": "1",
    }
    if config.metadata_db == "postgres":
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = config.postgres.url
    return env


def _replace_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner alone, all at once (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_stack_file(config: DevServerConfig, env: Mapping[str, str]) -> None:
    """Record the running stack's Airflow settings, so that the Airflow CLI can be pointed at it."""
    keep = {k: v for k, v in env.items() if k.startswith(("AIRFLOW", "BARRIERFLOW_"))}
    _replace_private(
        config.stack_file, json.dumps({"url": config.url, "pid": os.getpid(), "environment": keep}, indent=1, sort_keys=True)
    )


def _jwt_secret(home: Path) -> str:
    """A 64-byte JWT signing secret in ``home`` for all components (Airflow's 16-byte default makes PyJWT warn on each token)."""
    path = home / "jwt_secret"
    value = path.read_text().strip() if path.exists() else ""
    if len(value) < 64:
        value = secrets.token_urlsafe(64)
        _replace_private(path, value + "\n")
    return value


def write_password_file(path: Path, user: str, password: str) -> None:
    """Set ``user``'s password in the simple auth manager's passwords file (JSON ``{user: password}``)."""
    try:
        current = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        current = {}
    _replace_private(path, json.dumps({**current, user: password}) + "\n")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Whether something accepts connections on ``port`` of 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0
