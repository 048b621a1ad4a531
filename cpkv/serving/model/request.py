"""A request's state during a serving run: :class:`Req` and the states it passes through.

A request is built when it arrives (``PENDING`` until it joins the queue), waits
(``WAITING``), is admitted and prefilled (``PREFILL``: it holds KV blocks for its prompt and
computes it chunk by chunk), decodes (``RUNNING``, one token an iteration) and ends:
``FINISHED`` (it generated ``max_new_tokens``), ``REJECTED`` (it could never fit, or a
preemption aborted it), ``TIMED_OUT`` (it waited too long in the queue) or ``CANCELLED``
(its client gave up). A preempted request goes back to ``WAITING`` holding nothing; its
prompt then includes the tokens it generated (``fill_tokens``), which it computes again.

While it runs, a request's KV length, tokens generated and tokens left are not stored but
derived from the KV pool's step counter (:class:`~cpkv.serving.model.kv_pool.KvPool`):
``kv_base + step``, ``max_new - finish_step + step``, ``finish_step - step``.
"""

from __future__ import annotations

from typing import Any, Final

PENDING: Final = 0
WAITING: Final = 1
PREFILL: Final = 2
RUNNING: Final = 3
FINISHED: Final = 4
REJECTED: Final = 5
TIMED_OUT: Final = 6
CANCELLED: Final = 7
ENDED = frozenset({FINISHED, REJECTED, TIMED_OUT, CANCELLED})
LIVE = frozenset({WAITING, PREFILL, RUNNING})
STATE_NAMES = (
    "pending", "waiting", "prefill", "running", "finished", "rejected", "timed_out", "cancelled",
)  # fmt: skip


class Req:
    """One request's mutable state during a run.

    Given: ``index`` (its place in the run's input order), ``rid``, ``arrival_us``,
    ``prompt_tokens``, ``max_new_tokens``, ``hash_ids`` (its prompt's prefix blocks, or
    None), ``fixed_l1_tokens`` / ``fixed_l2_tokens`` (its hits when there is no prefix
    cache), ``priority`` (0 when not given), ``deadline_ms`` and ``cancel_ms`` (after its
    arrival; None: not given).

    Live: ``state``; ``fill_tokens`` (tokens to prefill: the prompt, plus what it generated
    before a preemption), ``filled_tokens`` (of those, in KV so far: hits and computed
    chunks), ``device_prefix`` (its L1 hit, which holds no pool blocks), ``host_hit`` (its L2
    hit loaded back), ``kv_tokens`` (KV held in the pool while not running),
    ``reserved_blocks``; the running set's bookkeeping ``kv_base``, ``context_base``,
    ``finish_step``, ``advanced_step``, ``epoch`` (bumped when it leaves the running set:
    stale heap entries carry the old one), ``stamp`` (the order it was admitted in);
    ``policy`` (:class:`~cpkv.serving.schedulers.options.RequestPolicy`, when the run has
    policy options); its token gaps' bookkeeping (:mod:`cpkv.serving.record.token_gaps`):
    ``token_us`` and ``token_iteration`` (the end and the iteration of its last token, once
    it has one; while it decodes in cpkv's loop, of the token that began its run of
    consecutive tokens), ``run_tokens`` (the tokens it had when that run began; -1: not in
    a run), ``gap_history`` (cpkv's loop: the runs it ended and its gaps of several
    iterations, which leave the pooled gaps if it does not finish; None: none).

    Reported: ``admitted_us`` / ``first_token_us`` / ``finished_us`` (first admission, first
    token, end), ``handoff_us`` (a disaggregated deployment: the prefill side's first token,
    when the request left for a decode instance), ``generated``, ``prefilled`` (prompt tokens computed, recomputation
    included), ``preemptions``, ``recomputed`` (KV tokens preemptions discarded), ``l1_hit``
    / ``l2_hit`` (at its first admission), ``reject_reason``.
    """

    __slots__ = (
        "index", "rid", "arrival_us", "prompt_tokens", "max_new_tokens", "hash_ids",
        "fixed_l1_tokens", "fixed_l2_tokens", "priority", "deadline_ms", "cancel_ms",
        "state", "epoch", "generated", "fill_tokens", "device_prefix", "host_hit",
        "filled_tokens", "kv_tokens", "reserved_blocks", "stamp", "kv_base", "context_base",
        "finish_step", "advanced_step", "admitted_us", "first_token_us", "finished_us",
        "preemptions", "l1_hit", "l2_hit", "recomputed", "prefilled", "reject_reason", "policy",
        "lane_base", "lane_token", "token_us", "token_iteration", "run_tokens", "gap_history",
        "handoff_us",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        rid: str,
        arrival_us: float,
        prompt_tokens: int,
        max_new_tokens: int,
        l1_cached_tokens: int = 0,
        l2_cached_tokens: int = 0,
        hash_ids: tuple[int, ...] | None = None,
        priority: int | None = None,
        deadline_ms: float | None = None,
        cancel_ms: float | None = None,
    ) -> None:
        """Request ``index`` from its fields, not arrived yet."""
        self.index, self.rid, self.arrival_us = index, rid, arrival_us
        self.prompt_tokens, self.max_new_tokens = prompt_tokens, max_new_tokens
        self.hash_ids = hash_ids
        self.fixed_l1_tokens, self.fixed_l2_tokens = l1_cached_tokens, l2_cached_tokens
        self.priority: int = 0 if priority is None else priority
        self.deadline_ms, self.cancel_ms = deadline_ms, cancel_ms
        self.state = self.epoch = self.generated = self.fill_tokens = 0
        self.device_prefix = self.host_hit = self.filled_tokens = self.kv_tokens = 0
        self.reserved_blocks = self.stamp = self.kv_base = self.context_base = 0
        self.finish_step = self.preemptions = self.recomputed = self.prefilled = 0
        self.advanced_step = self.run_tokens = -1
        self.lane_base = self.lane_token = self.token_iteration = 0
        self.admitted_us: float | None = None
        self.first_token_us: float | None = None
        self.finished_us: float | None = None
        self.token_us: float | None = None
        self.handoff_us: float | None = None
        self.l1_hit: int | None = None
        self.l2_hit: int | None = None
        self.reject_reason: str | None = None
        self.policy: Any = None
        self.gap_history: Any = None

    @classmethod
    def of(cls, index: int, given: Any, arrival_us: float) -> Req:
        """Request ``index`` from a :class:`~cpkv.serving.input.workload.ServingRequest`."""
        return cls(
            index, given.rid, arrival_us, given.prompt_tokens, given.max_new_tokens,
            given.l1_cached_tokens, given.l2_cached_tokens, given.hash_ids, given.priority,
            given.deadline_ms, given.cancel_ms,
        )  # fmt: skip

    # what the waiting-queue orders read (cpkv.admission.schedule_policy.WaitingRequest)
    @property
    def output_tokens(self) -> int:
        return self.generated

    @property
    def queue_entry_us(self) -> float:
        return self.policy.queue_entry_us

    @property
    def arrival_processed_tokens(self) -> int | None:
        return self.policy.arrival_processed_tokens

    @property
    def deadline_us(self) -> float:
        return self.policy.deadline_us

    def __repr__(self) -> str:
        return f"Req({self.rid!r}, {STATE_NAMES[self.state]})"
