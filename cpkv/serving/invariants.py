"""Seed 004's "common errors" as invariants of the serving loop, asserted after every
iteration when ``admit.serving.check_invariants`` is true (off by default, on in tests).

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

A check costs O(live requests); the loop takes the full path for every iteration while it
checks (no decode stretches), so that no iteration goes unchecked.
"""

from __future__ import annotations

from typing import Any

from cpkv.policies.budgets import weighted_work
from cpkv.serving.kv_pool import FINISHED, PREFILL, RUNNING, WAITING


class InvariantViolation(AssertionError):
    """The simulation broke one of seed 004's invariants (the message says which)."""


class Invariants:
    """The checks of one run (module docstring)."""

    def __init__(self, sim: Any, lifecycle: Any) -> None:
        self.sim, self.lifecycle = sim, lifecycle

    def fail(self, name: str, message: str) -> None:
        sim = self.sim
        raise InvariantViolation(
            f"invariant {name} broken at iteration {sim.iterations} (t={sim.now / 1000:.3f} ms): {message}"
        )

    def admitting(self, r: Any) -> None:
        if r.index in self.lifecycle.ended:
            self.fail("terminal", f"request {r.rid} ended and is admitted again")

    def check(self, decoded: int) -> None:
        sim, lc = self.sim, self.lifecycle
        pool, block, opts = sim.pool, sim.block_size, lc.opts
        # 1. the iteration's token budget
        prefill = sim.prefill_tokens
        if prefill:
            if sim.policy == "prefill_adder":
                chunk = sim.settings.adder.chunk_tokens
                if chunk is not None and prefill + decoded > chunk:
                    self.fail(
                        "token_budget",
                        f"{prefill} prefill + {decoded} decode tokens > chunk budget {chunk}",
                    )
            else:
                work = weighted_work(prefill, decoded, opts.verify_tokens, opts.weights)
                if work > sim.budget_tokens + 1e-9:
                    self.fail("token_budget", f"weighted work {work} > budget {sim.budget_tokens}")
        # the live requests, each once
        running = pool.running_reqs()
        prefilling = list(sim.prefilling)
        if sim.chunked is not None:
            prefilling.append(sim.chunked)
        ended = lc.ended
        held = used = 0
        for group, state in ((running, RUNNING), (prefilling, PREFILL), (sim.waiting, WAITING)):
            for r in group:
                if r.index in ended:
                    self.fail("terminal", f"request {r.rid} ended and is still scheduled")
                if r.state != state:
                    self.fail("terminal", f"request {r.rid} in the wrong set (state {r.state})")
                generated = pool.gen_now(r)
                if generated > r.max_new_tokens:
                    self.fail(
                        "first_token",
                        f"request {r.rid} generated {generated} > max_new {r.max_new_tokens}",
                    )
                kv = pool.kv_now(r)
                if kv > r.prompt_tokens + r.max_new_tokens:
                    self.fail(
                        "tokens",
                        f"request {r.rid} holds {kv} KV tokens > prompt + max_new = {r.prompt_tokens + r.max_new_tokens}",
                    )
                if state == RUNNING:
                    want = r.prompt_tokens + generated - r.device_prefix
                    if kv != want:
                        self.fail(
                            "first_token",
                            f"running request {r.rid} holds {kv} KV tokens, not prompt + generated - L1 prefix = {want}",
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
                            f"waiting request {r.rid}: fill {r.fill_tokens} != prompt {r.prompt_tokens} + generated {r.generated} (filled {r.filled_tokens})",
                        )
                    continue
                blocks = -(-kv // block)
                used += blocks
                held += max(blocks, r.reserved_blocks)
        if used != pool.used_blocks:
            self.fail(
                "blocks",
                f"the live requests hold {used} blocks, the pool counts {pool.used_blocks} used",
            )
        total = held + pool.free_blocks + opts.safety_margin_blocks
        if total != pool.capacity_blocks:
            self.fail(
                "blocks",
                f"held {held} + free {pool.free_blocks} + margin {opts.safety_margin_blocks} = {total} != capacity {pool.capacity_blocks}",
            )

    def finished(self, r: Any) -> None:
        """A request ends: a finished one generated exactly ``max_new_tokens``."""
        if r.state == FINISHED and r.generated != r.max_new_tokens:
            self.fail(
                "first_token",
                f"request {r.rid} finished with {r.generated} of {r.max_new_tokens} tokens",
            )
