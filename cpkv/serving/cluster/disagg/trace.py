"""The Chrome trace of a disaggregated run (``admit.serving.trace_events``): the instances of
:mod:`cpkv.serving.record.trace.events`, named by pool, and the handoffs.

Prefill instance ``k`` is process ``k`` (``prefill k``), decode instance ``k`` process
``prefill instances + k`` (``decode k``); each has its iterations, counters and, for the
requests that end on it, their async slices. The handoff of a request:

* on its prefill instance, thread ``link`` (``tid`` 1): a complete slice ``send`` from the
  send's start to its end (``args``: the request, its bytes); a flow (``ph: s``, ``cat:
  handoff``, ``id`` the request's number) leaves it at the handoff;
* on its decode instance, the flow ends (``ph: f``) where the KV lands, on the decode
  instance's iteration thread.

The request's own async slice (on the instance where it ends) holds ``queued`` (arrival to
the prefill side's admission), ``prefill`` (to the handoff), ``transfer`` (to the landing)
and ``decode wait`` (to the decode instance taking it in).
"""

from __future__ import annotations

from typing import Any

from cpkv.serving.record.trace.events import InstanceTrace, TraceEvents, _dumps, _us


class DisaggTrace:
    """The trace hooks of both pools (module docstring)."""

    def __init__(self, events: TraceEvents, prefill: int, decode: int) -> None:
        self.events, self.prefill = events, prefill
        self.handoffs = Handoffs(events, prefill)

    def instance(self, pid: int) -> InstanceTrace:
        name = f"prefill {pid}" if pid < self.prefill else f"decode {pid - self.prefill}"
        self.events.instance(pid, name)
        if pid < self.prefill:
            self.events.add(_dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1,
                                    "args": {"name": "link"}}))  # fmt: skip
        return PooledTrace(self.events, pid, self.handoffs)


class PooledTrace(InstanceTrace):
    """An instance's hooks whose request slices show the handoff's parts."""

    __slots__ = ("handoffs",)

    def __init__(self, trace: TraceEvents, pid: int, handoffs: Handoffs) -> None:
        super().__init__(trace, pid)
        self.handoffs = handoffs

    def request(self, r: Any) -> None:
        super().request(r)
        if r.handoff_us is None or r.admitted_us is None:
            return
        landed = self.handoffs.landed_us.pop(r.index, None)
        common = {"cat": "request", "id": r.index, "pid": self.pid, "tid": 0}
        marks = [("prefill", r.admitted_us, r.handoff_us)]
        if landed is not None:
            marks.append(("transfer", r.handoff_us, landed))
            if r.first_token_us is not None and r.first_token_us >= landed:
                marks.append(("decode wait", landed, r.first_token_us))
        for name, start, end in marks:
            self.add(_dumps({"ph": "b", "name": name, "ts": _us(start), **common}))
            self.add(_dumps({"ph": "e", "name": name, "ts": _us(end), **common}))


class Handoffs:
    """The sends and landings (module docstring); remembers each landing until the request's
    slice is written."""

    def __init__(self, events: TraceEvents, prefill: int) -> None:
        self.add, self.prefill = events.add, prefill
        self.landed_us: dict[int, float] = {}

    def transfer(self, p: int, r: Any, start: float, end: float, size: int) -> None:
        add = self.add
        add(_dumps({"ph": "X", "name": "send", "cat": "handoff", "pid": p, "tid": 1,
                    "ts": _us(start), "dur": _us(end - start),
                    "args": {"rid": r.rid, "bytes": size}}))  # fmt: skip
        add(_dumps({"ph": "s", "name": "handoff", "cat": "handoff", "id": r.index, "pid": p,
                    "tid": 1, "ts": _us(start)}))  # fmt: skip

    def landed(self, d: int, r: Any, t: float) -> None:
        self.landed_us[r.index] = t
        self.add(_dumps({"ph": "f", "bp": "e", "name": "handoff", "cat": "handoff",
                         "id": r.index, "pid": self.prefill + d, "tid": 0, "ts": _us(t)}))  # fmt: skip
