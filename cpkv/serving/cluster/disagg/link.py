"""The KV link of a prefill instance: a latency + bandwidth model, first come first served.

A prefill instance sends each handed-off request's KV (its prompt's tokens x the model's KV
bytes per token, the whole prompt: the decode instance holds none of it) over its own link
of ``lanes`` lanes of ``gb_per_s`` each (the NICs or NVLinks of its GPUs, one direction;
:mod:`cpkv.serving.cluster.disagg.schema` for the presets and their sources). Sends leave in
the order the requests were handed off; a send of ``B`` bytes handed off at ``t``::

    start = max(t, the end of the previous send's bytes on the wire)
    wire  = B / (lanes x gb_per_s)
    end   = start + wire + latency_us       (the KV has landed; the prefill side frees it)

so a link carries one send's bytes at a time while the latencies overlap (a pipeline). An
unbounded link (``instant``) has no wire time. The link's busy time is the sum of the wire
times; its utilisation that over the run's makespan.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Link:
    """One prefill instance's link (module docstring); counts what it sent."""

    bytes_per_us: float | None  # None: unbounded
    latency_us: float
    free_us: float = 0.0  # when the wire is free for the next send's bytes
    sends: int = 0
    bytes_sent: int = 0
    busy_us: float = 0.0

    @classmethod
    def of(cls, gb_per_s: float | None, latency_us: float, lanes: int) -> Link:
        """A link of ``lanes`` lanes of ``gb_per_s`` GB/s each (None: unbounded)."""
        rate = None if gb_per_s is None else gb_per_s * lanes * 1e3
        return cls(rate, latency_us)

    def send(self, size_bytes: int, ready_us: float) -> tuple[float, float]:
        """Send ``size_bytes`` handed off at ``ready_us``: (start, end) of the send."""
        start = ready_us if ready_us > self.free_us else self.free_us
        wire = 0.0 if self.bytes_per_us is None else size_bytes / self.bytes_per_us
        self.free_us = start + wire
        self.sends += 1
        self.bytes_sent += size_bytes
        self.busy_us += wire
        return start, start + wire + self.latency_us
