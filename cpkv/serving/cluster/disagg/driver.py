"""The driver of a disaggregated deployment: a prefill pool and a decode pool, each behind its
own router (a :class:`~cpkv.serving.cluster.driver.Cluster` each), and the handoff between.

Time order, arrival by arrival:

1. the prefill side routes the arrival as a colocated cluster does (every prefill instance
   first advanced to the arrival, the router deciding from the loads then; the
   ``prefix_aware`` router's tree holds the prefixes it sent to each prefill instance). A
   prefill instance runs prefill-only (:meth:`~cpkv.serving.engine.engine.Engine.prefill_only`):
   at the end of the iteration that completes a prompt, the request leaves; its instance's
   link (:mod:`cpkv.serving.cluster.disagg.link`) sends its KV, and the instance holds its
   blocks until the send ends;
2. each handoff is an event at its time ``t`` (the iteration's end): the decode side's router
   picks a decode instance from the decode loads at ``t`` (every decode instance advanced to
   ``t``; the request counts there as queued from then on, as sgl-router counts what it
   forwarded), and the KV lands at the send's end, when the decode instance receives it
   (:meth:`~cpkv.serving.engine.engine.Engine.deliver_built`) and admits it by SGLang's
   decode-side rule (:mod:`cpkv.serving.engine.handoff`).

Events are handled in time order up to the arrival being routed: once every prefill
instance has run every iteration that starts before ``T``, no handoff not yet seen can happen
before ``T`` (an iteration ends after it starts), so the decode side may run to ``T``.
After the last arrival the prefill instances run to their end, then the handoffs left, then
the decode instances. The routers draw from their own seeded generators (the prefill side's
from the experiment's seed, the decode side's from the next seed): the same seed routes the
same way.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cpkv.serving.cluster.disagg.link import Link
from cpkv.serving.cluster.disagg.tallies import HandoffRecord
from cpkv.serving.cluster.driver import Cluster
from cpkv.serving.model.request import Req

INF: Final = float("inf")
ROUTE, LAND = 0, 1


@dataclass
class DisaggRun:
    """What :meth:`Disaggregated.run` returns: each side's results, the end."""

    prefill_results: list[Any]
    decode_results: list[Any]
    end_us: float


class Disaggregated:
    """Both pools and the handoff between them (module docstring). ``trace`` (optional)
    takes each send (``transfer(p, r, start, end, size)``) and each landing
    (``landed(d, r, t)``)."""

    def __init__(
        self, prefill: Cluster, decode: Cluster, links: Sequence[Link], kv_bytes_per_token: int,
        record: HandoffRecord, trace: Any = None,
    ) -> None:  # fmt: skip
        self.prefill, self.decode, self.links = prefill, decode, list(links)
        self.kv_bytes_per_token, self.record, self.trace = kv_bytes_per_token, record, trace
        self.events: list[tuple[float, int, int, Req, Any]] = []
        self.seq = 0
        for k, sim in enumerate(prefill.sims):
            sim.prefill_only(self._handoff_of(k))

    def _handoff_of(self, p: int) -> Callable[[Req, float], float]:
        """Prefill instance ``p``'s handoff: the send over its link, the decode side's
        routing event; returns when the send ends."""
        link, tally, record = self.links[p], self.prefill.tallies[p], self.record
        per_token, events, trace = self.kv_bytes_per_token, self.events, self.trace

        def handoff(r: Req, now: float) -> float:
            size = r.prompt_tokens * per_token
            start, end = link.send(size, now)
            tally.left(r)
            record.handed(r, end, size)
            self.seq += 1
            heapq.heappush(events, (now, self.seq, ROUTE, r, end))
            if trace is not None:
                trace.transfer(p, r, start, end, size)
            return end

        return handoff

    def _decode_until(self, until_us: float) -> None:
        """The handoff events up to ``until_us``, in time order."""
        events, decode, trace = self.events, self.decode, self.trace
        while events and events[0][0] <= until_us:
            t, _, kind, r, x = heapq.heappop(events)
            if kind == ROUTE:
                d = decode.place(r, t)
                self.seq += 1
                heapq.heappush(events, (x, self.seq, LAND, r, d))
            else:
                decode.sims[x].deliver_built(r, t)
                if trace is not None:
                    trace.landed(x, r, t)

    def run(self, arriving: Iterable[Req]) -> DisaggRun:
        """Route every request, run both sides to the end, close them."""
        prefill = self.prefill
        for r in arriving:
            prefill.route(r)
            self._decode_until(r.arrival_us)
        for sim in prefill.sims:
            sim.advance(INF)
        self._decode_until(INF)
        for sim in self.decode.sims:
            sim.advance(INF)
        prefill_results = [sim.close() for sim in prefill.sims]
        decode_results = [sim.close() for sim in self.decode.sims]
        end = max(res.end_us for res in (*prefill_results, *decode_results))
        return DisaggRun(prefill_results, decode_results, end)
