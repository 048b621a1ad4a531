"""``trace.json`` as a file: the room it needs on the disk, checked before the run and while
it is written.

Before the run, :func:`open_trace` refuses one whose file cannot fit even at its smallest:
every request ends with at least its four slice events (:data:`REQUEST_EVENTS_MIN_BYTES`),
before any iteration slice (iterations are most of the file, and how many a run takes is
known only once it has run). While the file is written, :class:`DiskRoom` projects its final
size from what each ended request took so far (the iterations included) and stops the run,
in one line, when the rest would not fit in the room left on the disk, instead of filling
the disk to its last byte.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from cpkv.core.errors import OutputError
from cpkv.serving.record.trace.events import TraceEvents

REQUEST_EVENTS_MIN_BYTES = 360
"""The fewest bytes a request's events take in the file: its slice's begin and end, its
``queued`` slice's begin and end (the ``first token`` instant only when it got one), with
the shortest name, numbers and reason."""
CHECK_EVERY_BYTES = 64 << 20
"""How often (in bytes written) the projection is checked against the room left."""
PROJECT_AFTER_FRACTION = 0.05
"""The share of the run's requests that must have ended before a projection is trusted."""

FreeBytes = Callable[[Path], int]


def free_bytes(folder: Path) -> int:
    """The bytes this process may still write on the file system of ``folder``."""
    return shutil.disk_usage(folder).free


def mb(size: float) -> str:
    """``0.42 MB``, ``788 MB``, ``5,279 MB`` (10^6 bytes; three significant digits below 1,000)."""
    value = size / 1e6
    return f"{value:,.0f} MB" if value >= 1000 else f"{value:.3g} MB"


def least_bytes(requests: int) -> int:
    """The smallest ``trace.json`` a run of ``requests`` requests writes."""
    return requests * REQUEST_EVENTS_MIN_BYTES


class DiskRoom:
    """:class:`TraceEvents`'s ``on_flush``: every :data:`CHECK_EVERY_BYTES`, once
    :data:`PROJECT_AFTER_FRACTION` of the ``requests`` have ended, the bytes still to come
    (what the ended requests took each, times those still to end) must fit the room left in
    ``folder``; :class:`OutputError` otherwise."""

    def __init__(self, folder: Path, requests: int, free: FreeBytes | None = None) -> None:
        self.folder, self.requests, self.free = folder, requests, free or free_bytes
        self.next_check = CHECK_EVERY_BYTES
        self.least_ended = max(1, int(requests * PROJECT_AFTER_FRACTION))

    def __call__(self, trace: TraceEvents) -> None:
        if trace.chars < self.next_check:
            return
        self.next_check = trace.chars + CHECK_EVERY_BYTES
        ended = trace.requests_ended
        if ended < self.least_ended:
            return
        to_come = trace.chars / ended * max(0, self.requests - ended)
        room = self.free(self.folder)
        if to_come > room:
            raise OutputError(
                f"{self.folder / 'trace.json'}: on course for about {mb(trace.chars + to_come)} "
                f"({mb(trace.chars)} written after {ended:,} of {self.requests:,} requests), "
                f"more than the {mb(room)} left on the disk; allowed: "
                "admit.serving.trace_events=false, fewer requests or more free space"
            )


def open_trace(
    write: Callable[[str], object], requests: int, folder: Path | None,
    free: FreeBytes | None = None,
) -> TraceEvents:  # fmt: skip
    """The trace of a run of ``requests`` requests, written to ``write``; with a run
    ``folder``, refused (:class:`OutputError`) when even its smallest size does not fit the
    room left there (``free``: the room, default :func:`free_bytes`), and watched by
    :class:`DiskRoom` while it is written."""
    if folder is None:
        return TraceEvents(write)
    free = free or free_bytes
    least, room = least_bytes(requests), free(folder)
    if least > room:
        raise OutputError(
            f"{folder / 'trace.json'}: needs at least {mb(least)} for {requests:,} requests "
            f"({REQUEST_EVENTS_MIN_BYTES} bytes each before any iteration), the disk has "
            f"{mb(room)} left; allowed: admit.serving.trace_events=false, fewer requests or "
            "more free space"
        )
    return TraceEvents(write, on_flush=DiskRoom(folder, requests, free))
