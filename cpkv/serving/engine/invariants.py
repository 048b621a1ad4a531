"""The block model's common errors as invariants of the serving engine, asserted after
every iteration when ``admit.serving.check_invariants`` is true (off by default, on in
tests).

:meth:`Invariants.check` raises :class:`InvariantViolation` (an internal error: a bug of the
simulation, never of the user's input) naming the invariant and the request:

1. ``token_budget``: the iteration's token budget is never exceeded: for the block policies
   ``w_prefill x prefill + w_decode x decode + w_verify x verify <= budget_tokens`` whenever
   the iteration carried prefill; for ``prefill_adder`` with chunking, ``prefill + decode <=
   chunked_prefill_size`` (the mixed batch's chunk budget);
2. ``first_token``: a request never generates more than ``max_new_tokens`` and a finished one
   generated exactly that many; a running request's KV is its prompt minus its L1 prefix
   plus every token it generated (the first token's KV slot counted once: no prompt/max_new
   off-by-one), a prefilling request's is its fill minus its L1 prefix;
3. ``blocks``: every block is accounted for: the blocks the live requests hold (``ceil(kv /
   block)``, or their reservation) plus the free blocks plus the safety margin are the
   pool; no request that is not live holds any (after a preemption, a cancellation or a
   timeout every block is returned). Shared prefixes live in the L1 partition of the
   tiered cache, which no request frees; in the pool each block has one holder, so a
   block freed twice or never shows here;
4. ``recompute``: a recompute victim waits with its whole context to prefill again (fill =
   prompt + generated, nothing filled): its future prefill is counted;
5. ``terminal``: a request that ended (finished, rejected, timed out, cancelled) is never in
   the queue, the prefill set or the running set again, and is never admitted;
6. ``tokens``: KV is counted in tokens: no request holds more KV than its prompt plus its
   ``max_new_tokens`` tokens.

A check costs O(live requests); the engine runs every iteration in full while it checks
(no closed-form stretches), so that no iteration goes unchecked.
"""

from __future__ import annotations

from typing import Any

from cpkv.policies.budgets import weighted_work
from cpkv.serving.model.request import FINISHED, PREFILL, RUNNING, WAITING


class InvariantViolation(AssertionError):
    """The simulation broke one of its invariants (the message says which)."""


class Invariants:
    """The checks of one engine (module docstring)."""

    def __init__(self, engine: Any, opts: Any) -> None:
        self.engine, self.opts = engine, opts
        self.ended: set[int] = set()  # requests that ended
        self.checks = 0

    def fail(self, name: str, message: str) -> None:
        engine = self.engine
        raise InvariantViolation(
            f"invariant {name} broken at iteration {engine.iterations} "
            f"(t={engine.now / 1000:.3f} ms): {message}"
        )

    def admitting(self, r: Any) -> None:
        if r.index in self.ended:
            self.fail("terminal", f"request {r.rid} ended and is admitted again")

    def check(self, decoded: int) -> None:
        """After an iteration that decoded ``decoded`` tokens."""
        self.checks += 1
        self._budget(decoded)
        self._requests()

    def _budget(self, decoded: int) -> None:
        engine, opts = self.engine, self.opts
        prefill = engine.prefill_tokens
        if not prefill:
            return
        settings = engine.settings
        if settings.policy == "prefill_adder":
            chunk = settings.adder.chunk_tokens
            if chunk is not None and prefill + decoded > chunk:
                self.fail(
                    "token_budget",
                    f"{prefill} prefill + {decoded} decode tokens > chunk budget {chunk}",
                )
            return
        work = weighted_work(prefill, decoded, opts.verify_tokens, opts.weights)
        if work > settings.budget_tokens + 1e-9:
            self.fail("token_budget", f"weighted work {work} > budget {settings.budget_tokens}")

    def _requests(self) -> None:
        engine = self.engine
        pool, block = engine.pool, engine.pool.block_size
        if engine.lane is not None:
            engine.lane.settle(engine.prefilling)
        held = used = 0
        groups = (
            (pool.running_reqs(), RUNNING), (engine.prefilling, PREFILL), (engine.waiting, WAITING),
        )  # fmt: skip
        for group, state in groups:
            for r in group:
                kv = self._request(r, state)
                if state == WAITING:
                    continue
                blocks = -(-kv // block)
                used += blocks
                held += max(blocks, r.reserved_blocks)
        if used != pool.used_blocks:
            self.fail(
                "blocks",
                f"the live requests hold {used} blocks, the pool counts {pool.used_blocks} used",
            )
        margin = self.opts.safety_margin_blocks
        total = held + pool.free_blocks + margin
        if total != pool.capacity_blocks:
            self.fail(
                "blocks",
                f"held {held} + free {pool.free_blocks} + margin {margin} = {total} != "
                f"capacity {pool.capacity_blocks}",
            )

    def _request(self, r: Any, state: int) -> int:
        """Check one live request in the set of ``state``; its KV tokens."""
        pool = self.engine.pool
        if r.index in self.ended:
            self.fail("terminal", f"request {r.rid} ended and is still scheduled")
        if r.state != state:
            self.fail("terminal", f"request {r.rid} in the wrong set (state {r.state})")
        generated = pool.gen_now(r)
        if generated > r.max_new_tokens:
            self.fail(
                "first_token", f"request {r.rid} generated {generated} > max_new {r.max_new_tokens}"
            )
        kv = pool.kv_now(r)
        if kv > r.prompt_tokens + r.max_new_tokens:
            self.fail(
                "tokens",
                f"request {r.rid} holds {kv} KV tokens > prompt + max_new = "
                f"{r.prompt_tokens + r.max_new_tokens}",
            )
        if state == RUNNING:
            want = r.prompt_tokens + generated - r.device_prefix
            if kv != want:
                self.fail(
                    "first_token",
                    f"running request {r.rid} holds {kv} KV tokens, not prompt + generated - "
                    f"L1 prefix = {want}",
                )
        elif state == PREFILL:
            want = r.fill_tokens - r.device_prefix
            if kv != want:
                self.fail(
                    "first_token",
                    f"prefilling request {r.rid} holds {kv} KV tokens, not fill - L1 prefix = {want}",
                )
        else:
            if kv or r.reserved_blocks:
                self.fail("blocks", f"waiting request {r.rid} still holds {kv} KV tokens")
            if r.fill_tokens != r.prompt_tokens + r.generated or r.filled_tokens:
                self.fail(
                    "recompute",
                    f"waiting request {r.rid}: fill {r.fill_tokens} != prompt {r.prompt_tokens} "
                    f"+ generated {r.generated} (filled {r.filled_tokens})",
                )
        return kv

    def finished(self, r: Any) -> None:
        """A request ends: a finished one generated exactly ``max_new_tokens``."""
        self.ended.add(r.index)
        if r.state == FINISHED and r.generated != r.max_new_tokens:
            self.fail(
                "first_token",
                f"request {r.rid} finished with {r.generated} of {r.max_new_tokens} tokens",
            )
