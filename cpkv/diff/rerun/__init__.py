"""``cpkv diff A B --rerun``: ``runs`` (both configs run again, interleaved A, B, A, B, ...),
``rounds`` (the rows of the rounds judged in pairs) and ``paired`` (the paired t-test of
log(B/A))."""
