"""Which input an epoch may take: arrival bounds and the data intervals that cut them.

Epochs follow the data intervals, not the timing of runs: waiting input of several
intervals (a rewind, a failed run, a late backfill) becomes one epoch per interval."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from croniter import CroniterBadCronError, croniter

from barrierflow.core.errors import ConfigurationError

__all__ = [
    "ArrivalBound", "interval_end_ms", "previous_interval_end_ms", "cutoff_text", "CLI_OWNER", "airflow_owner", "airflow_run_of",
]  # fmt: skip

CLI_OWNER = "barrierflow run"


def airflow_owner(dag_id: str, run_id: str) -> str:
    """The owner name of an Airflow DAG run (what barriers and holds record)."""
    return f"{dag_id}:{run_id}"


def airflow_run_of(owner: str) -> tuple[str, str] | None:
    """(dag id, run id) of an Airflow owner name; None for any other owner (e.g. a CLI command)."""
    dag_id, sep, run_id = owner.partition(":")
    # DAG ids hold no ':' and no spaces; a CLI owner's name has a space.
    return (dag_id, run_id) if sep and run_id and " " not in dag_id else None


def interval_end_ms(schedule: str, arrival_ms: int) -> int:
    """End of the data interval ``(previous fire time, fire time]`` of cron ``schedule`` (UTC) that holds ``arrival_ms``."""
    return _fire_ms(schedule, arrival_ms - 1, forward=True)


def previous_interval_end_ms(schedule: str, now_ms: int) -> int:
    """The last fire time of cron ``schedule`` at or before ``now_ms``: the end of the last interval that has ended."""
    return _fire_ms(schedule, now_ms + 1, forward=False)


def _fire_ms(schedule: str, start_ms: int, forward: bool) -> int:
    """The fire time of ``schedule`` after (or before) ``start_ms``."""
    try:
        fires = croniter(schedule, start_time=datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc))
        fire = fires.get_next(datetime) if forward else fires.get_prev(datetime)
    except (CroniterBadCronError, ValueError, KeyError) as exc:
        raise ConfigurationError(f"schedule {schedule!r} is not a cron expression: {exc}") from None
    return int(fire.timestamp() * 1000)


def cutoff_text(arrival_cutoff_ms: int | None) -> str:
    """An arrival cut-off for logs: ISO 8601 UTC."""
    if arrival_cutoff_ms is None:
        return "no arrival cut-off"
    return datetime.fromtimestamp(arrival_cutoff_ms / 1000, tz=timezone.utc).isoformat()


@dataclass(frozen=True)
class ArrivalBound:
    """What one run may plan: input that arrived by ``cutoff_ms`` (None: all), cut at ``schedule``'s interval ends (None: no cut).
    ``owner`` (an Airflow run, or :data:`CLI_OWNER`) is recorded by a barrier; only it replays it unannounced."""

    cutoff_ms: int | None = None
    schedule: str | None = None
    owner: str = CLI_OWNER

    def epoch_cutoff_ms(self, earliest_arrival_ms: int) -> int | None:
        """The cut-off of an epoch whose earliest waiting input arrived at ``earliest_arrival_ms``."""
        if self.schedule is None:
            return self.cutoff_ms
        end = interval_end_ms(self.schedule, earliest_arrival_ms)
        return end if self.cutoff_ms is None else min(end, self.cutoff_ms)
