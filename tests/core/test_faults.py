"""barrierflow.core.faults: deterministic fault injection."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from barrierflow.core import faults
from barrierflow.core.errors import ConfigurationError, InjectedFault


@pytest.fixture(autouse=True)
def fresh_counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(faults.ENV_VAR, raising=False)
    monkeypatch.delenv(faults.STATE_ENV_VAR, raising=False)
    faults._crossings.clear()
    yield
    faults._crossings.clear()


@pytest.mark.parametrize(
    "spec",
    [
        "nowhere:1",  # unknown point
        "recover.start",  # no count
        "recover.start:x",  # count not a number
        "recover.start:-1",
        "recover.start:1:raise:extra",
        "recover.start:1:explode",  # unknown mode
        "recover.start:1,bogus.point:2",  # one bad item spoils the plan
    ],
)
def test_invalid_spec_raises_configuration_error(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv(faults.ENV_VAR, spec)
    with pytest.raises(ConfigurationError, match=faults.ENV_VAR):
        faults.maybe_fail("recover.start")


def test_invalid_spec_message_lists_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV_VAR, "nowhere:1")
    with pytest.raises(ConfigurationError) as info:
        faults.maybe_fail("recover.start")
    assert "commit.before_delta_commit" in str(info.value)


def test_no_env_var_is_a_no_op() -> None:
    for _ in range(3):
        faults.maybe_fail("recover.start")
    assert faults._crossings == {}


@pytest.mark.parametrize("n", [1, 2, 5])
def test_raise_mode_fails_exactly_at_the_nth_crossing(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setenv(faults.ENV_VAR, f"process.after_stage:{n}:raise")
    for _ in range(n - 1):
        faults.maybe_fail("process.after_stage")
    with pytest.raises(InjectedFault, match=rf"process.after_stage \(crossing {n}\)"):
        faults.maybe_fail("process.after_stage")
    # Only the n-th crossing fails; later ones pass.
    faults.maybe_fail("process.after_stage")
    faults.maybe_fail("process.after_stage")


def test_other_points_are_not_counted_and_do_not_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV_VAR, "commit.after_completed:1:raise")
    for _ in range(5):
        faults.maybe_fail("commit.before_completed")
    assert faults._crossings["commit.before_completed"] == 0
    with pytest.raises(InjectedFault):
        faults.maybe_fail("commit.after_completed")


def test_several_points_in_one_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV_VAR, " barrier.before_write:2:raise , notify.start:1:raise ,")
    faults.maybe_fail("barrier.before_write")
    with pytest.raises(InjectedFault, match="notify.start"):
        faults.maybe_fail("notify.start")
    with pytest.raises(InjectedFault, match="barrier.before_write"):
        faults.maybe_fail("barrier.before_write")


def test_every_declared_point_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV_VAR, ",".join(f"{p}:2:raise" for p in faults.FAULT_POINTS))
    for point in faults.FAULT_POINTS:
        faults.maybe_fail(point)  # first crossing: passes
    for point in faults.FAULT_POINTS:
        with pytest.raises(InjectedFault):
            faults.maybe_fail(point)


def _run(code: str, spec: str, state_dir: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != faults.STATE_ENV_VAR}
    env[faults.ENV_VAR] = spec
    if state_dir is not None:
        env[faults.STATE_ENV_VAR] = state_dir
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60)


_KILL_SCRIPT = """
    from barrierflow.core.faults import maybe_fail
    maybe_fail("commit.before_delta_commit")
    print("crossed once", flush=True)
    maybe_fail("commit.before_delta_commit")
    print("survived", flush=True)
"""


@pytest.mark.parametrize("spec", ["commit.before_delta_commit:2", "commit.before_delta_commit:2:kill"])
def test_kill_mode_sigkills_the_process_at_the_nth_crossing(spec: str) -> None:
    proc = _run(_KILL_SCRIPT, spec)
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout == "crossed once\n"


def test_kill_mode_not_reached_exits_normally() -> None:
    proc = _run(_KILL_SCRIPT, "commit.before_delta_commit:3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "crossed once\nsurvived\n"


# -- a crossing counter shared across processes (BARRIERFLOW_FAULT_STATE) -------------------


def test_shared_counter_fires_once_across_processes(tmp_path: Path) -> None:
    state = str(tmp_path / "faults")
    first = _run(_KILL_SCRIPT, "commit.before_delta_commit:2", state)
    assert first.returncode == -9 and first.stdout == "crossed once\n", first.stderr
    # A retry is a fresh process: it sees the two crossings before it and passes.
    retry = _run(_KILL_SCRIPT, "commit.before_delta_commit:2", state)
    assert retry.returncode == 0 and retry.stdout == "crossed once\nsurvived\n", retry.stderr
    assert (tmp_path / "faults" / "commit.before_delta_commit.count").read_text() == "4"


def test_shared_counter_in_process_raise_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(faults.ENV_VAR, "notify.start:2:raise,recover.start:1:raise")
    monkeypatch.setenv(faults.STATE_ENV_VAR, str(tmp_path))
    faults.maybe_fail("notify.start")
    faults._crossings.clear()  # as if a new process: the files still count
    with pytest.raises(InjectedFault, match=r"notify.start \(crossing 2\)"):
        faults.maybe_fail("notify.start")
    faults.maybe_fail("notify.start")
    with pytest.raises(InjectedFault, match="recover.start"):
        faults.maybe_fail("recover.start")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notify.start.count", "recover.start.count"]


def test_unusable_state_dir_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(faults.ENV_VAR, "notify.start:1:raise")
    monkeypatch.setenv(faults.STATE_ENV_VAR, str(blocker / "faults"))
    with pytest.raises(ConfigurationError, match=faults.STATE_ENV_VAR):
        faults.maybe_fail("notify.start")
