"""The ``iteration`` policy as a scheduler: the token budget is the admission rule.

Every iteration the prefilling requests take their chunks of the budget first (oldest
admission first, :mod:`cpkv.serving.schedulers.budget`); then, while budget is left, the
queue's head is admitted (on its current prompt blocks, like ``optimistic``: growth that
does not fit preempts) when its blocks are free, and starts its prefill with what is left.
A head whose blocks are not free stops admission (``kv_blocks``); it stays stopped until
blocks are freed, which only an event does, so the iterations in between are quiet. An
iteration that admits requests which each compute a whole chunk in it and have more than a
chunk left (they join the lane as its members compute theirs), with no prompt ending in it,
is quiet but for those admissions (:meth:`IterationScheduler.joining`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cpkv.serving.model.request import Req
from cpkv.serving.schedulers.blocks import BlockScheduler, loaded
from cpkv.serving.schedulers.plan import ADMITS, FOREVER, NOT_QUIET, Admit, Plan, Prefill, Quiet

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine


class IterationScheduler(BlockScheduler):
    """Admit first come, first served within the iteration's token budget (module docstring)."""

    name = "iteration"
    head_only = True

    def plan(self, engine: Engine, decoded: int) -> Plan:
        prefills: list[Prefill] = []
        held, budget, in_prefill = self.prefill_rows(
            engine, self.budget.prefill_tokens(decoded), prefills
        )
        admitted, rows, stop, budget = self._admissions(
            engine, budget, engine.pool.free_blocks, in_prefill
        )
        prefills.extend(rows)
        stops = [] if stop is None else [stop]
        if self.options is not None and budget <= 0 and len(admitted) < len(engine.waiting):
            stops.append("token_budget")
        return Plan(admitted, prefills, stops, held is not None, held or 0)

    def _admissions(
        self, engine: Engine, budget: int, free: int, in_prefill: int
    ) -> tuple[list[tuple[Req, Admit]], list[Prefill], str | None, int]:
        """First come, first served from the queue's head while ``budget`` lasts, with
        ``free`` blocks and ``in_prefill`` requests prefilling: the admissions, their first
        prefill rows, what stopped them (None: the budget or the queue ran out), the budget
        left."""
        chunk, pool, waiting = self.budget.chunk, engine.pool, engine.waiting
        admitted: list[tuple[Req, Admit]] = []
        rows: list[Prefill] = []
        while budget > 0 and len(admitted) < len(waiting):
            r = waiting[len(admitted)]
            if self.slots_full(engine, in_prefill):
                return admitted, rows, "max_running_requests", budget
            device, host = engine.hit(r)
            need = pool.blocks_for(r.fill_tokens - device, None)
            if need > free:
                return admitted, rows, self.kv_stop(r.fill_tokens - device, free), budget
            free -= need
            admit = Admit(device, host)
            left = r.fill_tokens - device - loaded(engine, admit)
            tokens = chunk(left, budget)
            budget -= tokens
            in_prefill += tokens < left
            admitted.append((r, admit))
            rows.append(Prefill(r, tokens))
        return admitted, rows, None, budget

    def quiet(self, engine: Engine) -> Quiet:
        left = self.quiet_budget(engine)
        if left is None:
            return NOT_QUIET
        waiting = engine.waiting
        if not waiting:
            return Quiet(FOREVER, None, True)
        if left <= 0:
            return Quiet(FOREVER, "token_budget" if self.options is not None else None, True)
        if self.slots_full(engine, len(engine.prefilling)):
            return Quiet(FOREVER, "max_running_requests", True)
        if self.margin:
            return NOT_QUIET  # (which of the two names a refusal takes changes as blocks go)
        pool, r, lane = engine.pool, waiting[0], engine.lane
        assert lane is not None
        device, _host = engine.hit(r)
        free_after = pool.free_blocks - pool.needed_blocks(1)
        if pool.blocks_for(r.fill_tokens - device, None) <= free_after:
            return ADMITS if left >= lane.chunk else NOT_QUIET  # (a whole chunk: joining)
        return Quiet(FOREVER, "kv_blocks", True)

    def joining(self, engine: Engine) -> list[tuple[Req, Admit]]:
        left = self.quiet_budget(engine)
        if left is None or left <= 0 or self.margin or not engine.waiting:
            return []
        lane, pool = engine.lane, engine.pool
        assert lane is not None
        if engine.prefilling and lane.next_due()[0] == 0:
            return []  # (a prompt ends in it)
        admitted, rows, _stop, _left = self._admissions(
            engine, left, pool.free_blocks - pool.needed_blocks(1), len(engine.prefilling)
        )  # (the plan's, after the iteration's decode step)
        chunk = lane.chunk
        for k, (r, admit) in enumerate(admitted):
            if rows[k].tokens != chunk or r.fill_tokens - admit.device_prefix <= chunk:
                return []  # (a part of a chunk, or a prompt that ends in it)
            if loaded(engine, admit):
                return []
        return admitted
