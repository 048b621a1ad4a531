"""The block policies as schedulers: ``conservative`` and ``optimistic`` (a scan of the
queue for requests whose blocks fit), and the part they share with ``iteration`` and
``profiled`` (:class:`BlockScheduler`: the token budget's prefill rows, the slot limit).

Every iteration, after the running requests decoded:

* ``conservative``: scan the queue (``admit.kv.scan``: ``first_fit``, or ``fcfs_stop``) and
  admit each request whose reservation ``ceil((prompt - L1 hit + max_new left) /
  block_size)`` blocks is free; it grows inside its reservation and is never preempted by
  growth;
* ``optimistic``: the same scan on the current prompt blocks ``ceil((prompt - L1 hit) /
  block_size)``; growth that does not fit preempts (``admit.kv.victim``);
* then the token budget (:class:`~cpkv.serving.schedulers.budget.TokenBudget`) goes to the
  admitted requests' prompts, oldest admission first.

A scan re-examines the requests it skipped only when blocks were freed or the prefix cache
changed since the last scan; otherwise it looks at the newly queued requests alone (the
skipped ones cannot fit: they need no fewer blocks than before and no more are free). That
is also why its iterations are quiet between events: while blocks are only taken (decode
growth) and nothing is queued, the scan examines nothing.

``max_running_requests`` (``admit.max_running_requests`` with a block policy) counts the
running and the prefilling requests.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice
from typing import TYPE_CHECKING, Any

from cpkv.serving.model.prefill_lane import PrefillLane, admission_stamp
from cpkv.serving.model.request import Req
from cpkv.serving.schedulers.base import Scheduler
from cpkv.serving.schedulers.budget import TokenBudget
from cpkv.serving.schedulers.plan import FOREVER, NOT_QUIET, Admit, Plan, Prefill, Quiet

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine


class BlockScheduler(Scheduler):
    """What the block policies share: the token budget over the prefilling requests, the
    slot limit; :meth:`admissions` is each policy's own."""

    uses_lane = True

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.budget = TokenBudget(settings)
        opts = settings.options
        self.slot_limit = None if opts is None else opts.max_running_requests

    def slots_full(self, engine: Engine, prefilling: int) -> bool:
        """Whether ``max_running_requests`` is reached with ``prefilling`` requests in prefill."""
        limit = self.slot_limit
        return limit is not None and engine.pool.n_running + prefilling >= limit

    def admissions(self, engine: Engine, stops: list[str]) -> list[tuple[Req, Admit]]:
        """The requests this iteration's scan admits, in order (before any prefill)."""
        return []

    def plan(self, engine: Engine, decoded: int) -> Plan:
        stops: list[str] = []
        admitted = self.admissions(engine, stops)
        held, budget, _in_prefill = self.prefill_rows(
            engine, self.budget.prefill_tokens(decoded), prefills := []
        )
        chunk = self.budget.chunk
        for r, admit in admitted:
            if budget > 0:
                tokens = chunk(r.fill_tokens - admit.device_prefix - loaded(engine, admit), budget)
                budget -= tokens
                prefills.append(Prefill(r, tokens))
        return Plan(admitted, prefills, stops, held is not None, held or 0)

    def prefill_rows(
        self, engine: Engine, budget: int, prefills: list[Prefill]
    ) -> tuple[int | None, int, int]:
        """The prefilling requests' share of ``budget``, oldest admission first: each takes
        ``min(left, chunk)`` (the lane's rule) while the budget lasts, the one it runs out
        at what is left, those after it nothing. Returns ``(held, budget left, requests
        still prefilling after)``: ``held`` is the number of trailing requests the lane's
        rule does not reach (:class:`Plan`; their rows appended to ``prefills``), or None
        when the rows of those it reaches are appended instead (fewer of them: their tokens
        written out of the lane)."""
        prefilling, lane = engine.prefilling, engine.lane
        assert lane is not None
        n = len(prefilling)
        if n * lane.chunk <= budget:
            due = lane.due_members()
            lane.settle(due)
            used = lane.chunk * (n - len(due))
            used += sum(r.fill_tokens - r.filled_tokens for r in due)
            return 0, budget - used, n - len(due)
        reached, partial, completing, left = lane_share(lane, prefilling, budget)
        if reached >= n - reached:  # most take the lane's share: the rest are held
            if partial:
                prefills.append(Prefill(prefilling[reached], partial))
            return n - reached, left, n - completing
        chunk, settle, completing = self.budget.chunk, lane.settle_one, 0
        for r in prefilling:  # the budget runs out early: rows for those it reaches
            if budget <= 0:
                break
            settle(r)
            left = r.fill_tokens - r.filled_tokens
            tokens = chunk(left, budget)
            budget -= tokens
            prefills.append(Prefill(r, tokens))
            completing += tokens >= left
        return None, budget, n - completing

    def quiet_budget(self, engine: Engine) -> int | None:
        """The budget the prefilling requests leave in the coming iterations while nothing
        else changes (they take a whole chunk each: a prompt may end in the next one only
        with a whole chunk); None when that is not so, or when the options may change the
        plan."""
        lane = engine.lane
        assert lane is not None  # (a block scheduler's engine has one)
        budget = self.budget.prefill_tokens(engine.pool.n_running)
        used = len(engine.prefilling) * lane.chunk
        if used > budget or not self.quiet_options(engine):
            return None
        if engine.prefilling:
            before, whole = lane.next_due()
            if before == 0 and not whole:
                return None  # (a prompt ends in the next iteration with less than a chunk)
        return budget - used


