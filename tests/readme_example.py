"""The README's pipeline example ("Declare a pipeline"), as the module a user would save it as.

Tests run and register exactly the README's code, so the example cannot
drift from what works.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from barrierflow.dags.environment import repo_root
from barrierflow.pipeline import PipelineDefinition

__all__ = ["MODULE", "TARGET", "readme_pipeline", "write_readme_module"]

MODULE = "readme_clicks"
TARGET = f"{MODULE}:clicks"  # what $BARRIERFLOW_PIPELINES names


def write_readme_module(directory: Path) -> Path:
    """Write the README's first ``python`` block under "## Declare a pipeline" as ``<directory>/readme_clicks.py``."""
    text = (repo_root() / "README.md").read_text()
    section = text[text.index("## Declare a pipeline") :]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{MODULE}.py"
    path.write_text(code)
    return path


def readme_pipeline(directory: Path) -> PipelineDefinition:
    """The README's pipeline, imported from the module :func:`write_readme_module` wrote (``directory`` on sys.path)."""
    write_readme_module(directory)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    sys.modules.pop(MODULE, None)
    return importlib.import_module(MODULE).clicks
