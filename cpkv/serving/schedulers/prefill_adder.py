"""SGLang's PrefillAdder as a scheduler (``admit.policy: prefill_adder``): one pass of
:func:`~cpkv.serving.schedulers.adder_pass.adder_pass` per iteration over the waiting queue,
after the running requests' decode tokens (a mixed batch), with SGLang's adaptive
``new_token_ratio`` weighting the running requests' headroom.

At most one request is partly prefilled (SGLang's chunked request): it is the engine's only
prefilling request and continues first in the next pass.

A request is rejected when it arrives if it could never fit even an empty pool: by blocks
(the base rule), or by the pass's memory check, ``prompt + min(max_new, 4096) + page >=``
the pool's tokens.

Quiet iterations: with no chunked request, the pass admits nothing while the queue is empty
(forever) or while its head is refused; once a pass has refused the head, its fate in the
coming iterations is the pass itself run on the pool, ratio and headroom those iterations
will see (:func:`~cpkv.serving.model.decode_ahead.lookahead`), up to the first that admits
it or stops for another reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from cpkv.serving.model.decode_ahead import decode_steps_ahead, lookahead, memory_refusals
from cpkv.serving.model.request import Req
from cpkv.serving.schedulers.adder_pass import adder_pass, memory_tokens
from cpkv.serving.schedulers.base import Scheduler
from cpkv.serving.schedulers.plan import FOREVER, NOT_QUIET, Admit, Plan, Prefill, Quiet
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS as CLIP

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine

LOOKAHEAD: Final = 64
"""Iterations the pass itself is run ahead on a refused head at most (the engine asks again
after); a refusal that only the memory check can end is looked ahead for longer."""


class PrefillAdderScheduler(Scheduler):
    """One SGLang PrefillAdder pass per iteration (module docstring)."""

    name = "prefill_adder"
    head_only = True

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.budgets = settings.adder
        self.never_tokens = self.never_blocks * settings.block_size
        self.refused: Req | None = None  # the queue's head, when the last pass refused it

    def never_fits(self, r: Req) -> bool:
        if super().never_fits(r):
            return True
        max_new = r.max_new_tokens
        clipped = max_new if max_new < CLIP else CLIP
        return r.prompt_tokens + clipped + self.settings.block_size >= self.never_tokens

    def chunked_slots(self, engine: Engine) -> int:
        return 1 if engine.prefilling else 0

    def plan(self, engine: Engine, decoded: int) -> Plan:
        pool = engine.pool
        chunked = engine.prefilling[0] if engine.prefilling else None
        chunk = None
        if chunked is not None:
            max_new = chunked.max_new_tokens
            filled = chunked.filled_tokens
            chunk = (chunked.fill_tokens - filled, max_new if max_new < CLIP else CLIP, filled)
        waiting = engine.waiting
        hits: list[tuple[int, int]] = []  # the hits the pass looked up, to admit with
        res = adder_pass(
            pool.free_blocks * pool.block_size,
            decoded,
            pool.headroom_tokens() * engine.ratio.current,
            pool.n_running,
            self.budgets,
            chunk,
            _candidates(engine, waiting, hits) if waiting else iter(()),
        )
        prefills = [Prefill(chunked, res.chunk_tokens)] if res.chunk_tokens else []
        admitted = []
        for k, (extend, _loaded, _cut) in enumerate(res.admitted or ()):
            device, host = hits[k]
            admitted.append((waiting[k], Admit(device, host)))
            prefills.append(Prefill(waiting[k], extend))
        self.refused = waiting[0] if waiting and not res.admitted else None
        return Plan(admitted, prefills, [] if res.stop is None else [res.stop])

    def quiet(self, engine: Engine) -> Quiet:
        if engine.prefilling or not self.quiet_options(engine):
            return NOT_QUIET
        waiting = engine.waiting
        if not waiting:
            return Quiet(FOREVER)
        if waiting[0] is not self.refused:
            return NOT_QUIET  # (a head the pass has not refused yet: it is most likely taken)
        return self._refused_head(engine, waiting[0], decode_steps_ahead(engine.pool))

    def _refused_head(self, engine: Engine, head: Req, limit: int) -> Quiet:
        """How long the pass keeps refusing ``head`` (module docstring). The pass itself is
        run on each iteration ahead (at most :data:`LOOKAHEAD`) until it refuses ``head``
        for memory with the compute budgets and slots to spare: then only the memory check
        can change (the rest is constant while only decode steps happen), and it alone is
        evaluated on the iterations after, up to ``limit``
        (:func:`~cpkv.serving.model.decode_ahead.memory_refusals`)."""
        budgets, block = self.budgets, engine.pool.block_size
        steps = 0
        stop: str | None = None
        device, _host = engine.hit(head)
        max_new = head.max_new_tokens - head.generated
        left = max_new if max_new < CLIP else CLIP
        for free_blocks, decoded, headroom, ratio in lookahead(engine.pool, engine.ratio, limit):
            if steps == LOOKAHEAD:
                break
            res = adder_pass(
                free_blocks * block, decoded, headroom * ratio, decoded, budgets, None,
                _candidates(engine, [head], []),
            )  # fmt: skip
            if res.admitted or (steps and res.stop != stop):
                break
            stop = res.stop
            steps += 1
            if stop == "rem_total_tokens" and _spare_compute(budgets, decoded):
                need = memory_tokens(head.fill_tokens - device, left, budgets.page)
                steps += memory_refusals(engine.pool, engine.ratio, steps, limit, need)
                break
        return Quiet(steps, stop) if steps else NOT_QUIET


def _spare_compute(budgets: Any, decoded: int) -> bool:
    """Whether the compute and chunk budgets never stop a pass at its top while ``decoded``
    tokens decode (a memory refusal then stays one until the memory check passes)."""
    chunk = budgets.chunk_tokens
    return budgets.max_prefill_tokens - decoded > 0 and (chunk is None or chunk - decoded > 0)


def _candidates(
    engine: Engine, waiting: Sequence[Req], hits: list[tuple[int, int]]
) -> Iterator[tuple[int, int, int, int, int]]:
    """The pass's candidates (:class:`~cpkv.serving.schedulers.adder_pass.Candidate`
    fields) in queue order, each looked up when the pass reaches it."""
    hit = engine.hit
    for r in waiting:
        device, host = found = hit(r)
        hits.append(found)
        max_new = r.max_new_tokens
        left = max_new - r.generated
        yield (
            r.fill_tokens, device, host, left if left < CLIP else CLIP,
            max_new if max_new < CLIP else CLIP,
        )  # fmt: skip
