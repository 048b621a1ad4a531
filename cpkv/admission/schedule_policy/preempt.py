"""SGLang 0.5.23's ``PrefillAdder.preempt_to_schedule``: whom a waiting request preempts.

The scheduler calls it (priority scheduling on, ``disable_priority_preemption`` off) for a
candidate of the prefill scan once the batch is full (``batch_is_full``: the request slots
are taken). Nothing in the pass clears that flag again, so after one preemption every later
candidate of the same pass must preempt to be admitted; a ``False`` stops the scan.

:func:`choose_preemption` is the decision:

1. the running requests that are not finished, sorted (stably, from batch order) least
   urgent first: by ``(priority x -sign, -queue_entry_us)`` (``sign`` ``+1`` when low values
   go first), so among equal priorities the one that entered the waiting queue last;
2. ``need = fill - prefix + min(max_new_tokens, 4096) + slot_reserve - rem_total_tokens``
   for the candidate (:func:`preemption_need_tokens`);
3. walking that order while ``(candidate.priority - running.priority) x -sign`` exceeds the
   threshold: take the request and subtract its reserved decode headroom
   (:func:`running_token_offset`), stop once ``need <= 0``; the first request that is not
   urgent enough ends the walk;
4. nothing is preempted unless at least one request was taken and ``need <= 0``.

Caveats that are SGLang's, kept: ``fill`` and ``prefix`` are the candidate's
``len(full_untruncated_fill_ids)`` and ``prefix_len`` *before* this pass matches it (the
scheduler calls ``init_next_round_input`` after the preemption): ``0`` and ``0`` for a
request never examined yet, so its prompt is not counted; the victims' resident KV is not
counted either, only their decode headroom (``rem_total_tokens`` grows by that much when they
go). Victims are released in batch order (``total_offset`` loses their headroom in that
order) and SGLang re-queues them from a ``set``, in an order that depends on object
addresses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cpkv.workload.request import CLIP_MAX_NEW_TOKENS


class RunningRequest(Protocol):
    """What the preemption reads of a running request (``Req`` fields in brackets)."""

    priority: int
    queue_entry_us: float  # when it last entered the waiting queue (wait_queue_entry_time)
    max_new_tokens: int  # sampling_params.max_new_tokens
    output_tokens: int  # len(output_ids)
    ignore_eos: bool  # sampling_params.ignore_eos
    finished: bool  # req.finished(): done but not yet filtered out of the batch


@dataclass(slots=True)
class RunningState:
    """A plain :class:`RunningRequest`."""

    priority: int
    queue_entry_us: float
    max_new_tokens: int
    output_tokens: int = 0
    ignore_eos: bool = False
    finished: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    """A committed preemption: ``victims`` are positions in the running list, in batch order
    (the order SGLang releases them), ``chosen`` the same positions in the order picked, and
    ``freed_offsets`` each victim's headroom, in ``victims`` order."""

    victims: tuple[int, ...]
    chosen: tuple[int, ...]
    freed_offsets: tuple[float, ...]


def running_token_offset(r: Any, new_token_ratio: float) -> float:
    """``min(max_new_tokens - output_tokens, 4096) x ratio`` (ratio ``1.0`` with ignore_eos):
    SGLang's ``_get_running_request_total_token_offset``."""
    ratio = 1.0 if r.ignore_eos else new_token_ratio
    left = r.max_new_tokens - r.output_tokens
    return (left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) * ratio


def preemption_need_tokens(
    fill_tokens: int, prefix_tokens: int, max_new_tokens: int, slot_reserve_tokens: int = 0
) -> int:
    """The candidate's side of ``min_tokens_to_remove`` (before ``- rem_total_tokens``): its
    fill length and prefix as last set (see the module docstring), plus its clipped
    ``max_new_tokens`` and the allocator's request-slot reserve (0 for plain pools)."""
    clipped = max_new_tokens if max_new_tokens < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
    return fill_tokens - prefix_tokens + clipped + slot_reserve_tokens


def choose_preemption(
    candidate_priority: int,
    need_tokens: int,
    rem_total_tokens: float,
    running: Sequence[Any],
    new_token_ratio: float,
    threshold: int,
    low_values_first: bool,
) -> Preemption | None:
    """The running requests the candidate preempts, or None when it may not preempt."""
    sign = 1 if low_values_first else -1
    candidates = [i for i, r in enumerate(running) if not r.finished]
    candidates.sort(key=lambda i: (running[i].priority * -sign, -running[i].queue_entry_us))
    left = need_tokens - rem_total_tokens
    chosen: list[int] = []
    for i in candidates:
        r = running[i]
        if (candidate_priority - r.priority) * -sign > threshold:
            chosen.append(i)
            left -= running_token_offset(r, new_token_ratio)
            if left <= 0:
                break
        else:
            break
    if not chosen or left > 0:
        return None
    victims = tuple(sorted(chosen))
    return Preemption(
        victims,
        tuple(chosen),
        tuple(running_token_offset(running[i], new_token_ratio) for i in victims),
    )
