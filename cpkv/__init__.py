"""cpkv: an offline lab for context-parallel shared-KV prefill admission and KV allocators."""

__version__ = "0.1.0"

MIRRORS = (
    ("sglang", "0.5.23", "PrefillAdder admission, waiting-queue policies, priority preemption"),
    ("vllm", "0.32.0", "V1 scheduler step (cpkv.vllm; admit.engine: vllm, queue and serving)"),
)
"""The engines whose semantics cpkv mirrors: (engine, version, what), shown by ``cpkv --version``."""
NOT_MIRRORED = (
    "serving loop: cpkv's own around SGLang's admission pass and vLLM's scheduler step"
)
"""What cpkv does not mirror (yet), shown beside :data:`MIRRORS`."""
