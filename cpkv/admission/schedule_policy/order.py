"""SGLang 0.5.23's ``SchedulePolicy.calc_priority``: the waiting queue's order before a pass.

:meth:`WaitingQueueOrder.sort` reorders the scheduler's waiting list in place, as SGLang sorts its
``waiting_queue`` in place: every sort is stable (ties keep the current order, which is the
order the previous pass left plus the arrivals appended since), except ``hrrn`` whose ties
go by ``rid`` (string order) and ``random``.

* ``fcfs``: the queue as it is; with priority scheduling, by ``(priority x sign,
  queue_entry_us)`` (``sign`` is ``+1`` with ``schedule_low_priority_values_first``, else
  ``-1``).
* ``lof``: by ``-max_new_tokens`` (the request's own, unclipped); with priority scheduling by
  ``(priority x sign, -max_new_tokens)``.
* ``random``: ``random.shuffle`` with the order's own seeded generator (SGLang shuffles with
  the process-wide one).
* cache-aware (``lpm``, ``dfs-weight``, ``hrrn``, ``shortest-prefill-first``): first every
  request is matched in the device/host prefix cache in queue order (``match(r) -> (D,
  H)``: the device prefix and the host hit after it, tokens of the prompt and output, page
  aligned, *not* capped), giving ``matched = min(D + H, prompt + output - 1)``. A request
  with ``D <= in_batch_prefix_check_threshold`` is then matched in the in-batch tree of the
  requests checked before it (:class:`~cpkv.admission.schedule_policy.trees.
  WaitingPrefixTree`): sharing at least ``in_batch_prefix_deprioritize_threshold`` tokens
  defers it, else it is inserted. Then:

  - ``lpm``: by ``-matched``, deferred requests last;
  - ``hrrn``: by ``(-waited / uncached, rid)`` with ``uncached = max(0, prompt - matched)``
    (outputs not counted), ``waited = max(0, processed_tokens - arrival_processed_tokens)``
    (a float division, as SGLang's); ``uncached == 0`` first (``-inf``), deferred last;
  - ``shortest-prefill-first``: by ``(deferred, max(1, prompt + output - matched),
    queue_entry_us)``;
  - ``dfs-weight``: :func:`~cpkv.admission.schedule_policy.trees.dfs_weight_order` (SGLang
    computes the deferral here too and never reads it; the model skips it).

  ``lpm`` and ``hrrn`` switch to ``fcfs`` (no match, no sort, no priority) while the queue
  holds more than ``WAITING_QUEUE_PREFIX_MATCH_MAX = 128`` requests; ``dfs-weight`` and
  ``shortest-prefill-first`` never do. Without a prefix cache (SGLang's disabled radix cache)
  the cache-aware policies are ``fcfs``, and ``shortest-prefill-first`` is an error (SGLang's
  "requires prefix caching" is raised inside a ``try`` that turns it into "Unknown
  schedule_policy").

Not modelled: ``routing-key``; SGLang's side effects on the cache (a cache-aware match
touches each waiting prefix in the LRU, in queue order; the cache-agnostic policies refresh
the first 128 waiting prefixes, head last, every 32nd call) are the caller's to apply.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cpkv.admission.schedule_policy.config import CACHE_AWARE, SchedulePolicyConfig
from cpkv.admission.schedule_policy.trees import SiblingRank, WaitingPrefixTree, dfs_weight_order
from cpkv.core.errors import ConfigError

WAITING_QUEUE_PREFIX_MATCH_MAX = 128
"""SGLang's constant: above this many waiting requests ``lpm`` and ``hrrn`` run as ``fcfs``."""
FCFS_WHEN_LONG = ("lpm", "hrrn")
_INF = float("inf")


class WaitingRequest(Protocol):
    """What the order reads of a waiting request (SGLang's ``Req`` fields in brackets).

    ``priority`` is already resolved (:func:`resolve_priority`); ``queue_entry_us`` is when it
    last entered the waiting queue (``time_stats.wait_queue_entry_time``; a preempted or
    retracted request re-enters with a new one); ``arrival_processed_tokens`` is the
    scheduler's prefill-token counter at that moment; ``output_tokens`` is
    ``len(output_ids)`` (kept by a preempted request: its re-prefill covers them);
    ``hash_ids`` are the prompt's block hashes, or None (its tokens are its own).
    """

    rid: str
    prompt_tokens: int
    output_tokens: int
    max_new_tokens: int
    priority: int
    queue_entry_us: float
    arrival_processed_tokens: int
    hash_ids: Sequence[int] | None


Match = Callable[[Any], tuple[int, int]]
"""``match(request) -> (device_prefix_tokens, host_hit_tokens)`` in the scheduler's prefix cache."""


