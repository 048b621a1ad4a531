"""Requests of the serving simulation and their arrival times.

Every ``admit.workload`` source can feed the serving loop:

* ``trace``: each trace request keeps its prefix blocks (``hash_ids``); its L1/L2 hits are
  looked up in a cold tiered cache (``workload.cache``) when it is admitted, and its blocks
  are inserted when it finishes. ``rid`` is ``r<index>``, the arrival its ``timestamp``;
* ``jsonl`` with prefill-model lines (``l1_cached_tokens``, ``l2_cached_tokens``,
  ``extend_tokens``, ``arrival_ms``...): the prompt is ``l1 + l2 + extend`` and the hits are
  fixed (no cache);
* ``jsonl`` with block lines (``prompt_tokens``, ``max_new_tokens``): no hits, arrival 0;
* ``grid`` and any other source: as their requests say (no hits beyond theirs).

A request without ``max_new_tokens`` takes ``admit.max_new_tokens``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cpkv.core.errors import ConfigError, InputError
from cpkv.serving.schema import ArrivalsSpec
from cpkv.serving.workload import ServingRequest
from cpkv.trace.prefix_cache import TieredPrefixCache
from cpkv.workload.request import Request, new_request
from cpkv.workload.synthetic import SyntheticSpec, TokenDist


@dataclass(frozen=True)
class ServingWorkload:
    """The requests in queue order, and the prefix cache they share (trace source only)."""

    requests: tuple[ServingRequest, ...]
    cache_block_size: int | None = None
    cache_config: Any = None

    def new_cache(self) -> TieredPrefixCache | None:
        """A cold cache for one run (``None`` without a trace)."""
        if self.cache_block_size is None:
            return None
        return TieredPrefixCache(self.cache_block_size, self.cache_config)


def load_serving_workload(spec: Any, default_max_new_tokens: int, seed: int = 0) -> ServingWorkload:
    """The requests of ``admit.workload`` (user errors raise ConfigError / InputError);
    ``seed`` (the experiment's) seeds the ``synthetic`` source when it names none."""
    if spec.source == "trace":
        return _trace_workload(spec)
    from cpkv.workload.sources import load_workload

    try:
        if spec.source == "synthetic":
            requests = synthetic_requests(
                replace(spec, synthetic=replace(spec.synthetic, seed=seed))
                if spec.synthetic.seed is None
                else spec
            )
        else:
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
                r.rid, r.arrival_ms, r.fill_tokens, mx, r.l1_cached_tokens, r.l2_cached_tokens
            )
        )
    return ServingWorkload(tuple(out))


def _trace_workload(spec: Any) -> ServingWorkload:
    from cpkv.workload.trace import check_trace_spec, read_workload_trace

    check_trace_spec(spec)
    try:
        spec.cache.capacities()
    except ConfigError as err:
        raise ConfigError(f"admit.workload.cache.{err}") from None
    trace = read_workload_trace(spec)
    requests = tuple(
        ServingRequest(
            f"r{t.index}", float(t.arrival_ms), t.input_length, t.output_length, hash_ids=t.hash_ids
        )
        for t in trace.requests
    )
    return ServingWorkload(requests, trace.block_size, spec.cache)


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


# -- the synthetic source as it was at 2ff6807 (cpkv/workload/synthetic.py), drawing eagerly --
def _sampler(dist: TokenDist, rng: random.Random):
    """A no-argument function drawing one value of ``dist`` from ``rng``."""
    draw_zero, zero = rng.random, dist.zero_fraction
    if dist.choices is not None:
        pick, values = rng.choice, dist.choices

        def value() -> int:
            return pick(values)
    else:
        randint, low, high = rng.randint, dist.low, dist.high

        def value() -> int:
            return randint(low, high)

    if zero <= 0:
        return value

    def maybe_zero() -> int:
        return 0 if draw_zero() < zero else value()

    return maybe_zero


def synthetic_requests(spec) -> tuple[Request, ...]:  # spec: WorkloadSpec
    """``admit.workload`` (source ``synthetic``): ``spec.synthetic.count`` seeded requests."""
    syn: SyntheticSpec = spec.synthetic
    rng = random.Random(0 if syn.seed is None else syn.seed)
    l1 = _sampler(syn.l1_cached_tokens, rng)
    l2 = _sampler(syn.l2_cached_tokens, rng)
    ext = _sampler(syn.extend_tokens, rng)
    mx = _sampler(syn.max_new_tokens, rng) if syn.max_new_tokens is not None else None
    new = new_request
    out = []
    for k in range(syn.count):
        a, b, e = l1(), l2(), ext()
        out.append(new(f"s{k}", a, b, e, mx() if mx is not None else None, 0, 0.0))
    return tuple(out)
