"""The embedded PostgreSQL of ``make run``: created once, on loopback, data kept across restarts."""

from __future__ import annotations

import socket
from pathlib import Path

import sqlalchemy as sa

from barrierflow.tools.devserver import free_port
from barrierflow.tools.metadata_db import EmbeddedPostgres


def _other_addresses() -> list[str]:
    import psutil

    return [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]


def test_the_metadata_database_starts_on_loopback_and_keeps_its_data(tmp_path: Path) -> None:
    db = EmbeddedPostgres(tmp_path / "home" / "postgres", free_port())
    db.start(log=(tmp_path / "postgres.log").open("ab"))
    try:
        assert db.url.startswith("postgresql+psycopg2://airflow@127.0.0.1:")
        with sa.create_engine(db.url).begin() as conn:
            conn.execute(sa.text("create table kept (n int)"))
            conn.execute(sa.text("insert into kept values (7)"))
        # Nothing listens beyond loopback: the machine's other addresses refuse the port.
        for address in _other_addresses():
            with socket.socket() as s:
                s.settimeout(1)
                assert s.connect_ex((address, db.port)) != 0, address
    finally:
        db.stop()
    assert db.proc is not None and db.proc.poll() is not None
    db.start(log=(tmp_path / "postgres.log").open("ab"))  # a second start reuses the data directory
    try:
        with sa.create_engine(db.url).connect() as conn:
            assert conn.execute(sa.text("select n from kept")).scalar() == 7
    finally:
        db.stop()
