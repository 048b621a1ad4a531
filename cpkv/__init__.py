"""cpkv: an offline lab for context-parallel shared-KV prefill admission and KV allocators."""

from cpkv import native

__version__ = "0.1.0"

native.guard()  # before any compiled module can load: see cpkv.native

MIRRORS = (
    ("sglang", "0.5.23", "PrefillAdder admission, waiting-queue policies, priority preemption"),
    (
        "sglang",
        "0.5.23",
        "scheduler loop (cpkv.sglang; serving with admit.engine: sglang, the default)",
    ),
    (
        "vllm",
        "0.32.0",
        "vLLM's V1 scheduler step (cpkv.vllm; admit.engine: vllm, queue and serving)",
    ),
)
"""The engines whose semantics cpkv mirrors: (engine, version, what), shown by ``cpkv --version``."""
NOT_MIRRORED = (
    "admit.engine cpkv (seed 004's policies) is cpkv's own loop around SGLang's admission "
    "pass; the host tier and CP limits on SGLang's loop are cpkv's, not SGLang's"
)
"""What cpkv does not mirror (yet), shown beside :data:`MIRRORS`."""
