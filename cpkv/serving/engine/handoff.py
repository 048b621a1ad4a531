"""An instance of a disaggregated deployment: the prefill side's handoff and the decode
side's entry for requests whose KV arrives built.

**Prefill only** (:class:`HeldKv`). A request whose prompt completes generates its first
token and leaves: the engine hands it to the deployment (``handoff(r, now)``: the end of its
iteration), which sends its KV and answers when the send ends; until then the request's
blocks stay held in this pool (SGLang's prefill side keeps a request in its in-flight queue
until the transfer reports success), then they are freed. The freed blocks count from the
first iteration that starts at or after the send's end. A request asking for at most one
token finishes here (there is nothing to decode).

**Decode side** (:class:`BuiltRequests`). A request whose KV has arrived (``deliver_built``)
waits in a receive queue; at the start of each iteration (and of each closed-form stretch)
the queue is admitted in order, head first, by SGLang's decode-side rule
(``disaggregation/decode.py``, ``DecodePreallocQueue``): with ``R`` reserved tokens per
decoding request (``reserved_decode_tokens``), ``n`` running requests holding
``retractable`` tokens (prompt plus output) and ``free`` free tokens::

    single     = max over running of (prompt + min(max_new, 4096)) - retractable   (0: none)
    allocatable = free - max(R x n, single)
    admit the head while prompt + R <= allocatable
                     and prompt + min(max_new, 4096) - retractable <= allocatable,
    then allocatable -= prompt + R

(and while the running requests are fewer than ``max_running_requests``). An admitted
request takes blocks for its prompt and its first token and starts decoding at once: its
first token reaches the client then. A request that could not be admitted even into an
empty pool is rejected (``exceeds_kv_capacity``). SGLang runs this rule *before* the prefill
(the decode side preallocates, then the prefill side computes into it); cpkv runs it when
the KV lands, so the wait the rule imposes shows up after the transfer instead of before
the prefill (``decode_wait`` in the TTFT split).

Within a decode stretch both sides of the rule move by the same tokens per step (the
running requests' growth against their retractable tokens), so a queue the rule blocks at a
stretch's start stays blocked until a request finishes, up to the page rounding: the
stretches end at every finish and every delivery, where the rule is checked again.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

from cpkv.serving.model.request import WAITING, Req
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine
    from cpkv.serving.model.kv_pool import KvPool

INF = float("inf")


class HeldKv:
    """The blocks of requests handed off and still being sent: ``(release_us, kv tokens,
    reserved blocks)``, freed in release order; ``next_us``: the next release (inf: none)."""

    __slots__ = ("heap", "seq", "next_us")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.next_us = INF

    def hold(self, release_us: float, kv: int, reserved: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (release_us, self.seq, kv, reserved))
        self.next_us = self.heap[0][0]

    def release_due(self, pool: KvPool, now: float) -> None:
        """Free the blocks whose sends ended by ``now``."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, _, kv, reserved = heapq.heappop(heap)
            pool.release_kv(kv, reserved)
        self.next_us = heap[0][0] if heap else INF

    def release_all(self, pool: KvPool) -> None:
        """The run ended: every send ends, every block is freed."""
        self.release_due(pool, INF)


class BuiltRequests:
    """The decode side's receive queue and SGLang's rule for it (module docstring)."""

    __slots__ = (
        "queue", "reserved", "max_running", "block", "capacity_tokens", "admitted", "most",
    )  # fmt: skip

    def __init__(self, reserved: int, max_running: int | None, block: int, capacity: int) -> None:
        self.queue: deque[Req] = deque()
        self.reserved, self.max_running, self.block = reserved, max_running, block
        self.capacity_tokens = capacity * block
        self.admitted = 0
        self.most = 0  # the largest prompt + clipped output admitted so far: a bound of single

    def fits_alone(self, r: Req) -> bool:
        """Whether the rule admits ``r`` into an empty pool."""
        need = max(r.prompt_tokens + self.reserved, r.prompt_tokens + _clipped(r))
        kv_blocks = -(-(r.prompt_tokens + 1) // self.block)
        return need <= self.capacity_tokens and kv_blocks * self.block <= self.capacity_tokens

    def admit(self, engine: Engine) -> None:
        """Admit the queue's head while the rule allows (module docstring)."""
        pool, queue, reserved = engine.pool, self.queue, self.reserved
        n = pool.n_running
        retractable = pool.context_tokens()
        single = 0
        if n and self.most - retractable > reserved * n:  # (else it cannot matter)
            single = max(r.prompt_tokens + _clipped(r) for r in pool.running) - retractable
        allocatable = pool.free_blocks * self.block - max(reserved * n, single)
        while queue:
            if self.max_running is not None and n >= self.max_running:
                return
            r = queue[0]
            required = r.prompt_tokens + reserved
            if max(required, r.prompt_tokens + _clipped(r) - retractable) > allocatable:
                return
            kv = r.prompt_tokens + 1
            if not pool.fits(kv, None):
                return
            queue.popleft()
            allocatable -= required
            most = r.prompt_tokens + _clipped(r)
            if most > self.most:
                self.most = most
            engine.admit_built(r, kv)
            retractable += kv
            n += 1
            self.admitted += 1


def _clipped(r: Req) -> int:
    """``min(max_new_tokens, 4096)``, SGLang's clip of a request's remaining output."""
    return min(r.max_new_tokens, CLIP_MAX_NEW_TOKENS)


def receive(engine: Engine) -> None:
    """The decode side's arrivals: requests whose KV landed by ``engine.now`` join the receive
    queue (one that the rule could not admit even into an empty pool is rejected)."""
    arrivals, now, built = engine.arrivals, engine.now, engine.built
    while arrivals.next_us <= now:
        r = arrivals.pop()
        if not built.fits_alone(r):
            engine.reject(r, "exceeds_kv_capacity", now)
            continue
        r.state = WAITING
        built.queue.append(r)
