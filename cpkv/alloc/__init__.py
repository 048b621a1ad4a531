"""KV allocators (host L2, CP shared paged L1) and their benchmarks."""
