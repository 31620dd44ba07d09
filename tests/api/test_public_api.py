"""barrierflow's package: the curated public surface of ``import barrierflow as bf``, loaded lazily."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import barrierflow as bf

PACKAGE = Path(bf.__file__).resolve().parent


def test_every_public_name_resolves_and_is_listed_once() -> None:
    assert bf.__all__ == sorted(set(bf.__all__))
    assert set(bf.__all__) == set(bf._exports())
    for name in bf.__all__:
        assert getattr(bf, name) is getattr(sys.modules[bf._exports()[name]], name)
    assert set(bf.__all__) <= set(dir(bf))


def test_type_checkers_see_the_same_names() -> None:
    """The ``if TYPE_CHECKING:`` imports (what IDEs and mypy see) name exactly ``__all__``."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    imported = {(alias.name, node.module) for node in ast.walk(block) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert {name for name, _ in imported} == set(bf.__all__)
    assert {name: module for name, module in imported} == bf._exports()


def test_the_public_errors_are_the_error_hierarchy() -> None:
    from barrierflow.core import errors

    public = {name for name in errors.__all__ if name != "InjectedFault"}  # raised by the test fault hook only
    assert public <= set(bf.__all__)
    assert all(issubclass(getattr(bf, name), bf.BarrierflowError) for name in public)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        bf.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("bf.NoSuchThing resolved")


def test_importing_the_package_loads_neither_spark_nor_delta() -> None:
    """DAG files import barrierflow: that must start no JVM and load no heavy library."""
    code = (
        "import sys, barrierflow as bf\n"
        "heavy = [m for m in ('pyspark', 'deltalake', 'airflow', 'barrierflow.plan.pipeline') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert callable(bf.pipeline) and 'pyspark' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{PACKAGE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_pipeline_decorator_survives_loading_its_module() -> None:
    """``barrierflow.plan.pipeline`` is also a module: loading it must not replace ``bf.pipeline``, the decorator."""
    import barrierflow.plan.pipeline  # noqa: F401
    from barrierflow.plan.pipeline import PipelineDefinition

    assert bf.pipeline is sys.modules["barrierflow.plan.pipeline"].pipeline
    assert isinstance(bf.pipeline("api_check")(lambda p, params: None), PipelineDefinition)


def test_packaging_finds_the_package_its_subpackages_and_templates() -> None:
    """pyproject's ``packages.find`` (not namespace discovery) needs ``__init__.py``: else a wheel holds nothing."""
    from setuptools import find_packages

    found = set(find_packages(where=str(PACKAGE.parent)))
    subpackages = {f"barrierflow.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    assert {"barrierflow", "barrierflow.airflow.ui", "barrierflow.operators"} | subpackages <= found
    assert list((PACKAGE / "airflow" / "ui" / "templates").glob("*"))  # package-data "barrierflow.airflow.ui" = ["templates/*"]


def test_a_user_function_naming_the_package_pickles_for_the_executors(tmp_path: Path) -> None:
    """A function shipped by value (as ship_user_code ships user modules) that says ``bf.X`` refers to the package by name."""
    import importlib
    import pickle

    from pyspark import cloudpickle

    (tmp_path / "user_fn_module.py").write_text(
        "import barrierflow as bf\n\ndef domain():\n    return bf.TimeDomain.EVENT_TIME\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("user_fn_module")
        cloudpickle.register_pickle_by_value(module)
        restored = pickle.loads(cloudpickle.dumps(module.domain))
        assert restored() is bf.TimeDomain.EVENT_TIME
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("user_fn_module", None)


def test_test_files_have_unique_basenames() -> None:
    """pytest imports test modules by basename (rootdir-relative, no packages): two ``test_x.py`` break collection of the suite."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
