"""The split timeline: device-clock stamps taken inside the kernels of a one-token step.

The profile between dispatches (vk/sequence.py, GPU timestamps) serializes every dispatch, so it
cannot show what -sm graph is for: the product after an all-reduce issuing its weight loads while
the exchange point still waits for the peers (split/matvec_steps.py, kernels/chain.py). With
LLAMAVK_CLOCK_PROFILE=1 a split's one-token steps take the CLOCK variants of the exchange point
(shaders/exchange_reduce.comp) and of the stream products reading its sum (matvec_stream.comp, the
_dp forms), which write the device clock (VK_KHR_shader_clock, clockRealtime2x32EXT) into a host-
visible buffer of STAMP_WORDS words per exchange point:

  0 EX_ENTRY      the exchange point's start: my partial done (graph mode: after its in-shader wait
                  for the product writing it), my counter about to go out (lane 0)
  1 EX_ARRIVED    the peers' counters seen (the wait is over)
  2 EX_END        the sum written
  3 PR_FIRST      the products' earliest workgroup entry   (atomicMin over workgroups)
  4 PR_LAST       ... latest workgroup entry               (atomicMax)
  5 REL_FIRST     ... earliest release of the wait          (atomicMin; no wait: the entry)
  6 REL_LAST      ... latest release                        (atomicMax)
  7 PR_END        ... latest workgroup end                  (atomicMax)

Only the clock's low 32 bits are kept (32-bit atomics work everywhere; 64-bit ones need
shaderBufferInt64Atomics): they wrap every 2^32 ns = 4.3 s, so a step whose stamps straddle a wrap
(their spread above 2^31) is discarded (`Timeline.of` returns None), and the stamps are otherwise
read relative to the step's earliest. The unit is nanoseconds on llvmpipe (measured:
tests/test_split_clock.py, which checks it on whatever device it runs on) and, by its
documentation, on NVIDIA (globaltimer). Products other than the stream _dp kernels (no CLOCK
variant) leave their words untouched: `None` in the timeline. Unprofiled runs take none of this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import LlamavkError
from ..vk import Buffer

ENV = "LLAMAVK_CLOCK_PROFILE"
STAMP_WORDS = 8
EX_ENTRY, EX_ARRIVED, EX_END, PR_FIRST, PR_LAST, REL_FIRST, REL_LAST, PR_END = range(STAMP_WORDS)
_MIN_WORDS = (PR_FIRST, REL_FIRST)      # atomicMin targets: they start at the largest value
_UNSET = 0xFFFFFFFF


def enabled() -> bool:
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise LlamavkError(f"{ENV}={value!r}: 0 or 1")
    return value == "1"


def check_devices(devices) -> None:
    for device in devices:
        if not device.info.shader_clock:
            raise LlamavkError(f"{ENV}=1: {device.name} ({device.info.name}) has no device clock in shaders "
                               "(VK_KHR_shader_clock shaderDeviceClock)")


@dataclass(frozen=True)
class Stamp:
    """Where one exchange point and the products reading its sum write their clock stamps."""
    stamps: tuple   # (buffer, offset, size): the device's stamp buffer
    slot: int       # the exchange point's slot (its exchange index)


class ClockStamps:
    """One device's stamp buffer (host-visible): a slot per exchange point of a step. The host
    resets it before each one-token step (`reset`, devices idle) and reads it after (`read`)."""

    def __init__(self, device, n_slots: int):
        check_devices([device])
        self.n_slots = max(1, n_slots)
        self.buffer = Buffer(device, 4 * STAMP_WORDS * self.n_slots, host_visible=True)
        self.words = self.buffer.array(np.uint32).reshape(self.n_slots, STAMP_WORDS)
        self.layers: dict[int, int | None] = {}   # slot -> layer of the exchange point recorded there
        self.reset()

    def stamp(self, exchange: int, layer: int | None) -> Stamp:
        if not 0 <= exchange < self.n_slots:
            raise LlamavkError(f"clock stamps: exchange {exchange} past the {self.n_slots} slots")
        self.layers[exchange] = layer
        return Stamp((self.buffer, 0, self.buffer.size), exchange)

    def reset(self) -> None:
        self.words[:] = 0
        self.words[:, list(_MIN_WORDS)] = _UNSET

    def read(self) -> np.ndarray:
        return self.words.copy()

    def close(self) -> None:
        self.buffer.close()


@dataclass
class Point:
    """One exchange point of one device's step, in ns relative to the step's earliest stamp; the
    product fields None where no product after it was stamped."""
    exchange: int
    layer: int | None
    entry: int
    arrived: int
    end: int
    first_entry: int | None = None
    last_entry: int | None = None
    first_release: int | None = None
    last_release: int | None = None
    product_end: int | None = None

    @property
    def wait(self) -> int:          # entry -> the peers arrived
        return self.arrived - self.entry

    @property
    def sum(self) -> int:           # arrived -> sum written (the peers' partials read over the bus)
        return self.end - self.arrived

    @property
    def lead(self) -> int | None:   # how long before the exchange's end the product's first loads went out
        return None if self.first_entry is None else self.end - self.first_entry

    @property
    def release(self) -> int | None:   # the product's first wait release after the exchange's end
        return None if self.first_release is None else self.first_release - self.end

    @property
    def finish(self) -> int | None:    # the product's end after the exchange's end
        return None if self.product_end is None else self.product_end - self.end


class Timeline:
    @staticmethod
    def of(words: np.ndarray, layers: dict) -> list[Point] | None:
        """The exchange points recorded (layers: slot -> layer) and stamped in one step (a sum that
        is not the CLOCK kernel's leaves none; a split without all-reduces has none); None when the
        step straddles a wrap of the 32-bit clock (module doc)."""
        rows = {s: words[s].astype(np.int64) for s in sorted(layers)
                if words[s][EX_ENTRY] != 0 or words[s][EX_END] != 0}
        values = [int(v) for r in rows.values() for i, v in enumerate(r)
                  if not (i in _MIN_WORDS and v == _UNSET) and not (i not in _MIN_WORDS and i > EX_END and v == 0)]
        if not values:
            return []
        if max(values) - min(values) >= 1 << 31:
            return None
        t0 = min(values)
        points = []
        for s, r in rows.items():
            p = Point(s, layers[s], int(r[EX_ENTRY]) - t0, int(r[EX_ARRIVED]) - t0, int(r[EX_END]) - t0)
            if r[PR_FIRST] != _UNSET:
                p.first_entry, p.last_entry = int(r[PR_FIRST]) - t0, int(r[PR_LAST]) - t0
                p.first_release, p.last_release = int(r[REL_FIRST]) - t0, int(r[REL_LAST]) - t0
                p.product_end = int(r[PR_END]) - t0
            points.append(p)
        return points


def summary(points: list[Point]) -> dict:
    """Mean µs of each phase over the points (those with a stamped product for the product's), and
    how many had their product's first loads issued before the exchange ended."""
    def mean_us(values):
        values = [v for v in values if v is not None]
        return float(np.mean(values)) / 1e3 if values else None

    with_product = [p for p in points if p.lead is not None]
    ahead = [p.lead for p in with_product if p.lead > 0]
    return {"points": len(points), "with_product": len(with_product),
            "wait_us": mean_us([p.wait for p in points]), "sum_us": mean_us([p.sum for p in points]),
            "lead_us": mean_us([p.lead for p in with_product]), "release_us": mean_us([p.release for p in with_product]),
            "finish_us": mean_us([p.finish for p in with_product]),
            "overlapped": len(ahead), "overlap_us": mean_us(ahead)}
