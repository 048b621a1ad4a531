"""The reference host (L2) KV allocator: seed 003's algorithm over a token-slot free list.

The free list is a 1-D int64 tensor of token slots, in allocation order.

* ``alloc(n)`` takes the first ``n`` slots (FIFO).
* ``alloc_contiguous_preferred(n)`` keeps the FIFO prefix when it is already a run of
  consecutive slots; otherwise it looks at the free list in whole pages (chunks of
  ``page_size`` list entries), keeps the chunks that are themselves consecutive slots,
  orders them by address and takes the lowest-addressed run of ``n / page_size`` chunks
  whose start addresses step by exactly one page; when there is none it falls back to FIFO.
* ``free(slots)`` appends the slots to the end of the free list (HostKVCache's
  ``torch.cat``).

This is the algorithm cpkv measures other implementations against: it rescans and
recompacts the whole free list on every contiguous-preferred call.
"""

from __future__ import annotations

from typing import Any


class HostAllocator:
    """Reference implementation (torch, CPU)."""

    name = "reference"

    def __init__(self, page_size: int, free_slots: Any) -> None:
        import torch

        self.torch = torch
        self.page_size = int(page_size)
        self.free_slots = free_slots

    def available_size(self) -> int:
        return int(self.free_slots.numel())

    def free_slot_list(self) -> list[int]:
        return self.free_slots.tolist()

    def _check(self, need: int) -> None:
        if need % self.page_size:
            raise ValueError(f"need_size {need} is not a multiple of page_size {self.page_size}")

    def alloc(self, need_size: int) -> Any:
        self._check(need_size)
        if need_size > self.available_size():
            return None
        taken = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return taken

    def alloc_contiguous_preferred(self, need_size: int) -> Any:
        self._check(need_size)
        torch, ps, fs = self.torch, self.page_size, self.free_slots
        if need_size > fs.numel():
            return None
        if need_size == 0:
            return self.alloc(0)
        head = fs[:need_size]
        if torch.equal(head, head[0] + torch.arange(need_size, dtype=fs.dtype)):
            return self.alloc(need_size)
        chunks_n = fs.numel() // ps
        chunks = fs[: chunks_n * ps].view(chunks_n, ps)
        intact = torch.all(chunks == chunks[:, :1] + torch.arange(ps, dtype=fs.dtype), dim=1)
        if not bool(intact.any()):
            return self.alloc(need_size)
        chunk_ids = torch.nonzero(intact).squeeze(1)
        starts, order = torch.sort(chunks[chunk_ids, 0])
        chunk_ids = chunk_ids[order]
        first = _first_run(starts.tolist(), need_size // ps, ps)
        if first < 0:
            return self.alloc(need_size)
        picked = chunk_ids[first : first + need_size // ps]
        positions = (picked[:, None] * ps + torch.arange(ps, dtype=torch.int64)).reshape(-1)
        taken = fs[positions]
        keep = torch.ones(fs.numel(), dtype=torch.bool)
        keep[positions] = False
        self.free_slots = fs[keep]
        return taken

    def free(self, slots: Any) -> int:
        self.free_slots = self.torch.cat([self.free_slots, slots.to(self.free_slots.dtype)])
        return int(slots.numel())


def _first_run(starts: list[int], need_chunks: int, step: int) -> int:
    """Index of the first of ``need_chunks`` sorted starts that each step by ``step``; -1 if none."""
    if need_chunks == 1:
        return 0
    run_start, run_len = 0, 1
    for i in range(1, len(starts)):
        if starts[i] - starts[i - 1] == step:
            run_len += 1
            if run_len >= need_chunks:
                return run_start
        else:
            run_start, run_len = i, 1
    return -1
