"""cpkv: an offline lab for context-parallel shared-KV prefill admission and KV allocators."""

__version__ = "0.1.0"

MIRRORS = (
    ("sglang", "0.5.23", "PrefillAdder admission, waiting-queue policies, priority preemption"),
)
"""The engines whose semantics cpkv mirrors: (engine, version, what), shown by ``cpkv --version``."""
NOT_MIRRORED = "vLLM: not modelled; the serving loop is cpkv's own around SGLang's admission pass"
"""What cpkv does not mirror (yet), shown beside :data:`MIRRORS`."""
