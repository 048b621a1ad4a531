"""The optimistic block policy: admit on prompt blocks, grow per token, preempt on overflow.

The growth loop:

* ``used`` starts at the admitted requests' prompt blocks;
* each step ``s = 0 .. max(max_new_tokens) - 1`` visits the still-active requests in
  admission order. A request with ``s >= max_new_tokens`` has finished: it leaves the
  active set without an event and, by default, *keeps its blocks*
  (``on_finish: free`` returns them and records a ``finished`` event). Any other request
  grows by one token, taking a new block when its length crosses a block boundary;
* if that new block does not fit, victims are preempted (all their blocks freed, dropped
  for good; no requeue in this model) until it fits. With the default ``scan_order`` the
  victim is the request that tried to grow, so its token is lost with it; with another
  order, the grower advances once enough others were preempted. Victims are chosen by what
  requests hold before the growth (the grower's new token and block are still pending);
* every event records ``used_blocks`` right after it, so it never exceeds the capacity
  (the same numbers as adding the block, seeing ``used > capacity`` and subtracting the
  victim's blocks including the new one).

Victims are chosen by :data:`cpkv.policies.victims.VICTIMS` (``admit.kv.victim``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cpkv.policies.blocks import (
    DEFAULT_KV,
    DEFAULT_SCANS,
    BlockOutcome,
    BlockRequest,
    GrowthEvent,
    KvBlocks,
    admit_by_scan,
    check_requests,
    checked_kv,
)
from cpkv.policies.victims import VICTIMS, Holder


def optimistic(requests: Sequence[BlockRequest], kv: KvBlocks = DEFAULT_KV) -> BlockOutcome:
    """Admit on current prompt blocks, then grow token by token, preempting on overflow."""
    checked_kv(kv)
    check_requests(requests)
    needs = [r.prompt_blocks(kv.block_size) for r in requests]
    admission = admit_by_scan(
        "optimistic", requests, needs, kv, kv.scan or DEFAULT_SCANS["optimistic"]
    )
    admitted = [
        Holder(i, r, r.prompt_tokens, need)
        for i, (r, need, d) in enumerate(zip(requests, needs, admission.decisions, strict=True))
        if d.admitted
    ]
    events, used, peak = _grow({h.order: h for h in admitted}, kv, admission.reserved_blocks)
    return BlockOutcome(
        "optimistic",
        admission.admitted,
        admission.reserved_blocks,
        admission.decisions,
        events,
        used,
        peak,
    )


def _grow(
    active: dict[int, Holder], kv: KvBlocks, used: int
) -> tuple[tuple[GrowthEvent, ...], int, int]:
    """The growth loop over ``active`` (admission order); returns (events, final, peak used)."""
    choose = VICTIMS.get(kv.victim)
    events: list[GrowthEvent] = []
    peak = used
    steps = max((h.request.max_new_tokens for h in active.values()), default=0)
    for step in range(steps):
        for holder in list(active.values()):
            if holder.order not in active:
                continue  # preempted earlier in this step to make room for another
            if step >= holder.request.max_new_tokens:
                del active[holder.order]
                if kv.on_finish == "free":
                    used -= holder.blocks
                    events.append(GrowthEvent(step, holder.request.rid, "finished", used))
                continue
            extra = math.ceil((holder.length_tokens + 1) / kv.block_size) - holder.blocks
            while used + extra > kv.capacity_blocks and holder.order in active:
                victim = choose(list(active.values()), holder)
                del active[victim.order]
                used -= victim.blocks
                events.append(GrowthEvent(step, victim.request.rid, "preempted", used))
            if holder.order in active:
                holder.length_tokens += 1
                holder.blocks += extra
                used += extra
                events.append(GrowthEvent(step, holder.request.rid, "advanced", used))
            peak = max(peak, used)
    return tuple(events), used, peak
