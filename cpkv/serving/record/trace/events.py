"""``trace.json``: a serving run's timeline in the Chrome trace-event format
(``admit.serving.trace_events: true``), for Perfetto (ui.perfetto.dev) and chrome://tracing.

The file is one JSON object, ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; times
(``ts``, ``dur``) are simulated microseconds. Each serving instance is a process
(``pid`` = instance, named ``instance <k>``) with:

* thread ``iterations`` (``tid`` 0): one complete slice (``ph: X``) per iteration (forward
  pass), named for what it did (``prefill``, ``decode``, ``prefill+decode``, ``idle``) with
  ``args``: ``prefill_tokens`` (computed), ``decode_tokens``, ``batch_requests`` (decoding
  requests plus requests in prefill), ``admitted``, ``first_tokens``, ``loaded_tokens``
  (L2 load-back), ``l1_hit_tokens`` (of the requests admitted), ``running``, ``waiting``,
  ``kv_used_blocks``; iterations follow one another on the track, so the slices never
  overlap. A preemption is an instant event (``ph: i``, ``s: t``) named ``preempt`` at the
  end of the iteration whose growth preempted, ``args`` the victim and the phase;
* counters (``ph: C``) ``requests`` (``running``, ``waiting``) and ``kv`` (``used_blocks``)
  at the start of each iteration where they changed;
* one async slice per request (``ph: b``/``e``, ``cat: request``, ``id`` the request's
  number in the run), from its arrival to its end (finished, rejected, timed out or cancelled; ``args``: prompt,
  output, status, reason), holding a nested ``queued`` slice from its arrival to its first
  admission, and an instant (``ph: n``) ``first token``.

The engine calls :meth:`InstanceTrace.iteration` once per iteration (a run with trace events
runs every iteration in full, with the same results: no closed-form stretches) and the run's
request sink calls :meth:`InstanceTrace.request` when a request ends.

The file streams: :class:`TraceEvents` writes the document's head at once, each event as it
happens (gathered :data:`FLUSH_EVENTS` at a time, then written as one piece), and the tail at
:meth:`TraceEvents.close`, so the memory it holds does not grow with the run; the events
follow one another in the order they happened, as in a document joined at the end.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cpkv.serving.model.request import CANCELLED, FINISHED, REJECTED, TIMED_OUT

_dumps = json.JSONEncoder(separators=(",", ":")).encode
STATUS = {
    FINISHED: "finished",
    REJECTED: "rejected",
    TIMED_OUT: "timed_out",
    CANCELLED: "cancelled",
}
"""A request's end, as ``requests.jsonl`` names it."""


def _us(t: float) -> float:
    """A time for the file: microseconds to the nanosecond."""
    return round(t, 3)


HEAD = '{"traceEvents":[\n'
TAIL = '\n],"displayTimeUnit":"ms"}\n'
FLUSH_EVENTS = 4096
"""Events gathered before they are written as one piece (about 1 MB)."""


class TraceEvents:
    """The events of one run, written to ``write`` (a text sink such as a file's ``write``)
    as they happen; without one, kept in memory (:meth:`text`). ``on_flush`` (optional) is
    called with this object after each piece is written (a check of the room left)."""

    def __init__(
        self,
        write: Callable[[str], Any] | None = None,
        on_flush: Callable[[TraceEvents], None] | None = None,
    ) -> None:
        self._kept: list[str] | None = None
        if write is None:
            self._kept = []
            write = self._kept.append
        self._write, self._on_flush = write, on_flush
        self._pending: list[str] = []
        self._sep = ""  # what goes before the next piece: nothing before the first event
        self.events = 0  # events written so far
        self.chars = 0  # characters written so far (bytes: the text is ASCII)
        self.requests_ended = 0
        self.closed = False
        self._put(HEAD)

    def _put(self, text: str) -> None:
        self._write(text)
        self.chars += len(text)

    def add(self, event: str) -> None:
        """One event (a JSON object's text)."""
        pending = self._pending
        pending.append(event)
        if len(pending) >= FLUSH_EVENTS:
            self.flush()

    def flush(self) -> None:
        """Write the events gathered so far."""
        pending = self._pending
        if not pending:
            return
        self._put(self._sep + ",\n".join(pending))
        self._sep = ",\n"
        self.events += len(pending)
        pending.clear()
        if self._on_flush is not None:
            self._on_flush(self)

    def close(self) -> None:
        """Write what is left and the document's tail (once)."""
        if self.closed:
            return
        self.flush()
        self._put(TAIL)
        self.closed = True

    def instance(self, pid: int, name: str | None = None) -> InstanceTrace:
        """The hooks of instance ``pid`` (names its process, ``instance <pid>`` unless
        ``name`` is given, and its iteration thread)."""
        add = self.add
        label = f"instance {pid}" if name is None else name
        add(_dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": label}}))  # fmt: skip
        add(_dumps({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}}))  # fmt: skip
        add(_dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0,
                    "args": {"name": "iterations"}}))  # fmt: skip
        return InstanceTrace(self, pid)

    def text(self) -> str | None:
        """The whole document when it was kept in memory (closed first); else None."""
        if self._kept is None:
            return None
        self.close()
        return "".join(self._kept)


