"""The knobs of vLLM 0.32.0's V1 scheduler and KV cache that the model reads, under vLLM's names.

Defaults are vLLM 0.32.0's (``SchedulerConfig``, ``CacheConfig``); ``num_gpu_blocks`` and
``max_model_len`` have none there (vLLM derives them from the GPU memory and the model), so
they must be given. ``__post_init__`` refuses what vLLM's config validation refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class SchedulerConfig:
    """One vLLM engine's scheduling knobs (text-only, one full-attention KV cache group)."""

    num_gpu_blocks: int
    """KV cache blocks in the pool, block 0 included (vLLM keeps it as the null block)."""
    max_model_len: int
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_num_active_seqs: int | None = None
    """The cap on running requests; ``None`` means ``max_num_seqs``."""
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    policy: str = "fcfs"
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        for name in (
            "num_gpu_blocks",
            "max_model_len",
            "max_num_batched_tokens",
            "max_num_seqs",
            "block_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.max_num_active_seqs is not None and not (
            1 <= self.max_num_active_seqs <= self.max_num_seqs
        ):
            raise ValueError(
                f"max_num_active_seqs ({self.max_num_active_seqs}) must be in "
                f"[1, max_num_seqs={self.max_num_seqs}]"
            )
        if not 0 <= self.long_prefill_token_threshold <= self.max_model_len:
            raise ValueError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) must be "
                f"in [0, max_model_len={self.max_model_len}]"
            )
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")

    @property
    def max_active_requests(self) -> int:
        """How many requests may be running at once."""
        return self.max_num_seqs if self.max_num_active_seqs is None else self.max_num_active_seqs

    @property
    def watermark_blocks(self) -> int:
        """Blocks kept free when a waiting request is admitted beside running ones."""
        return int(self.watermark * self.num_gpu_blocks)
