"""The CP shared-KV limits of one prefill batch (:class:`~cpkv.admission.budgets.CpBudgets`),
checked: which one a batch breaks. The PrefillAdder model (:mod:`cpkv.admission.adder`), the
serving engine's pass (:mod:`cpkv.serving.schedulers.adder_pass`) and SGLang's loop
(:mod:`cpkv.serving.engine.sglang_engine`) all name the stopping budget with
:func:`cp_limit_broken`; it runs once per candidate of every pass, so it is compiled with the
engines (:data:`cpkv.native.COMPILED`).
"""

from __future__ import annotations


def cp_limit_broken(
    batch_requests: int,
    extend_paged_sum: int,
    cached_paged_sum: int,
    max_requests: int | None,
    max_extend_tokens: int | None,
    max_cached_tokens: int | None,
) -> str | None:
    """The CP shared-KV limit a batch with these totals breaks, or None.

    The totals are those the batch would have with the candidate in it: its request count
    and its page-aligned extend and cached sums. Checked in this order (cpkv's rule): batch
    count, extend sum, cached sum. ``None`` is no limit.
    """
    if max_requests is not None and batch_requests > max_requests:
        return "cp_max_batch_requests"
    if max_extend_tokens is not None and extend_paged_sum > max_extend_tokens:
        return "cp_max_total_extend_tokens"
    if max_cached_tokens is not None and cached_paged_sum > max_cached_tokens:
        return "cp_max_total_cached_tokens"
    return None
