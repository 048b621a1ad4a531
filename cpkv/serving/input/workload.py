"""Requests of the serving simulation and their arrival times.

Every ``admit.workload`` source can feed the serving engine:

* ``trace``: each trace request keeps its prefix blocks (``hash_ids``); its L1/L2 hits are
  looked up in a cold tiered cache (``workload.cache``) when it is admitted, and its blocks
  are inserted when it finishes. ``rid`` is ``r<index>``, the arrival its ``timestamp``. A
  trace format without prefix information (``azure_csv``: every request has blocks of its
  own, :data:`~cpkv.trace.prefix_model.NO_PREFIX_FORMATS`) and no synthetic prefix
  (``admit.workload.prefix``) gets no cache: every lookup would miss, so its requests run
  with no hit, as with a cache, faster;
* ``jsonl`` with prefill-model lines (``l1_cached_tokens``, ``l2_cached_tokens``,
  ``extend_tokens``, ``arrival_ms``...): the prompt is ``l1 + l2 + extend`` and the hits are
  fixed (no cache);
* ``jsonl`` with block lines (``prompt_tokens``, ``max_new_tokens``): no hits, arrival 0;
* ``grid`` and any other source: as their requests say (no hits beyond theirs).

A request without ``max_new_tokens`` takes ``admit.max_new_tokens``.

``synthetic`` requests are drawn lazily, as the engine reaches them; a trace can be repeated
(``admit.workload.repeat: N``): N copies back to back, copy ``c`` (from 0) of request
``r<i>`` named ``r<i>.<c>`` (``r<i>`` in copy 0), arriving ``c`` periods later, the period
being the trace's span plus its mean gap between arrivals (``(last - first) * n / (n - 1)``
for ``n`` requests: the repeated trace keeps the trace's mean rate), with block hashes
``h + c * 2**52`` (a copy shares prefix blocks within itself as the trace does, never with
another copy). Copies are built as the engine reaches them
(:func:`cpkv.serving.input.arrivals.repeated_trace`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from cpkv.core.errors import ConfigError, InputError
from cpkv.serving.input.arrivals import (
    COPY_HASH_STRIDE,
    arrival_order,
    as_reqs,
    repeated_trace,
    synthetic_arrivals,
)
from cpkv.serving.schema import ArrivalsSpec
from cpkv.trace.prefix_cache import TieredPrefixCache
from cpkv.trace.prefix_model import NO_PREFIX_FORMATS

if TYPE_CHECKING:
    from cpkv.serving.model.request import Req


@dataclass(frozen=True, slots=True)
class ServingRequest:
    """One request of the serving engine's input.

    ``l1_cached_tokens`` / ``l2_cached_tokens`` are fixed hits, used when there is no cache;
    ``hash_ids`` (trace requests) are looked up in the cache instead.
    """

    rid: str
    arrival_ms: float
    prompt_tokens: int
    max_new_tokens: int
    l1_cached_tokens: int = 0
    l2_cached_tokens: int = 0
    hash_ids: tuple[int, ...] | None = None
    # the admission-policy options read these: priority, TTFT deadline, cancel time (after arrival)
    priority: int | None = None
    deadline_ms: float | None = None
    cancel_ms: float | None = None


@dataclass(frozen=True)
class ServingWorkload:
    """The requests in queue order, and the prefix cache they share (trace source only).

    ``requests`` holds them (once, for a repeated trace: ``repeat`` copies), unless they
    are drawn lazily: ``draws(arrivals, seed)`` then gives them in arrival order, ``count``
    of them."""

    requests: tuple[ServingRequest, ...]
    cache_block_size: int | None = None
    cache_config: Any = None
    repeat: int = 1
    draws: Callable[[ArrivalsSpec, int], Iterator[tuple]] | None = None  # arrival rows
    count: int = 0

    @property
    def lazy(self) -> bool:
        """Whether the requests are drawn as the engine reaches them (not held in memory)."""
        return self.draws is not None or self.repeat > 1

    @property
    def size(self) -> int:
        """How many requests the run serves."""
        return self.count if self.draws is not None else len(self.requests) * self.repeat

    def new_cache(self) -> TieredPrefixCache | None:
        """A cold cache for one run (``None`` without a trace)."""
        if self.cache_block_size is None:
            return None
        return TieredPrefixCache(self.cache_block_size, self.cache_config)

    def arriving(self, arrivals: ArrivalsSpec, seed: int) -> Iterator[Req]:
        """The run's requests in arrival order, each built when it is reached
        (:mod:`cpkv.serving.input.arrivals`), with the arrival times of :func:`with_arrivals`."""
        if self.lazy:
            return as_reqs(self.arrival_rows(arrivals, seed))
        return arrival_order(with_arrivals(self.requests, arrivals, seed))

    def arrival_rows(self, arrivals: ArrivalsSpec, seed: int) -> Iterator[tuple]:
        """A lazy workload's requests in arrival order as arrival rows
        (:func:`~cpkv.serving.input.arrivals.as_reqs`): what :meth:`arriving` builds its Reqs
        from."""
        if self.draws is not None:
            return self.draws(arrivals, seed)
        return repeated_trace(self.requests, self.repeat, arrivals, seed)


def load_serving_workload(spec: Any, default_max_new_tokens: int, seed: int = 0) -> ServingWorkload:
    """The requests of ``admit.workload`` (user errors raise ConfigError / InputError);
    ``seed`` (the experiment's) seeds the ``synthetic`` source when it names none."""
    if spec.source == "trace":
        return _trace_workload(spec)
    if spec.source == "synthetic":
        return _synthetic_workload(spec, default_max_new_tokens, seed)
    from cpkv.workload.sources import load_workload

    try:
        requests = load_workload(spec, seed=seed)
    except InputError:
        if spec.source != "jsonl":
            raise
        from cpkv.policies.requests import load_block_requests

        blocks = load_block_requests(spec, default_max_new_tokens)
        return ServingWorkload(
            tuple(ServingRequest(b.rid, 0.0, b.prompt_tokens, b.max_new_tokens) for b in blocks)
        )
    out = []
    for r in requests:
        mx = default_max_new_tokens if r.max_new_tokens is None else r.max_new_tokens
        out.append(
            ServingRequest(
                r.rid,
                r.arrival_ms,
                r.fill_tokens,
                mx,
                r.l1_cached_tokens,
                r.l2_cached_tokens,
                None,
                r.priority,
                r.deadline_ms,
                r.cancel_ms,
            )  # fmt: skip
        )
    return ServingWorkload(tuple(out))


def _synthetic_workload(spec: Any, default_max_new_tokens: int, seed: int) -> ServingWorkload:
    """The ``synthetic`` source's requests, drawn lazily (the draws of
    :func:`cpkv.workload.synthetic.synthetic_requests`, seeded as ``load_workload`` seeds them)."""
    if spec.synthetic.seed is None:
        spec = replace(spec, synthetic=replace(spec.synthetic, seed=seed))
    return ServingWorkload(
        (), draws=partial(synthetic_arrivals, spec, default_max_new_tokens),
        count=spec.synthetic.count,
    )  # fmt: skip


def _trace_workload(spec: Any) -> ServingWorkload:
    from cpkv.workload.trace import check_trace_spec, read_workload_trace

    check_trace_spec(spec)
    try:
        spec.cache.capacities()
    except ConfigError as err:
        raise ConfigError(f"admit.workload.cache.{err}") from None
    trace = read_workload_trace(spec)
    # a trace without prefix information and no synthetic prefix (azure_csv alone): no
    # two requests share a block, every lookup would miss: no cache
    shared = trace.format not in NO_PREFIX_FORMATS or spec.prefix.model != "none"
    requests = tuple(
        ServingRequest(
            f"r{t.index}",
            float(t.arrival_ms),
            t.input_length,
            t.output_length,
            hash_ids=t.hash_ids if shared else None,
            priority=t.priority,
            deadline_ms=t.deadline_ms,
            cancel_ms=t.cancel_ms,
        )
        for t in trace.requests
    )
    repeat = getattr(spec, "repeat", 1)
    if repeat > 1:
        top = max((abs(h) for r in requests for h in r.hash_ids or ()), default=0)
        if top >= COPY_HASH_STRIDE // 2:
            raise InputError(
                f"admit.workload.repeat: {spec.path} has block hashes as large as {top}; a "
                f"repeated trace needs them below 2**51 (copy c adds c * 2**52)"
            )
    if not shared:
        return ServingWorkload(requests, repeat=repeat)
    return ServingWorkload(requests, trace.block_size, spec.cache, repeat=repeat)


def with_arrivals(
    requests: Sequence[ServingRequest], arrivals: ArrivalsSpec, seed: int
) -> tuple[ServingRequest, ...]:
    """The requests with the arrival times of ``arrivals`` (queue order kept)."""
    if arrivals.process == "zero":
        return tuple(replace(r, arrival_ms=0.0) for r in requests)
    if arrivals.process == "trace":
        if arrivals.speedup == 1.0:
            return tuple(requests)
        return tuple(replace(r, arrival_ms=r.arrival_ms / arrivals.speedup) for r in requests)
    rng = random.Random(seed)
    t, out = 0.0, []
    for r in requests:
        t += rng.expovariate(arrivals.rate_rps) * 1000.0
        out.append(replace(r, arrival_ms=t))
    return tuple(out)
