"""The live input stream of ``make run`` (step 6): a ``sensor_stats`` landing file every few seconds."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.tools.devserver.console import say

__all__ = ["InputGenerator"]


class InputGenerator(threading.Thread):
    """Writes the next ``sensor_stats`` landing file every ``interval_s`` seconds.

    Files are published atomically by :func:`barrierflow.demo.datagen.write_sensor_files`; numbering
    continues after the files already in the directory, so restarts extend the same stream.
    """

    def __init__(self, landing: Path, interval_s: float, records_per_file: int = 200, seed: int = 0) -> None:
        super().__init__(name="barrierflow-input", daemon=True)
        self.landing = landing
        self.interval_s = interval_s
        self.records_per_file = records_per_file
        self.seed = seed
        self.stop_event = threading.Event()
        self.written = 0
        self.first_written_at: float | None = None  # wall-clock time of this session's first file

    def _spec(self, n_files: int) -> SensorStreamSpec:
        return SensorStreamSpec(n_files=n_files, records_per_file=self.records_per_file, seed=self.seed)

    def next_index(self) -> int:
        """The index after the highest of the stream's files already landed (0 when none has)."""
        name = re.compile(rf"{re.escape(self._spec(0).file_prefix)}-(\d+)\.jsonl")
        landed = os.listdir(self.landing) if self.landing.is_dir() else []
        return max((int(m[1]) for n in landed if (m := name.fullmatch(n))), default=-1) + 1

    def write_one(self) -> Path:
        index = self.next_index()
        (path,) = write_sensor_files(self.landing, self._spec(index + 1), start_index=index, count=1)
        self.written += 1
        if self.first_written_at is None:
            self.first_written_at = path.stat().st_mtime
        return path

    def run(self) -> None:
        self.landing.mkdir(parents=True, exist_ok=True)
        while not self.stop_event.is_set():
            try:
                say(f"input: wrote {self.write_one().name}")
            except Exception as exc:  # noqa: BLE001 - keep the stream going
                say(f"input: cannot write a file: {exc}")
            self.stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()
