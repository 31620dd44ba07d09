"""Entry points of the PySpark jobs in ``spark_jobs/``: one lifecycle step per process, under the epoch lease."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from barrierflow.api.params import parse_assignments
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import BarrierflowError
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S, LEASE_WAIT_ENV
from barrierflow.plan.registry import get_pipeline

__all__ = ["process_epoch_main"]


def process_epoch_main(argv: Sequence[str] | None = None) -> int:
    """Process + pre-commit the planned epoch of a pipeline (step 3); idempotent."""
    parser = argparse.ArgumentParser(prog="process_epoch", description=process_epoch_main.__doc__)
    parser.add_argument("pipeline")
    parser.add_argument("--warehouse", default=os.environ.get("BARRIERFLOW_WAREHOUSE", "./warehouse"))
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    wait_s = float(os.environ.get(LEASE_WAIT_ENV) or DEFAULT_LEASE_WAIT_S)
    wait_help = f"wait this long for the pipeline's epoch lease (default: ${LEASE_WAIT_ENV} or {DEFAULT_LEASE_WAIT_S:.0f})"
    parser.add_argument("--lease-wait", type=float, default=wait_s, metavar="SECONDS", help=wait_help)
    args = parser.parse_args(argv)
    try:
        coordinator = CheckpointCoordinator(get_pipeline(args.pipeline), parse_assignments(args.param), args.warehouse)
        coordinator.acquire_lease(wait_s=args.lease_wait)
        try:
            manifest = coordinator.process_planned()
            stop = coordinator.stopped()
        finally:
            coordinator.release_lease()
        if manifest is None:
            # A stopped pipeline does not finish a planned epoch: its state stays at the savepoint.
            reason = f"stopped with savepoint {stop.get('savepoint')!r}" if stop else "no planned epoch to process"
            print(f"{args.pipeline}: {reason}")
            return 0
        print(
            f"{args.pipeline}: epoch {manifest.epoch} pre-committed by attempt {manifest.attempt_id}: "
            f"{manifest.rows_in} rows in, {manifest.rows_out} rows out, {manifest.bytes_written} bytes staged"
        )
        return 0
    except BarrierflowError as exc:
        print(f"process_epoch: error: {exc}", file=sys.stderr)
        return 1