def lane_share(lane: PrefillLane, prefilling: list[Req], budget: int) -> tuple[int, int, int, int]:
    """Where ``budget`` runs out along ``prefilling`` (the lane's members, in admission
    order) when each takes ``min(left, chunk)`` in turn: ``(reached, partial, completing,
    left)``, the members taking their whole share (the first ``reached``), the tokens the
    next one takes (0: none), how many of the first ``reached`` complete their prompt, the
    budget left. Only the members due to complete (fewer than ``chunk`` tokens left) are
    looked at one by one: every other takes ``chunk`` or what is left of the budget."""
    if budget <= 0:
        return 0, 0, 0, budget
    chunk, steps = lane.chunk, lane.steps
    start, completing = 0, 0
    for r in lane.due_members():
        at = bisect_left(prefilling, r.stamp, start, key=admission_stamp)
        whole = (at - start) * chunk  # the other members before it
        if budget < whole:
            break
        budget -= whole
        need = r.fill_tokens - r.lane_base - chunk * steps
        if budget < need:
            return at, budget, completing, 0
        budget -= need
        completing += 1
        start = at + 1
    else:
        at = len(prefilling)
        whole = (at - start) * chunk
        if budget >= whole:
            return at, 0, completing, budget - whole
    taken, partial = divmod(budget, chunk)
    return start + taken, partial, completing, 0


def loaded(engine: Engine, admit: Admit) -> int:
    """The part of ``admit``'s L2 hit that is loaded back (the rest is computed)."""
    host = admit.host_hit
    return host if host >= engine.load_threshold else 0


class ScanScheduler(BlockScheduler):
    """``conservative`` and ``optimistic``: the scan (module docstring)."""

    reserves = False

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.stop_at_first = settings.scan == "fcfs_stop"
        self.scan_version, self.scan_free, self.scan_seen = -1, -1, 0

    def reordered(self) -> None:
        self.scan_free = -1  # the next scan examines the whole queue

    def reserve(self, r: Req, device: int) -> int | None:
        """Tokens ``r``'s blocks reserve: its prompt to fill and, ``conservative``, every
        token left to generate."""
        if not self.reserves:
            return None
        return r.fill_tokens - device + r.max_new_tokens - r.generated

    def start(self, engine: Engine, free_blocks: int) -> int | None:
        """Where this iteration's scan starts in the queue (None: it examines nothing)."""
        waiting = engine.waiting
        full = free_blocks > self.scan_free or engine.hits.version != self.scan_version
        start = 0 if full else self.scan_seen
        if start >= len(waiting) or (start and self.stop_at_first):
            return None
        return start

    def admissions(self, engine: Engine, stops: list[str]) -> list[tuple[Req, Admit]]:
        pool, waiting, hits = engine.pool, engine.waiting, engine.hits
        free = pool.free_blocks
        start = self.start(engine, free)
        if start is None:
            return []
        out: list[tuple[Req, Admit]] = []
        in_prefill = len(engine.prefilling)
        upper = hits.l1_upper if self.options is None else None  # (swapped hits: look up)
        for r in islice(waiting, start, None):
            if self.slots_full(engine, in_prefill + len(out)):
                stops.append("max_running_requests")
                break
            fits = True
            device = upper(r) if upper is not None else None
            if device is not None:  # the need with the largest hit it can have: no lookup
                fits = pool.blocks_for(r.fill_tokens - device, self.reserve(r, device)) <= free
            if fits:
                device, host = engine.hit(r)
                reserve = self.reserve(r, device)
                need = pool.blocks_for(r.fill_tokens - device, reserve)
                if need <= free:
                    free -= need
                    out.append((r, Admit(device, host, reserve)))
                    continue
            reserve = self.reserve(r, device)
            stops.append(self.kv_stop(r.fill_tokens - device if reserve is None else reserve, free))
            if self.stop_at_first:
                break
        self.scan_seen = len(waiting) - len(out)
        self.scan_free = free
        self.scan_version = hits.version
        return out

    def quiet(self, engine: Engine) -> Quiet:
        if self.quiet_budget(engine) is None:
            return NOT_QUIET
        if engine.waiting:
            free_after = engine.pool.free_blocks - engine.pool.needed_blocks(1)
            if self.start(engine, free_after) is not None:
                return NOT_QUIET
        return Quiet(FOREVER, None, True)


class ConservativeScheduler(ScanScheduler):
    """Reserve every block a request may grow to at admission (module docstring)."""

    name = "conservative"
    reserves = True


class OptimisticScheduler(ScanScheduler):
    """Admit on the prompt's blocks; growth that does not fit preempts (module docstring)."""

    name = "optimistic"
