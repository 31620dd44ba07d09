"""The live input stream of ``make run``: a ``sensor_stats`` landing file every few seconds."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from barrierflow.demo.datagen import SensorStreamSpec, sensor_file_name, write_sensor_files
from barrierflow.tools.devserver.console import say

__all__ = ["InputGenerator"]


class InputGenerator(threading.Thread):
    """Writes the next ``sensor_stats`` landing file every ``interval_s`` seconds.

    Files are published atomically by :func:`barrierflow.demo.datagen.write_sensor_files`
    (``.``-prefixed temporary name, fsync, rename); numbering continues after
    the files already in the directory, so restarts extend the same stream.
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

    def next_index(self) -> int:

        spec = SensorStreamSpec(n_files=1, records_per_file=self.records_per_file, seed=self.seed)
        prefix = sensor_file_name(spec, 0).rsplit("-", 1)[0] + "-"
        indices = []
        for name in os.listdir(self.landing) if self.landing.is_dir() else []:
            if name.startswith(prefix) and name.endswith(".jsonl"):
                digits = name[len(prefix) : -len(".jsonl")]
                if digits.isdigit():
                    indices.append(int(digits))
        return max(indices) + 1 if indices else 0

    def write_one(self) -> Path:

        index = self.next_index()
        spec = SensorStreamSpec(n_files=index + 1, records_per_file=self.records_per_file, seed=self.seed)
        (path,) = write_sensor_files(self.landing, spec, start_index=index, count=1)
        self.written += 1
        if self.first_written_at is None:
            self.first_written_at = path.stat().st_mtime
        return path

    def run(self) -> None:
        self.landing.mkdir(parents=True, exist_ok=True)
        while not self.stop_event.is_set():
            try:
                path = self.write_one()
                say(f"input: wrote {path.name}")
            except Exception as exc:  # noqa: BLE001 - keep the stream going
                say(f"input: cannot write a file: {exc}")
            self.stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()