@dataclass(slots=True)
class QueuedRequest:
    """A plain :class:`WaitingRequest` (tests, and schedulers without a request class of their
    own)."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int = 128
    priority: int = 0
    queue_entry_us: float = 0.0
    arrival_processed_tokens: int = 0
    output_tokens: int = 0
    hash_ids: tuple[int, ...] | None = None


def resolve_priority(priority: int | None, low_values_first: bool) -> int:
    """SGLang's value for a request sent without a priority under priority scheduling: the
    least urgent there is (``sys.maxsize``, or ``-sys.maxsize - 1`` when larger values go
    first). A given priority is kept."""
    if priority is not None:
        return priority
    return sys.maxsize if low_values_first else -sys.maxsize - 1


def _by_priority_then_entry(r: Any) -> tuple[int, float]:
    return (r.priority, r.queue_entry_us)


def _by_inverse_priority_then_entry(r: Any) -> tuple[int, float]:
    return (-r.priority, r.queue_entry_us)


class WaitingQueueOrder:
    """One run's ``SchedulePolicy``: build it once, call :meth:`sort` before every pass."""

    __slots__ = (
        "policy", "configured", "priority", "sign", "rng", "tree", "block_size",
        "check_threshold", "deprioritize_threshold",
    )  # fmt: skip

    def __init__(
        self,
        config: SchedulePolicyConfig,
        *,
        block_size: int = 1,
        seed: int = 0,
        prefix_cache: bool = True,
    ) -> None:
        policy = config.schedule_policy
        config.validate_schedule()
        if policy in CACHE_AWARE and not prefix_cache:
            if policy == "shortest-prefill-first":
                raise ConfigError(
                    "admit.schedule_policy: shortest-prefill-first needs a prefix cache "
                    "(SGLang refuses it with the radix cache disabled)"
                )
            policy = "fcfs"  # SGLang's _validate_and_adjust_policy
        self.configured = config.schedule_policy
        self.policy = policy
        self.priority = config.enable_priority_scheduling
        self.sign = 1 if config.schedule_low_priority_values_first else -1
        self.rng = random.Random(seed)
        self.block_size = block_size
        self.check_threshold = config.in_batch_prefix_check_threshold
        self.deprioritize_threshold = config.in_batch_prefix_deprioritize_threshold
        self.tree = WaitingPrefixTree(block_size, self.deprioritize_threshold)

    def active_policy(self, queue_length: int) -> str:
        """The policy one ordering of a queue this long runs (``fcfs`` above 128 for lpm/hrrn)."""
        if self.policy in FCFS_WHEN_LONG and queue_length > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return "fcfs"
        return self.policy

    def sort(
        self,
        queue: list[Any],
        match: Match | None = None,
        processed_tokens: int = 0,
        sibling_rank: SiblingRank | None = None,
    ) -> None:
        """Order ``queue`` in place as ``calc_priority`` orders SGLang's waiting queue.

        ``match`` is needed by the cache-aware policies (called once per request, in queue
        order, before anything moves); ``processed_tokens`` (the scheduler's running count of
        prefill tokens computed) by ``hrrn``; ``sibling_rank`` (when each device-tree node was
        created) by ``dfs-weight`` to break ties between equally heavy subtrees.
        """
        policy = self.policy
        if policy == "fcfs":
            if self.priority:
                queue.sort(
                    key=_by_priority_then_entry
                    if self.sign == 1
                    else _by_inverse_priority_then_entry
                )
            return
        if policy == "lof":
            if self.priority:
                sign = self.sign
                queue.sort(key=lambda r: (r.priority * sign, -r.max_new_tokens))
            else:
                queue.sort(key=lambda r: -r.max_new_tokens)
            return
        if policy == "random":
            self.rng.shuffle(queue)
            return
        if len(queue) > WAITING_QUEUE_PREFIX_MATCH_MAX and policy in FCFS_WHEN_LONG:
            return
        if match is None:
            raise ValueError(f"schedule policy {policy!r} needs the prefix cache's match")
        device, matched, deferred = self.prefix_matches(queue, match, policy != "dfs-weight")
        if policy == "lpm":
            keys: list[Any] = [_INF if deferred[i] else -matched[i] for i in range(len(queue))]
        elif policy == "hrrn":
            keys = []
            for i, r in enumerate(queue):
                if deferred[i]:
                    keys.append((_INF, r.rid))
                    continue
                uncached = r.prompt_tokens - matched[i]
                if uncached <= 0:
                    keys.append((-_INF, r.rid))
                    continue
                waited = processed_tokens - r.arrival_processed_tokens
                keys.append((-((waited if waited > 0 else 0) / uncached), r.rid))
        elif policy == "shortest-prefill-first":
            keys = []
            for i, r in enumerate(queue):
                work = r.prompt_tokens + r.output_tokens - matched[i]
                keys.append((deferred[i], work if work > 1 else 1, r.queue_entry_us))
        else:  # dfs-weight
            order = dfs_weight_order(
                [r.hash_ids for r in queue],
                [r.prompt_tokens for r in queue],
                device,
                [r.rid for r in queue],
                self.block_size,
                sibling_rank,
            )
            queue[:] = [queue[i] for i in order]
            return
        order = sorted(range(len(queue)), key=keys.__getitem__)
        queue[:] = [queue[i] for i in order]

    def prefix_matches(
        self, queue: Sequence[Any], match: Match, in_batch: bool = True
    ) -> tuple[list[int], list[int], list[bool]]:
        """Per request, in queue order: the device prefix ``D``, ``matched`` (``min(D + H,
        prompt + output - 1)``) and whether the in-batch check defers it (``in_batch=False``
        skips that check: it changes no order of ``dfs-weight``)."""
        n = len(queue)
        device = [0] * n
        matched = [0] * n
        deferred = [False] * n
        tree = self.tree
        tree.reset()
        check = self.check_threshold if in_batch else -(1 << 62)
        limit = self.deprioritize_threshold
        for i, r in enumerate(queue):
            d, h = match(r)
            cap = r.prompt_tokens + r.output_tokens - 1
            if cap < 0:
                cap = 0
            device[i] = d
            matched[i] = d + h if d + h < cap else cap
            if d <= check:
                hashes = r.hash_ids
                if tree.match(hashes, r.prompt_tokens) >= limit:
                    deferred[i] = True
                else:
                    tree.insert(hashes, r.prompt_tokens)
        return device, matched, deferred
