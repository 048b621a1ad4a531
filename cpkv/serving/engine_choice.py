"""Which engine serves a run: ``admit.engine`` when given, else SGLang's own loop whenever it
models everything the config asks for, else cpkv's loop, with the reason.

SGLang's loop (:mod:`~cpkv.serving.engine.sglang_engine`) is the engine that decides as the
real server does; cpkv's loop (:mod:`~cpkv.serving.engine.engine`) is the one that also runs
seed 004's policies, the admission-policy space's options (timeouts, cancellations, swap,
CUDA-graph buckets, cpkv's queue orders) and requests with fixed L1/L2 hits, cancellations or
deadlines. A config that
needs one of those, with ``admit.engine`` null, runs in cpkv's loop and its run says why. The
rule is the schema's own: the keys SGLang's loop refuses
(:meth:`~cpkv.admit.schema.AdmitBlock.validate_sglang_serving`) and the workload's requests
(:func:`cpkv_only_requests`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cpkv.core.errors import ConfigError, InputError
from cpkv.core.schema import FieldError


def cpkv_only_requests(block: Any, workload: Any) -> str | None:
    """Where the workload gives requests what only cpkv's loop reads, else None: fixed cached
    tokens (a synthetic distribution that draws them, prefill-model JSONL lines, grid rows;
    the other engines find hits in their own prefix caches), a cancellation or a deadline
    (JSONL ``cancel_ms``, ``deadline_ms``)."""
    if workload.draws is not None:  # the synthetic source, drawn as requests arrive
        synthetic = block.workload.synthetic
        for key in ("l1_cached_tokens", "l2_cached_tokens"):
            if getattr(synthetic, key).largest() > 0:
                return f"admit.workload.synthetic.{key} draws cached tokens"
        return None
    for r in workload.requests:
        if r.l1_cached_tokens or r.l2_cached_tokens:
            return (
                f"request {r.rid} has fixed cached tokens (l1 {r.l1_cached_tokens}, "
                f"l2 {r.l2_cached_tokens})"
            )
        if r.cancel_ms is not None or r.deadline_ms is not None:
            return f"request {r.rid} has a cancel_ms or deadline_ms"
    return None


def needs_cpkv_loop(block: Any, workload: Any) -> str | None:
    """Why SGLang's loop cannot serve this config (None: it can)."""
    try:
        replace(block, engine="sglang").validate_sglang_serving()
    except FieldError as err:
        return f"admit.{err}"
    return cpkv_only_requests(block, workload)


def chosen_engine(block: Any, workload: Any) -> tuple[Any, str | None]:
    """``block`` with its engine set, and why cpkv's loop was chosen for a null
    ``admit.engine`` (None when it was given, or SGLang's loop serves)."""
    engine = block.engine
    if engine is not None:
        if engine in ("sglang", "vllm"):
            why = cpkv_only_requests(block, workload)
            if why is not None:
                raise InputError(
                    f"admit.workload: {why}, which only cpkv's loop reads (admit.engine "
                    f"cpkv); engine {engine} finds hits in its own prefix cache (give "
                    "requests without cached tokens, or a trace with hash_ids) and ends "
                    "requests only when they finish"
                )
        return block, None
    why = needs_cpkv_loop(block, workload)
    if why is None:
        return replace(block, engine="sglang"), None
    if block.sglang != type(block.sglang)():
        raise ConfigError(
            "admit.sglang: SGLang's loop's server arguments, but SGLang's loop cannot run this "
            f"config ({why}); set admit.engine: sglang to see what to change, or leave "
            "admit.sglang out for cpkv's loop"
        )
    return replace(block, engine="cpkv"), why
