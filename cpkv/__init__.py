"""cpkv: an offline lab for context-parallel shared-KV prefill admission and KV allocators."""

__version__ = "0.1.0"
