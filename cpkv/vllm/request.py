"""A request as vLLM 0.32.0's V1 scheduler sees it: its tokens, its state, its block-key chain.

``num_tokens`` counts the prompt and the generated tokens; ``num_computed_tokens`` advances
when a step is scheduled and drops to 0 on preemption; ``stop_at`` is the length at which it
finishes (its ``max_tokens``, or the scheduler's ``max_model_len``). ``tokens`` are the
prompt's ids only: a generated token is unique to its request (the step loop feeds back a
token of the request's own, never EOS), so a block holding one, and every block after it,
matches no other request's and is keyed by the request's own key (:func:`own_keys` and the
block's number). ``block_keys`` are the prefix-cache keys
of the request's full blocks, one per block, extended as tokens arrive (vLLM hashes them in
``Request``; here a ``BlockKeys`` chain interns a prompt's blocks to integers). ``content``, when
given, names the blocks instead of ``tokens`` (a :class:`BlockNames`: keys that are equal for
two blocks exactly when their token prefixes are; a serving run's requests carry no token
ids). ``discarded_tokens`` counts the computed tokens preemptions threw away. ``blocks`` and
``num_cached_blocks`` are the KV cache manager's per-request state (vLLM keeps them in the
manager, by request id): the blocks held, and how many leading ones are cached (None until the
first allocation with prefix caching on).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, Protocol

WAITING: Final = 0
RUNNING: Final = 1
PREEMPTED: Final = 2
FINISHED: Final = 3

OWN_KEYS: Final = -(1 << 32)
"""The key of block 0 of the request with index 0 among the blocks only it holds (see
:func:`own_keys`): keys of such blocks are negative, other keys are not (interned keys count
from 0, a serving request's names are hashes masked to :data:`NAME_BITS`)."""
NAME_BITS: Final = (1 << 62) - 1
"""The bits a block's name keeps of its hash (non-negative, and a native integer)."""


def own_keys(index: int) -> int:
    """The key of block 0 of the request with ``index`` among the blocks only it holds; block
    ``b`` takes this plus ``b`` (a request has fewer than 2**32 blocks): negative, and
    distinct for every request and block."""
    return OWN_KEYS * (index + 1)


def is_own_key(key: Hashable) -> bool:
    """Whether ``key`` names a block only its request holds (:func:`own_keys`)."""
    return type(key) is int and key < 0


def extend_own_keys(keys: list, own: int, num_full_blocks: int) -> None:
    """Append to ``keys`` the keys of blocks ``len(keys)`` to ``num_full_blocks - 1`` as
    blocks only their request holds (``own``: its :func:`own_keys`)."""
    keys.extend(range(own + len(keys), own + num_full_blocks))


class BlockNames(Protocol):
    """The keys of a request's full blocks, for a request known without its token ids."""

    def extend(self, keys: list[Hashable], num_full_blocks: int) -> None:
        """Append to ``keys`` the keys of blocks ``len(keys)`` to ``num_full_blocks - 1``:
        equal for two blocks exactly when the tokens up to their ends are."""


class Request:
    """One request's scheduling state (ordered in a priority queue by priority, arrival, id)."""

    __slots__ = (
        "request_id",
        "index",
        "tokens",
        "num_prompt_tokens",
        "max_tokens",
        "priority",
        "arrival_time",
        "status",
        "num_computed_tokens",
        "num_preemptions",
        "block_keys",
        "num_tokens",
        "blocks",
        "num_cached_blocks",
        "stop_at",
        "content",
        "discarded_tokens",
    )

    def __init__(
        self,
        request_id: str,
        index: int,
        prompt: list[int],
        max_tokens: int,
        priority: int = 0,
        arrival_time: float = 0.0,
    ) -> None:
        if not prompt:
            raise ValueError(f"request {request_id}: empty prompt")
        if max_tokens < 1:
            raise ValueError(f"request {request_id}: max_tokens must be >= 1")
        self.request_id = request_id
        self.index = index
        self.tokens = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival_time = arrival_time
        self.status = WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.block_keys: list[Hashable] = []
        self.num_tokens = len(self.tokens)
        self.blocks: list[int] = []
        self.num_cached_blocks: int | None = None
        self.stop_at = self.num_prompt_tokens + max_tokens  # (the scheduler caps it)
        self.content: BlockNames | None = None
        self.discarded_tokens = 0

    @classmethod
    def sized(
        cls,
        request_id: str,
        index: int,
        num_prompt_tokens: int,
        max_tokens: int,
        content: BlockNames,
        priority: int = 0,
        arrival_time: float = 0.0,
    ) -> Request:
        """A request known by its prompt length and its blocks' names (no token ids)."""
        request = cls(request_id, index, [0], max_tokens, priority, arrival_time)
        if num_prompt_tokens < 1:
            raise ValueError(f"request {request_id}: empty prompt")
        request.tokens = []
        request.num_prompt_tokens = request.num_tokens = num_prompt_tokens
        request.stop_at = num_prompt_tokens + max_tokens
        request.content = content
        return request

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    def order_key(self) -> tuple[int, float, str]:
        """vLLM's ``Request.__lt__``: lower priority value first, then earlier arrival, then id."""
        return (self.priority, self.arrival_time, self.request_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status})"
        )