class InstanceTrace:
    """The hooks of one instance (see the module docstring)."""

    __slots__ = ("trace", "add", "pid", "l1_seen", "requests_seen", "kv_seen")

    def __init__(self, trace: TraceEvents, pid: int) -> None:
        self.trace, self.add, self.pid = trace, trace.add, pid
        self.l1_seen = 0  # the loop's l1_hit_tokens counter at the last iteration
        self.requests_seen: tuple[int, int] | None = None  # the counters last written
        self.kv_seen: int | None = None

    def iteration(
        self, engine: Any, start: float, duration: float, decoded: int, firsts: int,
        completed: int,
    ) -> None:  # fmt: skip
        """An iteration of ``engine`` from ``start`` for ``duration`` µs (``completed``: the
        prompts it completed), before its end is applied (its preemptions are still in
        ``engine.pool.preempted``)."""
        pool, pid, add = engine.pool, self.pid, self.add
        prefill = engine.prefill_tokens
        name = (
            ("prefill+decode" if decoded else "prefill")
            if prefill
            else ("decode" if decoded else "idle")
        )
        in_prefill = completed + len(engine.prefilling)
        ts = _us(start)
        l1 = engine.counters["l1_hit_tokens"]
        l1_hit, self.l1_seen = l1 - self.l1_seen, l1
        running, waiting, used = pool.n_running, len(engine.waiting), pool.used_blocks
        # the JSON objects written directly (numbers only; what json.dumps writes, faster)
        add(
            f'{{"ph":"X","name":"{name}","cat":"iteration","pid":{pid},"tid":0,"ts":{ts!r},'
            f'"dur":{_us(duration)!r},"args":{{"iteration":{engine.iterations},'
            f'"prefill_tokens":{prefill},"decode_tokens":{decoded},'
            f'"batch_requests":{decoded + in_prefill},"admitted":{engine.admitted},'
            f'"first_tokens":{firsts},"loaded_tokens":{engine.loaded},"l1_hit_tokens":{l1_hit},'
            f'"running":{running},"waiting":{waiting},"kv_used_blocks":{used}}}}}'
        )
        if (running, waiting) != self.requests_seen:
            self.requests_seen = (running, waiting)
            add(
                f'{{"ph":"C","name":"requests","pid":{pid},"tid":0,"ts":{ts!r},'
                f'"args":{{"running":{running},"waiting":{waiting}}}}}'
            )
        if used != self.kv_seen:
            self.kv_seen = used
            add(
                f'{{"ph":"C","name":"kv","pid":{pid},"tid":0,"ts":{ts!r},'
                f'"args":{{"used_blocks":{used}}}}}'
            )
        if pool.preempted:
            end = _us(start + duration)
            for r, phase in pool.preempted:
                add(_dumps({"ph": "i", "s": "t", "name": "preempt", "cat": "preemption",
                            "pid": pid, "tid": 0, "ts": end,
                            "args": {"rid": r.rid, "phase": phase}}))  # fmt: skip

    def request(self, r: Any) -> None:
        """``r`` ended: its async slice, its queueing and its first token."""
        pid, add = self.pid, self.add
        self.trace.requests_ended += 1
        common = {"cat": "request", "id": r.index, "pid": pid, "tid": 0}
        arrival, end = _us(r.arrival_us), _us(r.finished_us)
        status = STATUS.get(r.state, "rejected")
        add(_dumps({"ph": "b", "name": r.rid, "ts": arrival, **common,
                    "args": {"prompt_tokens": r.prompt_tokens, "max_new_tokens": r.max_new_tokens}}))  # fmt: skip
        queued_until = end if r.admitted_us is None else _us(r.admitted_us)
        add(_dumps({"ph": "b", "name": "queued", "ts": arrival, **common}))
        add(_dumps({"ph": "e", "name": "queued", "ts": queued_until, **common}))
        if r.first_token_us is not None:
            add(_dumps({"ph": "n", "name": "first token", "ts": _us(r.first_token_us), **common}))
        add(_dumps({"ph": "e", "name": r.rid, "ts": end, **common,
                    "args": {"status": status,
                             "reason": r.reject_reason, "output_tokens": r.generated}}))  # fmt: skip
