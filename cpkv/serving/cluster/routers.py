"""Routers: which instance a new request goes to (``admit.cluster.router``), decided at its
arrival from what a real router knows then.

The cluster driver fills in the snapshot and calls ``router.route(request, loads, now_ms)``
once per arriving request, in arrival order:

* :class:`RoutedRequest`: the request as the router sees it: ``rid``, ``prompt_tokens``,
  ``max_new_tokens`` and its prompt as prefix-block keys (``prefix_blocks``: a trace's
  ``hash_ids``, ``block_tokens`` tokens each; :func:`unique_blocks` for requests without
  prefix information);
* :class:`InstanceLoad`, one per instance, in instance order: the engine's load as its
  metrics report it at that moment: requests queued (routed there, not admitted; a preempted
  request waiting again counts) and running (admitted, not finished), and their tokens
  (prompt tokens plus the output tokens generated so far). The driver reports them exactly,
  as if the router polled without delay;
* ``now_ms``: the arrival time (``prefix_aware`` dates its tree entries and evicts with it).

It returns a :class:`RouteDecision`: the instance, the rule that chose it and, for
``prefix_aware``, whether the balance threshold moved the request away from the instance the
cache rule would have picked (``moved``; :class:`RouterStats` counts them). Routers keep their
own state (a counter, a seeded generator, a tree) and never see an engine's real cache.

Registry (:data:`ROUTERS`; ties go to the lowest instance index everywhere):

* ``round_robin``: instances 0, 1, ..., n-1, 0, ...;
* ``random``: ``random.Random(seed).randrange(n)`` per request;
* ``least_requests``: the fewest queued + running requests;
* ``least_tokens``: the fewest queued + running tokens;
* ``power_of_two``: two distinct instances drawn at random (``rng.sample``), the one with
  fewer queued + running requests (the first drawn on a tie), as sgl-router's
  ``power_of_two`` policy;
* ``prefix_aware``: SGLang router's ``cache_aware`` policy (``sgl-router/src/policies/
  cache_aware.rs``, defaults from ``sglang_router/router_args.py``). With ``load`` = queued +
  running requests per instance, the cluster is *imbalanced* when ``max(load) - min(load) >
  balance_abs_threshold`` **and** ``max(load) > min(load) * balance_rel_threshold``.
  Imbalanced: the least loaded instance (rule ``balance``). Balanced: the router's own tree
  (:mod:`cpkv.serving.cluster.prefix_tree`, the prefixes it routed, not the engines' caches)
  gives the longest prefix of the request it holds; when its share of the prompt
  (``matched_tokens / prompt_tokens``) exceeds ``cache_threshold``, the instance holding that
  prefix (rule ``cache_hit``), else the instance whose tree is smallest, the one with the
  most room (rule ``cache_miss``). Either way the request's blocks are then inserted for the
  chosen instance. Every ``eviction_interval_s`` of simulated time each instance's least
  recently used leaves are evicted down to ``max_tree_blocks`` (null: never).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cpkv.core.registry import Registry
from cpkv.serving.cluster.prefix_tree import PrefixTree, UniqueBlocks


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """One instance's load at an arrival (what its metrics would report)."""

    queued_requests: int = 0
    running_requests: int = 0
    queued_tokens: int = 0
    running_tokens: int = 0

    @property
    def requests(self) -> int:
        """Outstanding requests: queued + running (sgl-router's ``worker.load()``)."""
        return self.queued_requests + self.running_requests

    @property
    def tokens(self) -> int:
        """Outstanding tokens: queued + running."""
        return self.queued_tokens + self.running_tokens


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    """A request as the router sees it at its arrival."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int = 0
    prefix_blocks: Sequence[Hashable] = ()
    block_tokens: int = 1


def unique_blocks(rid: str, prompt_tokens: int, block_tokens: int) -> UniqueBlocks:
    """Prefix-block keys no other request shares (a request without prefix information):
    one per ``block_tokens`` tokens of the prompt, rounded up, ``(rid, i)``, held as a range."""
    return UniqueBlocks(rid, 0, -(-prompt_tokens // block_tokens))


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request goes and why (``matched_tokens``: prefix_aware's estimate of the
    prefix the chosen rule saw; ``moved``: the balance threshold overrode the cache rule)."""

    instance: int
    rule: str
    moved: bool = False
    matched_tokens: int = 0


class Router(Protocol):
    def route(
        self, request: RoutedRequest, loads: Sequence[InstanceLoad], now_ms: float
    ) -> RouteDecision: ...


