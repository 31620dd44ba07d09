"""The barrierflow package as an archive that executors import.

Executors need not have barrierflow installed (nor the driver's interpreter path): Spark ships a zip (``spark.submit.pyFiles``,
``addPyFile``) first on their Python workers' path, built once per code version (its name carries the package files' digest).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

__all__ = ["package_archive", "ships_package"]


def ships_package(master: str | None) -> bool:
    """Whether executors of ``master`` may run outside this process (everything but ``local[...]``)."""
    return master is not None and master != "" and master != "local" and not master.startswith("local[")


def package_archive() -> str:
    """The path of a zip holding the ``barrierflow`` package (built if missing)."""
    root = Path(__file__).resolve().parents[1]  # the package's own directory
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    target = Path(tempfile.gettempdir()) / f"barrierflow-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return str(target)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            # The package's __init__.py among them: zipimport finds no namespace-package
            # portions, so without it an executor would import barrierflow from elsewhere.
            archive.write(path, f"barrierflow/{path.relative_to(root)}")
    os.replace(partial, target)  # concurrent builders write the same content
    return str(target)
