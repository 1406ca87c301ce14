"""A progress bar for model loads that take a while: rich, on stderr, only on a terminal.

Used as a context manager around `llamavk.load(progress=bar)`. Nothing is shown for the first second
(most loads are over by then, and a flash of a bar is noise) nor when stderr is not a terminal (tests,
pipes, log files). After that second a bar appears, from a timer thread so that it also covers the
parts of a load that report no progress (opening the GGUF, the tokenizer, devices): first as a pulse,
then with bytes, speed and time left as weights reach the devices (the load calls the bar with
(bytes uploaded, bytes in all)). It is cleared when the load ends.
"""

from __future__ import annotations

import sys
import threading

SHOW_AFTER_SECONDS = 1.0


class LoadProgress:
    def __init__(self, label: str = "loading", enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.bar = None
        self.task = None
        self.done, self.total = 0, None
        self._lock = threading.Lock()
        self._timer = None
        self._closed = False

    def __enter__(self):
        if self.enabled:
            self._timer = threading.Timer(SHOW_AFTER_SECONDS, self._start)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            self.done, self.total = done, total
            if self.bar is not None:
                self.bar.update(self.task, completed=done, total=total)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        with self._lock:
            if self._closed:
                return
            label = self.label if len(self.label) <= 28 else self.label[:27] + "…"   # one line in 80 columns
            self.bar = Progress(TextColumn(label), BarColumn(bar_width=12), DownloadColumn(binary_units=True),
                                TransferSpeedColumn(), TimeRemainingColumn(),
                                console=Console(file=self.stream), transient=True)
            self.task = self.bar.add_task(label, total=self.total, completed=self.done)
            self.bar.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self.bar is not None:
                self.bar.stop()
                self.bar = None

    def __exit__(self, *exc):
        self.close()
