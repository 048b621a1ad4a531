"""What SGLang's loop (:class:`~cpkv.sglang.loop.Loop`) tells its caller: subclass
:class:`Listener` and override the events you need (the loop calls every one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cpkv.sglang.loop import Batch
    from cpkv.sglang.request import Req


class Listener:
    """What the loop tells its caller; the defaults do nothing."""

    def launch(self, batch: Batch) -> None:
        """``batch`` runs now (set ``batch.end_us``)."""

    def first_token(self, req: Req, batch: Batch) -> None:
        """``req`` got its first output token at the end of ``batch`` (every token it gets
        sets ``req.last_token_us``)."""

    def finished(self, req: Req, batch: Batch) -> None:
        """``req`` finished at the end of ``batch``."""

    def emitted(self, batch: Batch) -> None:
        """Requests with a token before got one from ``batch`` (its ``gaps`` and ``late``)."""

    def retracted(self, req: Req, held_tokens: int) -> None:
        """``req`` went back to the queue with its outputs, freeing the ``held_tokens`` KV
        slots it had (the tree keeps what it had inserted of them)."""

    def preempted(self, req: Req) -> None:
        """``req`` gave way to a higher-priority request and went back to the queue."""
