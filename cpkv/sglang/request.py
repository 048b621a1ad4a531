"""One request as SGLang's scheduler holds it (``Req`` and its ``kv`` record).

``fill`` is SGLang's ``full_untruncated_fill_ids``: the prompt's token ids, then the output
tokens generated up to its last refresh (:meth:`Req.refresh_fill`). The ids are any sequence
that slices to its own kind and compares by value (``array``, ``list``; a ``range`` for a
request that shares no token with another: its outputs continue the range; a
:class:`~cpkv.sglang.tokens.TokenRuns`: its outputs count up from ``output_token``); with a
list every output token of a request is ``output_token``. ``prefix_len`` is what the KV cache holds of it (a radix-cache hit,
or what earlier chunks computed), ``extend_end`` where this round's extend stops.
``kv_allocated`` / ``kv_committed`` count the KV slots of the row (prefix included);
``protected_len`` the leading ones the radix tree owns (the request's own lock keeps them), the
rest are the request's own. ``last_node`` and ``lock`` are its place in the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpkv.sglang.tokens import TokenRuns


class Req:
    """A request's scheduling state (see the module docstring)."""

    __slots__ = (
        "rid", "index", "prompt_len", "fill", "max_new_tokens", "ignore_eos", "output_len",
        "prefix_len", "extend_end", "last_node", "lock", "protected_len", "kv_allocated",
        "kv_committed", "holds_row", "is_retracted", "retracted_stain", "inflight_middle_chunks",
        "finished", "retractions", "arrival_us", "priority", "tag", "output_token", "last_token_us",
        "queue_entry", "refreshed_len", "host_hit", "best_node", "inserted_len", "host_loaded",
        "last_token_ct", "arrival_processed_tokens", "matched_len",
    )  # fmt: skip

    def __init__(
        self, rid: str, index: int, prompt: Sequence[int], max_new_tokens: int,
        ignore_eos: bool = False, arrival_us: float = 0.0, priority: int | None = None,
        output_token: int | None = None,
    ) -> None:  # fmt: skip
        self.rid, self.index = rid, index
        self.prompt_len = len(prompt)
        self.fill: Sequence[int] = prompt if isinstance(prompt, (range, TokenRuns)) else prompt[:]
        self.output_token = output_token
        self.last_token_us: float | None = None  # the end of the batch of its last token
        self.last_token_ct = 0  # that batch's pass (the loop's forward_ct)
        self.queue_entry = 0  # when it last joined the queue (an order, not a time)
        self.arrival_processed_tokens = 0  # the loop's prefill-token counter then (hrrn)
        self.matched_len = 0  # what its last queue match found (shortest-prefill-first)
        self.refreshed_len = 0  # SGLang's len(full_untruncated_fill_ids): 0 until a refresh
        # the host tier: the last match's hit past the device prefix and its deepest node,
        # what the request inserted into the tree so far, what its admission loaded back
        self.host_hit = 0
        self.best_node: Any = None
        self.inserted_len = 0
        self.host_loaded = 0
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = ignore_eos
        self.output_len = 0
        self.prefix_len = 0
        self.extend_end = 0
        self.last_node: Any = None
        self.lock: Any = None
        self.protected_len = 0
        self.kv_allocated = self.kv_committed = 0
        self.holds_row = False
        self.is_retracted = self.retracted_stain = False
        self.inflight_middle_chunks = 0
        self.finished = False
        self.retractions = 0
        self.arrival_us = arrival_us
        self.priority = priority
        self.tag: Any = None  # the caller's own record of the request

    def __repr__(self) -> str:
        return f"Req({self.rid})"

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len

    def refresh_fill(self, mark: bool = True) -> None:
        """``fill`` catches up with the outputs (SGLang refreshes it at a match, a mix into a
        prefill batch and a release; between those it lags). ``mark`` False: the tokens are
        read for a lookup only (prompt + outputs), which SGLang's ``fill`` does not see."""
        fill = self.fill
        missing = self.prompt_len + self.output_len - len(fill)
        if missing <= 0:
            if mark:
                self.refreshed_len = len(fill)
            return
        if self.output_token is None:
            self.fill = range(fill.start, fill.start + len(fill) + missing)  # type: ignore[attr-defined]
        elif isinstance(fill, TokenRuns):
            first = self.output_token + len(fill) - self.prompt_len
            self.fill = fill.then(first, missing)
        else:
            self.fill.extend([self.output_token] * missing)  # type: ignore[attr-defined]
        if mark:
            self.refreshed_len = len(self.fill)

    def next_output_finishes(self) -> bool:
        """Whether one more output token reaches ``max_new_tokens``."""
        return self.output_len + 1 >= self.max_new_tokens

    def reset_for_retract(self) -> None:
        """Back to the queue with its outputs: no prefix, no KV, no place in the tree."""
        self.retractions += 1
        self.prefix_len = 0
        self.last_node = None
        self.lock = None
        self.protected_len = 0
        self.extend_end = 0
        self.is_retracted = self.retracted_stain = True
        self.inflight_middle_chunks = 0
        self.kv_allocated = self.kv_committed = 0
        self.inserted_len = self.host_hit = 0
