"""spark-submit entry point: process + pre-commit the planned epoch of a pipeline."""

import os

from barrierflow.checkpointing.jobs import process_epoch_main

# Leave at once: delta-rs runtime threads must not outlive the job's result.
os._exit(process_epoch_main())
