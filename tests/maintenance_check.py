"""What maintenance must leave behind: exactly the data files the current and the retained table versions read."""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable

from barrierflow.operations.maintenance import _tables
from barrierflow.storage import objects

__all__ = ["data_files", "unreferenced_files", "assert_only_referenced_files"]


def data_files(uri: str) -> set[str]:
    """Every Parquet file of the table in storage, wherever it lies (not the log's own checkpoints)."""
    return {f.path for f in objects.walk(uri) if f.path.endswith(".parquet") and not f.path.startswith("_delta_log/")}


def _referenced(uri: str, versions: set[int]) -> set[str]:
    paths = set(DeltaTable(uri).file_uris())
    for version in versions:
        paths |= set(DeltaTable(uri, version=version).file_uris())
    return {p.removeprefix(uri.rstrip("/") + "/") for p in paths}


def unreferenced_files(coordinator: Any, retained_epochs: tuple[int, ...], ignore: set[str] = frozenset()) -> dict[str, set[str]]:
    """Per table: files in storage that neither its current version nor a retained checkpoint's version reads.

    Also reads every retained version whole, so a file such a version needs
    and maintenance deleted fails here.
    """
    lineage = coordinator.current_lineage()["lineage_id"]
    retained = [r for r in coordinator.log.records() if r.lineage_id == lineage and r.epoch in retained_epochs]
    out: dict[str, set[str]] = {}
    for name, uri in _tables(coordinator):
        keep = {r.versions()[name] for r in retained if name in r.versions()}
        stored, referenced = data_files(uri) - ignore, _referenced(uri, keep)
        assert referenced <= stored, (name, sorted(referenced - stored)[:3])
        if stored - referenced:
            out[name] = stored - referenced
        for version in keep:
            DeltaTable(uri, version=version).to_pyarrow_table()
    return out


def assert_only_referenced_files(coordinator: Any, retained_epochs: tuple[int, ...], ignore: set[str] = frozenset()) -> None:
    """Every table holds exactly the files its current version or a retained checkpoint reads; those still read."""
    assert unreferenced_files(coordinator, retained_epochs, ignore) == {}
