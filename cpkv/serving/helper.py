"""Helper processes for a long serving run: work that needs no simulation state, done on the
machine's other core while the loop runs.

The loop packs what it records (per-request records in input order, per-iteration
segments, :mod:`cpkv.serving.records`, :mod:`cpkv.serving.iteration_log`) into bytes; the
rest of the output work is pure numpy on those bytes: the ``requests.jsonl`` lines and
their writing, the latency statistics, the samples' expansion, integrals and spill, the
timeline and the time breakdown. :class:`Helper` forks the process once the run's objects
exist; the child keeps its copies of them and does that work on the batches the parent
sends through a pipe, while the parent simulates (all of it but what needs the makespan:
the iterations are expanded, broken down, summed and spilled as they come); at the end, the
parent waiting, it sums the requests' summary and the timeline's buckets (a long run's in
two processes at once: it forks one that starts on the buckets while it sums the requests,
:mod:`cpkv.serving.bucket_sums`) and sends back what the summary needs. The results are
those of the same work done in one process: the child runs the same code on the same
bytes, in the same order.

The arrivals of a lazily drawn workload (the ``synthetic`` source's draws, a repeated
trace's copies: :mod:`cpkv.serving.arrivals`) are drawn the same way by a second child,
:class:`Producer`, which sends them to the parent in packed batches; the parent builds
each request from its fields when it reaches it: the same requests in the same order.

Used when it pays and is safe: Linux (``fork``), a run of at least
:data:`HELPER_MIN_REQUESTS` requests writing its lines to a file, a parent with a single
thread (forking a threaded process can deadlock the child), and not switched off with
``CPKV_SERVING_HELPER=0``. Errors in a child come back as one ``RuntimeError`` in the
parent; a parent that stops (an error, Ctrl-C, SIGTERM) closes the pipes and the children
end.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import sys
import threading
from typing import Any

HELPER_MIN_REQUESTS = 20_000
"""Runs with fewer requests do their output work in their own process."""
PIPE_BYTES = 1 << 24
CHILD_NICENESS = 10
"""How much lower the helpers' scheduling priority is than the simulation's: with three
processes on two cores the simulation would otherwise get two thirds of a core."""
_LENGTH = struct.Struct("<Q")
_HEAD = struct.Struct("<BB")  # kind, parts (each part's length follows, then the parts)
_TAIL = struct.Struct("<d?")  # a samples batch: the loop's time after it, a jump after it
RECORDS, SAMPLES, END, ARRIVALS, ERROR = 1, 2, 3, 4, 5
_ARRIVAL = struct.Struct("<qdqqqq")  # index, arrival (µs), prompt, max_new, L1 and L2 hits
ARRIVAL_BATCH = 8192


def helper_wanted(requests: int, lines: Any) -> bool:
    """Whether a run of ``requests`` writing its lines to ``lines`` should use a helper."""
    if os.environ.get("CPKV_SERVING_HELPER", "").strip() in ("0", "no", "off", "false"):
        return False
    return (
        requests >= HELPER_MIN_REQUESTS
        and sys.platform.startswith("linux")
        and hasattr(os, "fork")
        and getattr(lines, "path", None) is not None
        and threading.active_count() == 1
    )


def _pipe() -> tuple[int, int]:
    """``os.pipe()`` with a buffer as large as the system lets us make it (up to
    :data:`PIPE_BYTES`): the writer runs ahead of a busy reader by that much instead of 64 KiB."""
    import fcntl  # (Linux: helpers run nowhere else)

    read, write = os.pipe()
    for size in (PIPE_BYTES, 1 << 22, 1 << 20):
        try:
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, size)
            break
        except (OSError, AttributeError):
            continue
    return read, write


def _fork(close_in_child: list[int]) -> int:
    """``os.fork()``, stdio flushed first; in the child: the descriptors of
    ``close_in_child`` closed, Ctrl-C and SIGHUP ignored (the parent handles them and closes
    the pipes), SIGTERM's default action, a lower priority (:data:`CHILD_NICENESS`)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid == 0:
        for fd in close_in_child:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.nice(CHILD_NICENESS)  # the simulation first: it is the run's critical path
    return pid


