"""A progress bar for model loads that take a while: rich, on stderr, only on a terminal.

Passed to `llamavk.load(progress=...)`, it is called with (bytes uploaded, bytes in all). It stays
hidden for the first second (most loads are over by then, and a flash of a bar is noise) and when
stderr is not a terminal (tests, pipes, log files); it disappears once the load is done.
"""

from __future__ import annotations

import sys
import time

SHOW_AFTER_SECONDS = 1.0


class LoadProgress:
    def __init__(self, label: str = "loading", enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.t0 = time.perf_counter()
        self.bar = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.t0 < SHOW_AFTER_SECONDS or done >= total:
                return
            self._start(total)
        self.bar.update(self.task, completed=done, total=total)

    def _start(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                            TransferSpeedColumn(), TimeRemainingColumn(),
                            console=Console(file=self.stream), transient=True)
        self.task = self.bar.add_task(self.label, total=total)
        self.bar.start()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
