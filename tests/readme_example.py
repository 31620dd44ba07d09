"""The README's pipeline examples ("Declare a pipeline", "Timers"), as the modules a user would save them as.

Tests run and register exactly the README's code, so the example cannot
drift from what works.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from barrierflow.airflow.dags.environment import repo_root
from barrierflow.plan.pipeline import PipelineDefinition

__all__ = ["MODULE", "TARGET", "readme_pipeline", "readme_module", "write_readme_module"]

MODULE = "readme_clicks"
TARGET = f"{MODULE}:clicks"  # what $BARRIERFLOW_PIPELINES names


def write_readme_module(directory: Path, heading: str = "## Declare a pipeline", module: str = MODULE) -> Path:
    """Write the README's first ``python`` block under ``heading`` as ``<directory>/<module>.py``."""
    text = (repo_root() / "README.md").read_text()
    section = text[text.index(f"\n{heading}\n") :]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}.py"
    path.write_text(code)
    return path


def readme_module(directory: Path, heading: str, module: str) -> Any:
    """The README's first ``python`` block under ``heading``, imported as ``module`` from ``directory``."""
    write_readme_module(directory, heading, module)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    sys.modules.pop(module, None)
    return importlib.import_module(module)


def readme_pipeline(directory: Path) -> PipelineDefinition:
    """The README's pipeline, imported from the module :func:`write_readme_module` wrote (``directory`` on sys.path)."""
    return readme_module(directory, "## Declare a pipeline", MODULE).clicks