class Producer:
    """A forked child that draws ``arrivals`` (an iterator of arrival rows,
    :func:`~cpkv.serving.arrivals.as_reqs`) and sends them in packed batches; iterating this
    gives the Reqs of those rows, built here."""

    def __init__(self, arrivals: Any, close_in_child: list[int] = ()) -> None:
        from_child, to_parent = _pipe()
        pid = _fork([from_child, *close_in_child])
        if pid == 0:  # the child: never returns
            code = 1
            try:
                _produce(arrivals, to_parent)
                code = 0
            finally:
                os._exit(code)
        os.close(to_parent)
        self.pid, self.inbox = pid, from_child

    def __iter__(self):
        from cpkv.serving.kv_pool import Req

        new = Req.new
        while True:
            message = _receive(self.inbox)
            if message is None:
                self.close()
                raise RuntimeError("the serving run's arrival process ended early")
            kind, parts = message
            if kind == END:
                self.close()
                return
            if kind == ERROR:
                self.close()
                raise RuntimeError(f"the serving run's arrival process failed: {parts[0].decode()}")
            rids, hashes = pickle.loads(parts[1])
            for (i, arrival_us, prompt, max_new, l1, l2), rid, h in zip(
                _ARRIVAL.iter_unpack(parts[0]), rids, hashes, strict=True
            ):
                yield new(i, rid, arrival_us, prompt, max_new, l1, l2, h)

    def close(self) -> None:
        """Stop reading (the child ends) and wait for the child."""
        if self.inbox >= 0:
            with contextlib.suppress(OSError):
                os.close(self.inbox)
            self.inbox = -1
        if self.pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0


def _produce(arrivals: Any, outbox: int) -> None:
    pack = _ARRIVAL.pack
    try:
        batch: list[Any] = []
        for r in arrivals:
            batch.append(r)
            if len(batch) == ARRIVAL_BATCH:
                _send_arrivals(outbox, batch, pack)
                batch = []
        if batch:
            _send_arrivals(outbox, batch, pack)
        _write_parts(outbox, [_HEAD.pack(END, 0)])
    except BrokenPipeError:
        return  # the parent stopped reading
    except BaseException as err:  # noqa: BLE001 - say it to the parent, then end
        text = f"{type(err).__name__}: {err}".encode()
        with contextlib.suppress(OSError):
            _write_parts(outbox, [_HEAD.pack(ERROR, 1), _LENGTH.pack(len(text)), text])
        raise


def _send_arrivals(fd: int, batch: list[tuple], pack: Any) -> None:
    packed = b"".join(
        [pack(i, us, prompt, max_new, l1, l2) for i, _, us, prompt, max_new, l1, l2, _ in batch]
    )
    names = pickle.dumps(
        ([row[1] for row in batch], [row[7] for row in batch]), protocol=pickle.HIGHEST_PROTOCOL
    )
    head = _HEAD.pack(ARRIVALS, 2) + _LENGTH.pack(len(packed)) + _LENGTH.pack(len(names))
    _write_parts(fd, [head, packed, names])