@dataclass(frozen=True)
class RouterSettings:
    """What a router is built from: the ``admit.cluster`` thresholds (see ClusterSpec)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_blocks: int | None = None


RouterFactory = Callable[[RouterSettings, int, int], Router]
"""``factory(settings, instances, seed) -> Router``."""
ROUTERS: Registry[RouterFactory] = Registry("router")


def make_router(name: str, settings: RouterSettings, instances: int, seed: int) -> Router:
    return ROUTERS.get(name)(settings, instances, seed)


def _lowest(values: Sequence[int]) -> int:
    """The index of the smallest value, the lowest index among equals."""
    return min(range(len(values)), key=lambda i: (values[i], i))


class RoundRobin:
    def __init__(self, settings: RouterSettings, instances: int, seed: int) -> None:
        self.instances, self.next = instances, 0

    def route(
        self, request: RoutedRequest, loads: Sequence[InstanceLoad], now_ms: float
    ) -> RouteDecision:
        chosen, self.next = self.next, (self.next + 1) % self.instances
        return RouteDecision(chosen, "round_robin")


class RandomRouter:
    def __init__(self, settings: RouterSettings, instances: int, seed: int) -> None:
        self.instances, self.rng = instances, random.Random(seed)

    def route(
        self, request: RoutedRequest, loads: Sequence[InstanceLoad], now_ms: float
    ) -> RouteDecision:
        return RouteDecision(self.rng.randrange(self.instances), "random")


class LeastRequests:
    def __init__(self, settings: RouterSettings, instances: int, seed: int) -> None:
        pass

    def route(
        self, request: RoutedRequest, loads: Sequence[InstanceLoad], now_ms: float
    ) -> RouteDecision:
        return RouteDecision(_lowest([x.requests for x in loads]), "least_requests")


class LeastTokens:
    def __init__(self, settings: RouterSettings, instances: int, seed: int) -> None:
        pass

    def route(
        self, request: RoutedRequest, loads: Sequence[InstanceLoad], now_ms: float
    ) -> RouteDecision:
        return RouteDecision(_lowest([x.tokens for x in loads]), "least_tokens")


class PowerOfTwo:
    def __init__(self, settings: RouterSettings, instances: int, seed: int) -> None:
        self.instances, self.rng = instances, random.Random(seed)

    def route(
        self, request: RoutedRequest, loads: Sequence[InstanceLoad], now_ms: float
    ) -> RouteDecision:
        if self.instances == 1:
            return RouteDecision(0, "power_of_two")
        first, second = self.rng.sample(range(self.instances), 2)
        chosen = first if loads[first].requests <= loads[second].requests else second
        return RouteDecision(chosen, "power_of_two")


@dataclass
class PrefixAware:
    """SGLang router's cache-aware policy (see the module docstring)."""

    settings: RouterSettings
    instances: int
    seed: int = 0
    tree: PrefixTree = field(init=False)
    next_eviction_ms: float = field(init=False)

    def __post_init__(self) -> None:
        self.tree = PrefixTree(self.instances)
        self.next_eviction_ms = self.settings.eviction_interval_s * 1000.0

    def route(
        self, request: RoutedRequest, loads: Sequence[InstanceLoad], now_ms: float
    ) -> RouteDecision:
        s, tree = self.settings, self.tree
        if s.max_tree_blocks is not None and now_ms >= self.next_eviction_ms:
            tree.evict(s.max_tree_blocks)  # the eviction thread's last tick before now
            interval = s.eviction_interval_s * 1000.0
            self.next_eviction_ms += interval * (1 + (now_ms - self.next_eviction_ms) // interval)
        blocks = request.prefix_blocks
        match = tree.match(blocks)
        matched_tokens = min(match.blocks * request.block_tokens, request.prompt_tokens)
        rate = matched_tokens / request.prompt_tokens if request.prompt_tokens > 0 else 0.0
        holder = match.tenants[0]  # sgl-router: the first tenant of the node (here the lowest)
        cached = (
            (holder, "cache_hit")
            if rate > s.cache_threshold
            else (tree.smallest_tenant(), "cache_miss")
        )
        load = [x.requests for x in loads]
        high, low = max(load), min(load)
        if high - low > s.balance_abs_threshold and high > low * s.balance_rel_threshold:
            chosen = _lowest(load)
            tree.insert(blocks, chosen, now_ms)
            return RouteDecision(chosen, "balance", chosen != cached[0], matched_tokens)
        tree.touch(match, holder, now_ms)
        tree.insert(blocks, cached[0], now_ms)
        return RouteDecision(cached[0], cached[1], False, matched_tokens)


ROUTERS.register("round_robin", RoundRobin, help="instances in turn")
ROUTERS.register(
    "random", RandomRouter, help="a uniformly random instance (seeded by the experiment's seed)"
)
ROUTERS.register("least_requests", LeastRequests, help="the fewest queued + running requests")
ROUTERS.register("least_tokens", LeastTokens, help="the fewest queued + running tokens")
ROUTERS.register(
    "prefix_aware",
    PrefixAware,
    help="SGLang router's cache_aware: the instance its own tree says holds the longest prefix, unless the loads are imbalanced",
)
ROUTERS.register(
    "power_of_two",
    PowerOfTwo,
    help="two random instances, the one with fewer queued + running requests",
)


@dataclass
class RouterStats:
    """Counts of a run's decisions: per instance, per rule, and requests moved by the balance
    threshold (prefix_aware sent them elsewhere than its cache rule would have)."""

    instances: int
    per_instance: list[int] = field(init=False)
    by_rule: dict[str, int] = field(default_factory=dict)
    moved_by_balance: int = 0

    def __post_init__(self) -> None:
        self.per_instance = [0] * self.instances

    def record(self, decision: RouteDecision) -> None:
        self.per_instance[decision.instance] += 1
        self.by_rule[decision.rule] = self.by_rule.get(decision.rule, 0) + 1
        self.moved_by_balance += decision.moved
