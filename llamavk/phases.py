"""Where a command's wall time goes: marks at the end of each phase, timed from process start.

`llamavk run -v` (or LLAMAVK_PHASES=1 without the rest of -v) prints one line per phase on stderr
when the command ends: interpreter start, imports, Vulkan instance, device, GGUF parse, vocabulary,
fit check, weight upload, recordings (with the pipeline creation inside them), first token, the
rest of the generation, teardown. Marking costs a perf_counter read and a list append, so the load
path marks unconditionally; nothing is printed unless asked.

Process start comes from /proc (Linux: the process's start time in clock ticks against the
system's uptime, 10 ms resolution); elsewhere the first line counts from when this module was
imported. Everything after that first mark is perf_counter time.
"""

from __future__ import annotations

import os
import time

ENV = "LLAMAVK_PHASES"

_marks: list[tuple[str, float]] = []
_extra: dict[str, float] = {}      # time spent inside phases, e.g. pipeline creation during recording


def _process_age() -> float | None:
    """Seconds since this process started, or None where /proc cannot tell."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        # fields after the command name (which may hold spaces and parentheses): starttime is field 22
        fields = stat[stat.rindex(b")") + 2:].split()
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


_age = _process_age()
_origin = time.perf_counter() - (_age or 0.0)      # process start on the perf_counter clock
_marks.append(("interpreter start" if _age is not None else "(llamavk imported)", time.perf_counter()))


def requested() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "off", "false", "no")


def mark(phase: str) -> None:
    """The phase that just ended (the time since the previous mark is its duration)."""
    _marks.append((phase, time.perf_counter()))


def add(what: str, seconds: float) -> None:
    """Time spent on `what` inside the phases (reported beside them, not as a phase)."""
    _extra[what] = _extra.get(what, 0.0) + seconds


def report() -> list[str]:
    """One line per phase: its duration and the time since process start at its end."""
    lines = []
    prev = _origin
    for phase, t in _marks:
        lines.append(f"phase {phase:<22} {1e3 * (t - prev):9.1f} ms   at {1e3 * (t - _origin):9.1f} ms")
        prev = t
    for what, s in _extra.items():
        lines.append(f"phase   (of which {what}: {1e3 * s:.1f} ms)")
    return lines
