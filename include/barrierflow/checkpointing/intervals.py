"""Which input an epoch may take: arrival bounds and the data intervals that cut them.

An Airflow DAG run of data interval I takes the input that arrived by I's
end (its *arrival cut-off*). Epoch boundaries must follow the intervals, not
the timing of the runs: if input of several intervals is waiting (a restore
rewound the stream, a run failed, a backfill started late), each interval's
input is its own epoch, exactly as if a run per interval had taken it. So an
:class:`ArrivalBound` carries the schedule whose intervals cut the input,
and each epoch's cut-off is the end of the interval holding the earliest
input not yet taken (:meth:`ArrivalBound.epoch_cutoff_ms`), never past the
run's own cut-off.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from barrierflow.core.errors import ConfigurationError

__all__ = [
    "ArrivalBound",
    "interval_end_ms",
    "previous_interval_end_ms",
    "cutoff_text",
    "CLI_OWNER",
    "airflow_owner",
    "airflow_run_of",
]

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
    """End of the data interval of cron ``schedule`` (UTC) that holds ``arrival_ms``.

    Intervals are ``(previous fire time, fire time]`` for arrivals: input that
    arrived exactly at a fire time belongs to the interval ending there, as a
    run whose ``data_interval_end`` is that time takes it.
    """
    from croniter import CroniterBadCronError, croniter

    just_before = datetime.fromtimestamp((arrival_ms - 1) / 1000, tz=timezone.utc)
    try:
        fire = croniter(schedule, start_time=just_before).get_next(datetime)
    except (CroniterBadCronError, ValueError, KeyError) as exc:
        raise ConfigurationError(f"schedule {schedule!r} is not a cron expression: {exc}") from None
    return int(fire.timestamp() * 1000)


def previous_interval_end_ms(schedule: str, now_ms: int) -> int:
    """The last fire time of cron ``schedule`` at or before ``now_ms``: the end of the last interval that has ended."""
    from croniter import CroniterBadCronError, croniter

    just_after = datetime.fromtimestamp((now_ms + 1) / 1000, tz=timezone.utc)
    try:
        fire = croniter(schedule, start_time=just_after).get_prev(datetime)
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
    """What one run may plan: input that arrived by ``cutoff_ms``, cut at ``schedule``'s interval ends.

    ``cutoff_ms`` None means everything that has arrived; ``schedule`` None
    means no cutting (an epoch takes up to its source's per-epoch limits).
    ``owner`` names who plans (an Airflow run id, or :data:`CLI_OWNER`);
    a barrier records it, and only its owner replays it unannounced.
    """

    cutoff_ms: int | None = None
    schedule: str | None = None
    owner: str = CLI_OWNER

    def epoch_cutoff_ms(self, earliest_arrival_ms: int) -> int | None:
        """The cut-off of an epoch whose earliest waiting input arrived at ``earliest_arrival_ms``."""
        if self.schedule is None:
            return self.cutoff_ms
        end = interval_end_ms(self.schedule, earliest_arrival_ms)
        return end if self.cutoff_ms is None else min(end, self.cutoff_ms)
