"""The ``profiled`` policy as a scheduler: admission on the prompt plus a profiled output.

A waiting request (in queue order; ``admit.kv.scan``) is admitted when its prompt blocks
plus the output a quantile of the recently finished requests' lengths predicts
(:class:`~cpkv.policies.profiled.OutputQuantile`, ``admit.profiled``; its own
``max_new_tokens`` when that is smaller) fit the free blocks left after every admitted
request's outstanding reservation (reserved blocks it does not hold yet). The reservation
is not held: growth beyond it preempts, as with ``optimistic``. One stop is counted per
scan (the last request refused). Prefill then follows the token budget, as for every block
policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cpkv.policies.profiled import OutputQuantile
from cpkv.serving.model.request import FINISHED, Req
from cpkv.serving.schedulers.blocks import BlockScheduler
from cpkv.serving.schedulers.plan import FOREVER, NOT_QUIET, Admit, Quiet

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine


class ProfiledScheduler(BlockScheduler):
    """Reserve a profiled output beside the prompt (module docstring)."""

    name = "profiled"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.estimator = OutputQuantile(settings.options.profiled)
        self.stop_at_first = settings.scan == "fcfs_stop"
        self.finished = self.reservation_exceeded = 0

    def admissions(self, engine: Engine, stops: list[str]) -> list[tuple[Req, Admit]]:
        pool, block, est = engine.pool, engine.pool.block_size, self.estimator
        outstanding = 0
        for r in [*pool.running_reqs(), *engine.prefilling]:
            held = -(-pool.kv_now(r) // block)
            if r.policy.reserved_blocks > held:
                outstanding += r.policy.reserved_blocks - held
        free, out, stop = pool.free_blocks, [], None
        in_prefill = len(engine.prefilling)
        for r in engine.waiting:
            if self.slots_full(engine, in_prefill + len(out)):
                stop = "max_running_requests"
                break
            device, host = engine.hit(r)
            reserved = est.reserve(r.max_new_tokens - r.generated)
            kv = r.fill_tokens - device
            need = -(-(kv + reserved) // block)
            if need + outstanding <= free:
                r.policy.reserved_output_tokens = r.generated + reserved
                r.policy.reserved_blocks = need
                outstanding += need - -(-kv // block)
                free -= -(-kv // block)
                out.append((r, Admit(device, host)))
                continue
            stop = self.kv_stop(kv + reserved + outstanding * block, free)
            if self.stop_at_first:
                break
        if stop is not None:
            stops.append(stop)
        return out

    def quiet(self, engine: Engine) -> Quiet:
        if self.quiet_budget(engine) is None or engine.waiting:
            return NOT_QUIET
        return Quiet(FOREVER, None, True)

    def done(self, r: Req) -> None:
        if r.state != FINISHED:
            return
        self.finished += 1
        if 0 <= r.policy.reserved_output_tokens < r.generated:
            self.reservation_exceeded += 1
        self.estimator.observe(r.generated)
