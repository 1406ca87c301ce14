"""Stages chained without a pipeline barrier (one-token steps, where selection.chain_ok allows it).

Between two dependent dispatches the engine records a pipeline barrier: the GPU drains the
producer's last workgroups and only then launches the next grid, with DRAM idle meanwhile. A chained
consumer is recorded right after its producer without that barrier (CommandSequence.dispatch
chained=True): its workgroups start as the producer's finish, issue their weight loads, and wait in
the shader until every workgroup of the producer has counted itself done (matvec_stream.comp WAIT /
SIGNAL, attention_decode.comp CHAIN). Each producer of a step counts on a slot of its own; the
counters are zeroed at the start of the step, so nothing has to put them back.

This relies on workgroups starting in submission order (a waiting workgroup must never hold the
place of one it waits for), which Vulkan does not promise: selection.CHAIN_VENDORS names the drivers
where it was measured.

A waiting consumer reads everything the step wrote through coherent bindings, not only its
producer's output (tests/test_shaders_chain.py): a pipeline barrier is also what drops an SM's
non-coherent cache lines, and with every stage chained a step may hold no barrier at all while the
arena reuses addresses (an exchange point reading the residual through a plain binding made 2 H200s
say other tokens under -sm graph).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import filled_buffer

SLOT_WORDS = 2   # a counter, and a word the waiting shader keeps its poll count in (never read)


@dataclass(frozen=True)
class Signal:
    """Where a producer's workgroups count themselves done."""
    counters: tuple   # (buffer, offset, size): the step's counters
    slot: int         # word index of this producer's counter


@dataclass(frozen=True)
class Wait:
    """What a chained consumer waits for: the producer's counter reaching its workgroup count."""
    counters: tuple
    slot: int
    n: int


class ChainCounters:
    """The counters of one recorded step: `begin` zeroes them (recorded first), `signal` hands out a
    slot per producer. One buffer per device and size, shared by its recordings, which never run at
    the same time (as the other scratch buffers)."""

    def __init__(self, kc, n_slots: int):
        size = 4 * SLOT_WORDS * max(1, n_slots)
        buf = kc.shared("chain counters", size, lambda: filled_buffer(kc.device, np.zeros(size // 4, np.uint32)))
        # only atomics and polls touch them between the zeroing fills (begin): no dispatch waits for
        # another's counts behind a barrier (CommandSequence.dispatch leaves them out of its hazards)
        buf.shader_ordered = True
        self.range = (buf, 0, size)
        self.n_slots = n_slots
        self.used = 0

    def begin(self, seq) -> None:
        """Zero the counters before the step's first dispatch (after everything submitted earlier)."""
        buf, offset, size = self.range
        seq.barrier()
        seq.fill(buf, 0, size, offset)

    def signal(self) -> Signal:
        if self.used >= self.n_slots:
            raise ValueError("chain: more producers than counter slots")
        self.used += 1
        return Signal(self.range, SLOT_WORDS * (self.used - 1))

    @staticmethod
    def wait(signal: Signal, n: int) -> Wait:
        return Wait(signal.counters, signal.slot, n)


def edge_letter(producer) -> str:
    """selection.chain_edges' letter of a producer op: a attention, o output projection, g gate/up,
    d down, e the experts' gate/up pair, m their summing down product ("" for the others)."""
    if producer.kind == "attention":
        return "a"
    if producer.kind == "matmul_id":
        return "e" if "pair" in producer.attrs else "m"
    role = producer.inputs[0].role if producer.kind == "matmul" and producer.inputs else ""
    return {"o": "o", "gate": "g", "down": "d"}.get(role, "")


def timing_only_skipped(producer) -> bool:
    """LLAMAVK_CHAIN_NOWAIT=letters (benchmarks/bench_decode_ab.py --no-wait; TIMING ONLY, the results
    are wrong): the chained consumers of these producers do not wait for them, so that a step's time
    without that edge's latency can be measured: what the wait costs at most."""
    letter = edge_letter(producer)
    return bool(letter) and letter in os.environ.get("LLAMAVK_CHAIN_NOWAIT", "")
