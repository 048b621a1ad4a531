"""What every serving instance shares, whichever scheduler decides its iterations (cpkv's
loop, :mod:`~cpkv.serving.engine.engine`; SGLang's loop,
:mod:`~cpkv.serving.engine.sglang_engine`; vLLM's scheduler,
:mod:`~cpkv.serving.engine.vllm_engine`): the driver interface (``deliver``, ``run``; each
engine its own ``advance`` and ``close``), the run's counters and the rejection of a request
that cannot be served.
"""

from __future__ import annotations

from typing import Any, Final

from cpkv.serving.input.arrivals import Arrivals, Upcoming
from cpkv.serving.model.request import REJECTED, Req

INF: Final = float("inf")
COUNTERS = (
    "prefill_tokens", "decode_tokens", "first_tokens", "loaded_tokens", "l1_hit_tokens", "admissions",
)  # fmt: skip


def new_counters() -> dict[str, Any]:
    """A run's counters at its start: the token and admission counts, preemptions and
    rejections by reason."""
    counters: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
    counters["preemptions"] = {}
    counters["rejects"] = {}
    return counters


class Instance:
    """The part of a serving instance the driver sees besides its own ``advance(until_us)``
    and ``close()``; a subclass sets ``arrivals``, ``counters`` and ``sink``."""

    arrivals: Upcoming
    counters: dict[str, Any]
    sink: Any

    def deliver(self, r: Req) -> None:
        """``r`` arrived (at ``r.arrival_us``, not before the requests delivered so far); it
        joins the queue at the first iteration that starts at or after its arrival."""
        arrivals = self.arrivals
        assert isinstance(arrivals, Arrivals)  # (a decode side's land: deliver_built)
        arrivals.deliver(r)

    def run(self) -> Any:
        """The whole run (the arrivals given at construction), then ``close()``."""
        self.advance(INF)
        return self.close()

    def advance(self, until_us: float) -> None:  # pragma: no cover (each engine's own)
        raise NotImplementedError

    def close(self) -> Any:  # pragma: no cover (each engine's own)
        raise NotImplementedError

    def reject(self, r: Req, reason: str, now: float) -> None:
        """``r`` cannot be served (``reason``): it ends ``now`` (the engine's clock),
        counted by reason."""
        r.state, r.reject_reason, r.finished_us = REJECTED, reason, now
        rejects = self.counters["rejects"]
        rejects[reason] = rejects.get(reason, 0) + 1
        self.ended(r)

    def ended(self, r: Req) -> None:
        """``r`` reached a terminal state (the engine's sink takes it)."""
        self.sink.done(r)
