"""The memory a serving run's outputs hold, known from its config before it runs (a part of
the run's :class:`~cpkv.core.memory.MemoryNeed`).

* ``timeline.jsonl``: ``admit.serving.timeline_points`` buckets per instance, each summed in
  arrays, then a row and a line of text, all held at the end of the run
  (:data:`BYTES_PER_TIMELINE_POINT`);
* ``trace.json``: streamed (:mod:`cpkv.serving.record.trace.events`): at most
  :data:`~cpkv.serving.record.trace.events.FLUSH_EVENTS` events wait to be written, whatever
  the run's length (:data:`TRACE_PENDING_BYTES`);
* ``requests.jsonl`` and the iteration log are written as the run goes: nothing here.
"""

from __future__ import annotations

from typing import Any

from cpkv.serving.record.trace.events import FLUSH_EVENTS

BYTES_PER_TIMELINE_POINT = 1800
"""A timeline bucket of one instance at the end of a run: its sums (numpy), its row (a dict of
about fifteen floats), its line of ``timeline.jsonl`` and the list entries holding them
(measured at 100,000 and 400,000 points: about 1.9 KB each; rounded down, a lower bound)."""
TRACE_PENDING_BYTES = FLUSH_EVENTS * 512
"""The trace events waiting to be written, at most (:data:`FLUSH_EVENTS` of them, each well
under 512 bytes)."""


def output_need(block: Any) -> tuple[float, list[str]]:
    """The bytes the outputs of a serving run of ``block`` (the ``admit`` block) hold, and
    the keys that decide them (nothing outside mode serving)."""
    if block.mode != "serving":
        return 0.0, []
    cluster, points = block.cluster, block.serving.timeline_points
    instances = cluster.instances
    if cluster.prefill is not None and cluster.decode is not None:  # both pools' instances
        instances = cluster.prefill.instances + cluster.decode.instances
    size = float(instances) * points * BYTES_PER_TIMELINE_POINT
    each = f" x {instances} instances" if instances > 1 else ""
    what = [f"admit.serving.timeline_points: {points:,} buckets{each}"]
    if block.serving.trace_events:
        size += TRACE_PENDING_BYTES
    return size, what