class Helper:
    """The forked output child and the pipes to it (see the module docstring)."""

    def __init__(
        self, stats: Any, samples: Any, lines: Any, close_in_child: list[int] = ()
    ) -> None:
        """Fork now: the child takes over the processing of ``stats`` (a
        :class:`~cpkv.serving.records.RequestStats`) and ``samples`` (an
        :class:`~cpkv.serving.iteration_log.IterationLog`); ``lines`` is the
        :class:`~cpkv.core.files.StreamedFile` the child writes."""
        from_parent, to_child = _pipe()
        from_child, to_parent = os.pipe()
        pid = _fork([to_child, from_child, *close_in_child])
        if pid == 0:  # the child: never returns
            code = 1
            try:
                _serve(from_parent, to_parent, stats, samples, lines)
                code = 0
            finally:
                os._exit(code)
        os.close(from_parent)
        os.close(to_parent)
        self.pid, self.out, self.back = pid, to_child, from_child
        stats.forward = self.records
        samples.forward = self.samples

    def records(self, packed: bytes, rids: list[str]) -> None:
        self._send(RECORDS, packed, pickle.dumps(rids, protocol=pickle.HIGHEST_PROTOCOL))

    def samples(
        self, records: bytes, counts: bytes, durations: bytes, now: float, jumped: bool
    ) -> None:
        self._send(SAMPLES, records, counts, durations, _TAIL.pack(now, jumped))

    def finish(self, end_us: float, capacity_blocks: int, points: int) -> dict[str, Any]:
        """The child's results: ``summary`` (the requests), ``integrals``, ``timeline``,
        ``time``."""
        self._send(END, pickle.dumps((end_us, capacity_blocks, points)))
        reply = self._reply()
        self._reap()
        return reply

    def abort(self) -> None:
        """The run stopped: close the pipe (the child ends) and wait for it."""
        with contextlib.suppress(OSError):
            os.close(self.out)
        self.out = -1
        self._reap()

    def _send(self, kind: int, *parts: bytes) -> None:
        head = _HEAD.pack(kind, len(parts)) + b"".join(_LENGTH.pack(len(p)) for p in parts)
        try:
            _write_parts(self.out, [head, *parts])
        except OSError:  # the child ended: say why
            self._reply()
            raise RuntimeError("the serving run's helper process ended early") from None

    def _reply(self) -> dict[str, Any]:
        data = _read(self.back)
        if data is None:
            self._reap()
            raise RuntimeError("the serving run's helper process ended without a result")
        reply = pickle.loads(data)
        if "error" in reply:
            self._reap()
            raise RuntimeError(f"the serving run's helper process failed: {reply['error']}")
        return reply

    def _reap(self) -> None:
        for fd in (self.out, self.back):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.out = self.back = -1
        if self.pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0


def _serve(inbox: int, outbox: int, stats: Any, samples: Any, lines: Any) -> None:
    """The child's loop: process batches until ``END`` (reply with the results) or until the
    parent closes the pipe (drop everything)."""
    from cpkv.serving.timeline import SpilledTimeline

    try:
        while True:
            message = _receive(inbox)
            if message is None:
                samples.discard()
                return
            kind, parts = message
            if kind == RECORDS:
                stats.process(parts[0], pickle.loads(parts[1]))
            elif kind == SAMPLES:
                now, jumped = _TAIL.unpack(parts[3])
                samples.process(parts[0], parts[1], parts[2], now, bool(jumped))
            else:
                end_us, capacity, points = pickle.loads(parts[0])
                lines.flush()
                pending = SpilledTimeline(samples, end_us, capacity, points, fork=True)
                summary = stats.summary()  # (meanwhile, a forked process sums buckets)
                timeline, time = pending.result()
                reply = {
                    "summary": summary,
                    "integrals": samples.totals,
                    "timeline": timeline,
                    "time": time,
                }
                samples.discard()
                _write_all(outbox, pickle.dumps(reply))
                return
    except BaseException as err:  # noqa: BLE001 - say it to the parent, then end
        with contextlib.suppress(OSError):
            _write_all(outbox, pickle.dumps({"error": f"{type(err).__name__}: {err}"}))
        raise


def _receive(fd: int) -> tuple[int, list[bytes]] | None:
    """One message: its kind and its parts; None at the end of the pipe."""
    head = _read_exactly(fd, _HEAD.size)
    if head is None:
        return None
    kind, count = _HEAD.unpack(head)
    sizes = _read_exactly(fd, _LENGTH.size * count) if count else b""
    if sizes is None:
        return None
    parts = []
    for (size,) in _LENGTH.iter_unpack(sizes):
        part = _read_exactly(fd, size) if size else b""
        if part is None:
            return None
        parts.append(part)
    return kind, parts


def _write_parts(fd: int, parts: list[bytes]) -> None:
    """Write every part, in order (``writev`` may write less than asked: go on)."""
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        written = os.writev(fd, views[:64])
        while written:
            if written >= len(views[0]):
                written -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][written:]
                written = 0


def _read(fd: int) -> bytes | None:
    """One length-prefixed message; None at the end of the pipe."""
    head = _read_exactly(fd, _LENGTH.size)
    if head is None:
        return None
    return _read_exactly(fd, _LENGTH.unpack(head)[0])


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]
