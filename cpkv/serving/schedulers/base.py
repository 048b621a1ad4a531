"""The scheduler seam: what every scheduler offers the engine, and the registry of them.

Each iteration the engine (:class:`~cpkv.serving.engine.engine.Engine`) runs the decode
step of the running set, then asks its scheduler, in this order:

1. :meth:`Scheduler.order` — sort the waiting queue (the queue's order is the scheduler's to
   keep: a later sort starts from it);
2. :meth:`Scheduler.preemptions` — running requests to preempt for waiting ones, a group at a
   time (the engine preempts each group before the next is asked for);
3. :meth:`Scheduler.plan` — the iteration's :class:`~cpkv.serving.schedulers.plan.Plan`:
   the requests admitted with their prefix hits, the prefill chunks, what stopped
   admission.

Between events the engine does not ask: :meth:`Scheduler.quiet` says for how many of the
next iterations the plan is known (admit nothing, the same chunks), and the engine runs them
in closed form (:mod:`cpkv.serving.engine.stretch`). A scheduler that cannot tell returns
:data:`~cpkv.serving.schedulers.plan.NOT_QUIET` and is asked every iteration. A scheduler
whose quiet plans read nothing of a waiting queue but its head (:attr:`Scheduler.head_only`)
lets requests arrive at the back of it inside a stretch; one whose next iteration only
admits requests that join the prefill lane with whole chunks names them
(:meth:`Scheduler.joining`), and that iteration is the stretch's first.

:data:`SCHEDULERS` maps ``admit.policy`` to the scheduler class.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cpkv.core.registry import Registry
from cpkv.serving.model.request import Req
from cpkv.serving.schedulers.options import PolicyOptions, PriorityPreemption, QueueOrder
from cpkv.serving.schedulers.plan import NOT_QUIET, Admit, Plan, Quiet

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine


class Scheduler:
    """The base every scheduler extends: the never-fit rule and the policy options
    (:mod:`cpkv.serving.schedulers.options`). ``settings`` is the engine's
    :class:`~cpkv.serving.engine.settings.EngineSettings`."""

    name = "scheduler"
    uses_lane = False
    """Whether the engine keeps the prefilling requests in a
    :class:`~cpkv.serving.model.prefill_lane.PrefillLane` for this scheduler's uniform plans."""
    head_only = False
    """Whether :meth:`quiet` reads nothing of a waiting queue but its head, so that while the
    queue is not empty a request joining its back changes none of the quiet plans (when no
    queue order or priority preemption is configured: :attr:`arrivals_wait`)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        opts: PolicyOptions | None = settings.options
        self.options = opts
        self.margin = 0 if opts is None else opts.safety_margin_blocks
        self.queue_order = None
        self.priority = None
        if opts is not None:
            if QueueOrder.wanted(opts):
                self.queue_order = QueueOrder(opts, settings.block_size)
            if opts.schedule.priority_preemption:
                self.priority = PriorityPreemption(opts, settings.adder.max_running_requests)
        self.never_blocks = settings.capacity_blocks - self.margin
        # (an arrival that finds the queue not empty leaves the quiet plans as they are)
        self.arrivals_wait = self.head_only and self.queue_order is None and self.priority is None

    # -- arrivals ------------------------------------------------------------------------
    def never_fits(self, r: Req) -> bool:
        """Whether ``r`` could not be admitted even into an empty pool (it is rejected)."""
        return -(-(r.prompt_tokens + r.max_new_tokens) // self.settings.block_size) > (
            self.never_blocks
        )

    # -- each iteration --------------------------------------------------------------------
    def order(self, engine: Engine) -> None:
        """Sort the waiting queue before admission (the configured order, if any)."""
        if self.queue_order is not None and len(engine.waiting) > 1:
            if self.queue_order.sort(engine):
                self.reordered()

    def reordered(self) -> None:
        """The queue was reordered in a way the scheduler's memo of it must forget."""

    def preemptions(self, engine: Engine, decoded: int) -> Iterator[list[Req]]:
        """Groups of running requests to preempt for waiting ones (priority scheduling)."""
        if self.priority is not None and engine.waiting:
            yield from self.priority.preemptions(engine, decoded, self.chunked_slots(engine))

    def chunked_slots(self, engine: Engine) -> int:
        """Request slots the scheduler's partly prefilled requests take besides the running
        set, for priority preemption's full-batch test."""
        return 0

    def plan(self, engine: Engine, decoded: int) -> Plan:
        """The iteration's admissions and prefill rows (``decoded``: tokens the running set
        decodes in it)."""
        raise NotImplementedError

    def quiet(self, engine: Engine) -> Quiet:
        """How many of the next iterations admit nothing, and how; see
        :mod:`cpkv.serving.schedulers.plan` (a scheduler that looks ahead need look no
        further than :func:`~cpkv.serving.model.decode_ahead.decode_steps_ahead`)."""
        return NOT_QUIET

    def joining(self, engine: Engine) -> list[tuple[Req, Admit]]:
        """The requests the next iteration admits when that iteration is otherwise quiet and
        each of them joins the prefilling requests' lane with a whole chunk (the engine
        admits them and runs the iteration in closed form, :mod:`cpkv.serving.engine.stretch`);
        [] when that is not so (the iteration runs in full)."""
        return []

    def quiet_options(self, engine: Engine) -> bool:
        """Whether the policy options leave the next iterations' plans to the scheduler
        alone: no order that may change, no priority preemption while anything waits."""
        if len(engine.waiting) < 2 or self.queue_order is None:
            return self.priority is None or not engine.waiting
        return False

    # -- helpers -----------------------------------------------------------------------------
    def kv_stop(self, need_tokens: int, free_blocks: int) -> str:
        """The stop reason of a request whose ``need_tokens`` do not fit ``free_blocks``:
        ``safety_margin_blocks`` when they would fit without the margin, else ``kv_blocks``."""
        need = -(-need_tokens // self.settings.block_size)
        margin = self.margin
        return "safety_margin_blocks" if margin and need <= free_blocks + margin else "kv_blocks"

    def done(self, r: Req) -> None:
        """``r`` ended (any terminal state)."""


SCHEDULERS: Registry[type[Scheduler]] = Registry("scheduler")
"""Scheduler classes by ``admit.policy``."""

SCHEDULERS.register(
    "prefill_adder",
    "cpkv.serving.schedulers.prefill_adder:PrefillAdderScheduler",
    help="SGLang's PrefillAdder pass, one per iteration",
)
SCHEDULERS.register(
    "conservative",
    "cpkv.serving.schedulers.blocks:ConservativeScheduler",
    help="reserve prompt + max_new blocks at admission",
)
SCHEDULERS.register(
    "optimistic",
    "cpkv.serving.schedulers.blocks:OptimisticScheduler",
    help="admit on prompt blocks, preempt on growth",
)
SCHEDULERS.register(
    "iteration",
    "cpkv.serving.schedulers.iteration:IterationScheduler",
    help="admit first come, first served when the token budget can start the prompt",
)
SCHEDULERS.register(
    "profiled",
    "cpkv.serving.schedulers.profiled:ProfiledScheduler",
    help="admit when prompt + a quantile of finished output lengths fits the reservations",
)


def make_scheduler(settings: Any) -> Scheduler:
    """The scheduler of ``settings.policy``."""
    return SCHEDULERS.get(settings.policy)(settings)
