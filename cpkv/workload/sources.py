"""Where the waiting requests come from: a registry of workload sources (``admit.workload``).

* ``grid``: the cartesian product of ``l1_cached_tokens`` x ``l2_cached_tokens`` x
  ``extend_tokens`` (x ``max_new_tokens`` when given), in that nesting order (the last list
  varies fastest). Request ``k`` is named ``g{k}_{l1}_{l2}_{extend}`` (``_{max_new}`` added
  when that list is given).
* ``jsonl``: one JSON object per line with ``rid`` and ``extend_tokens`` (>= 1), optional
  ``l1_cached_tokens``, ``l2_cached_tokens`` (default 0), ``max_new_tokens`` (default: the
  budget's), ``priority`` (0) and ``arrival_ms`` (0); for the serving simulation
  ``deadline_ms`` and ``cancel_ms`` (both after the arrival; none by default). Blank lines are skipped; unknown fields,
  wrong types and repeated rids are errors naming the file, line and field.
* ``synthetic``: ``synthetic.count`` seeded random requests (:mod:`cpkv.workload.synthetic`).

Other sources (traces) register themselves in :data:`SOURCES`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

from cpkv.core.errors import ConfigError, InputError
from cpkv.core.files.jsonl import check_fields, parse_object, read_text, require_file
from cpkv.core.registry import Registry
from cpkv.core.schema import FieldError, Range, require
from cpkv.core.schema.limits import (
    CLOCK_LIMIT_MS,
    INT64_MAX,
    INT64_WHY,
    MAX_TOKENS,
    TOKENS_WHY,
    Tokens,
    time_field_problem,
    token_field_problem,
)
from cpkv.core.suggest import did_you_mean
from cpkv.trace.prefix_cache import DEFAULT_CACHE, CacheConfig
from cpkv.trace.prefix_model import PrefixSpec, check_prefix_format
from cpkv.trace.readers import TRACE_FORMATS
from cpkv.workload.request import Request, new_request
from cpkv.workload.synthetic import DEFAULT_SYNTHETIC, SyntheticSpec


@dataclass(frozen=True)
class GridSpec:
    """The synthetic grid (defaults: the seed benchmark's example)."""

    l1_cached_tokens: tuple[Tokens, ...] = (0, 4096)
    l2_cached_tokens: tuple[Tokens, ...] = (0, 4096)
    extend_tokens: tuple[Tokens, ...] = (128, 2048)
    max_new_tokens: tuple[Tokens, ...] | None = None

    def validate(self) -> None:
        for key in ("l1_cached_tokens", "l2_cached_tokens", "extend_tokens"):
            values = getattr(self, key)
            require(len(values) > 0, key, "needs at least one value")
        for v in self.extend_tokens:
            require(
                v >= 1,
                "extend_tokens",
                f"every value must be >= 1 (SGLang always computes a token), got {v}",
            )


@dataclass(frozen=True)
class WorkloadSpec:
    """``admit.workload``: the source name and what each source reads."""

    source: str = "grid"
    path: str | None = None
    format: str = "mooncake"
    block_size: Annotated[int, Range(0, MAX_TOKENS, low_open=True, why=TOKENS_WHY)] = 512
    grid: GridSpec = GridSpec()
    # trace: first request (by order in the file) and how many (null: all)
    start: Annotated[int, Range(0, INT64_MAX, why=INT64_WHY)] = 0
    limit: Annotated[int, Range(0, INT64_MAX, why=INT64_WHY)] | None = None
    cache: CacheConfig = DEFAULT_CACHE  # trace: L1/L2 capacities of the prefix-cache replay
    synthetic: SyntheticSpec = DEFAULT_SYNTHETIC  # synthetic: count, seed, distributions
    prefix: PrefixSpec = PrefixSpec()  # trace: synthetic prefix sharing (azure_csv has none)
    # trace, mode serving: the selected requests this many times, back to back
    repeat: Annotated[int, Range(1, MAX_TOKENS, why="copies numbered in int32")] = 1

    def validate(self) -> None:
        if self.source not in SOURCES:
            raise FieldError(
                "source",
                f"unknown workload source {self.source!r}{did_you_mean(self.source, SOURCES.names())} "
                f"(allowed: {', '.join(SOURCES.names())})",
            )
        if self.format in TRACE_FORMATS:
            check_prefix_format(self.prefix, TRACE_FORMATS.canonical(self.format))


WorkloadSource = Callable[[WorkloadSpec], tuple[Request, ...]]
SOURCES: Registry[WorkloadSource] = Registry("workload source")


def load_workload(spec: WorkloadSpec, seed: int = 0) -> tuple[Request, ...]:
    """The requests ``spec`` describes, in queue order; ``seed`` (the experiment's) seeds the
    synthetic source when ``synthetic.seed`` is null."""
    if spec.synthetic.seed is None:
        spec = replace(spec, synthetic=replace(spec.synthetic, seed=seed))
    requests = SOURCES.get(spec.source)(spec)
    if not requests:
        what = {
            "jsonl": f"{spec.path} holds no request",
            "trace": f"admit.workload.start/limit select no request of {spec.path}",
        }.get(spec.source, f"the {spec.source} source gives no request")
        raise InputError(f"admit.workload: {what}; a run needs at least one request")
    return requests


@SOURCES.register("grid", help="cartesian product of l1 x l2 x extend token lists")
def grid_requests(spec: WorkloadSpec) -> tuple[Request, ...]:
    """The grid's requests, last list varying fastest."""
    g = spec.grid
    lists = [g.l1_cached_tokens, g.l2_cached_tokens, g.extend_tokens]
    if g.max_new_tokens is not None:
        lists.append(g.max_new_tokens)
    out = []
    for k, combo in enumerate(itertools.product(*lists)):
        mx = combo[3] if len(combo) > 3 else None
        out.append(Request(f"g{k}_" + "_".join(map(str, combo)), combo[0], combo[1], combo[2], mx))
    return tuple(out)


_INT_FIELDS = {
    "l1_cached_tokens": (0, "an integer >= 0"),
    "l2_cached_tokens": (0, "an integer >= 0"),
    "extend_tokens": (1, "an integer >= 1 (SGLang always computes at least one token)"),
    "max_new_tokens": (0, "an integer >= 0"),
}
_INF = float("inf")
_ALLOWED = (
    "rid",
    "l1_cached_tokens",
    "l2_cached_tokens",
    "extend_tokens",
    "max_new_tokens",
    "priority",
    "arrival_ms",
)
_ALLOWED_SET = frozenset(_ALLOWED)  # the fast path's fields; the others parse line by line
_ALLOWED += ("deadline_ms", "cancel_ms")


SOURCES.register(
    "trace",
    "cpkv.workload.trace:trace_requests",
    help="a request trace (path, format, block_size, start, limit) replayed through the L1/L2 cache model",
)


@SOURCES.register(
    "jsonl", help="one request per line: rid, l1/l2_cached_tokens, extend_tokens, ..."
)
def jsonl_requests(spec: WorkloadSpec) -> tuple[Request, ...]:
    """Parse ``spec.path``; any bad line is an InputError naming file, line and field."""
    path, text = jsonl_text(spec)
    out: list[Request] = []
    seen: set[str] = set()
    loads, allowed, new = json.loads, _ALLOWED_SET, new_request
    for lineno, line in enumerate(text.splitlines(), 1):
        req = None
        try:  # fast path for well-formed lines; anything odd is re-parsed below for the error
            obj = loads(line)
            if type(obj) is dict and obj.keys() <= allowed:
                g = obj.get
                rid, ext, l1, l2 = (
                    g("rid"),
                    g("extend_tokens"),
                    g("l1_cached_tokens", 0),
                    g("l2_cached_tokens", 0),
                )
                mx, prio, arr = g("max_new_tokens"), g("priority", 0), g("arrival_ms", 0.0)
                if (
                    type(rid) is str and rid and type(ext) is int and 1 <= ext <= MAX_TOKENS
                    and type(l1) is int and 0 <= l1 <= MAX_TOKENS
                    and type(l2) is int and 0 <= l2 <= MAX_TOKENS
                    and (mx is None or (type(mx) is int and 0 <= mx <= MAX_TOKENS))
                    and type(prio) is int and -INT64_MAX <= prio <= INT64_MAX
                    and (type(arr) is float or type(arr) is int) and 0 <= arr <= CLOCK_LIMIT_MS
                ):  # fmt: skip
                    req = new(rid, l1, l2, ext, mx, prio, float(arr))
        except (ValueError, RecursionError):
            pass
        if req is None:
            if not line.strip():
                continue
            req = parse_request_line(line, f"{path}:{lineno}")
        check_new_rid(req.rid, seen, f"{path}:{lineno}")
        out.append(req)
    return tuple(out)


def jsonl_text(spec: WorkloadSpec) -> tuple[Path, str]:
    """The path and text of the ``jsonl`` source's file (ConfigError without a path)."""
    if spec.path is None:
        raise ConfigError("admit.workload.path: the jsonl source needs a file path")
    path = Path(spec.path)
    require_file(path, "admit.workload.path")
    return path, read_text(path, "the requests file")


def request_id(obj: dict, where: str) -> str:
    """The line's ``rid``: InputError unless it is a non-empty string."""
    rid = obj.get("rid")
    if not isinstance(rid, str) or not rid:
        raise InputError(f"{where}: field 'rid' must be a non-empty string, got {rid!r}")
    return rid


def check_new_rid(rid: str, seen: set[str], where: str) -> None:
    """InputError if ``rid`` is in ``seen`` (an earlier line's); else add it."""
    if rid in seen:
        raise InputError(f"{where}: field 'rid': {rid!r} repeats an earlier request's rid")
    seen.add(rid)


def parse_request_line(line: str, where: str) -> Request:
    """One JSONL line as a :class:`Request`; ``where`` is ``file:line`` for errors."""
    obj = parse_object(line, where)
    check_fields(obj, _ALLOWED, where)
    rid = request_id(obj, where)
    if "extend_tokens" not in obj:
        raise InputError(f"{where}: field 'extend_tokens' is missing (an integer >= 1)")
    ints = {}
    for key, (low, what) in _INT_FIELDS.items():
        v = obj.get(key)
        if v is None and key != "extend_tokens":
            continue
        if type(v) is not int or v < low:
            raise InputError(f"{where}: field {key!r} must be {what}, got {v!r}")
        problem = token_field_problem(v, low)
        if problem is not None:
            raise InputError(f"{where}: field {key!r} {problem}, got {v!r}")
        ints[key] = v
    priority = obj.get("priority", 0)
    if type(priority) is not int:
        raise InputError(f"{where}: field 'priority' must be an integer, got {priority!r}")
    if not -INT64_MAX <= priority <= INT64_MAX:
        raise InputError(f"{where}: field 'priority' must be {INT64_WHY}, got {priority!r}")
    arrival = obj.get("arrival_ms", 0.0)
    if type(arrival) not in (int, float) or not 0 <= arrival < _INF:  # NaN fails both
        raise InputError(
            f"{where}: field 'arrival_ms' must be a finite number >= 0, got {arrival!r}"
        )
    times = {"arrival_ms": arrival}
    for key in ("deadline_ms", "cancel_ms"):
        v = obj.get(key)
        if v is None:
            continue
        if type(v) not in (int, float) or not 0 <= v < _INF:
            raise InputError(f"{where}: field {key!r} must be a finite number >= 0, got {v!r}")
        times[key] = float(v)
    for key, v in times.items():
        problem = time_field_problem(v)
        if problem is not None:
            raise InputError(f"{where}: field {key!r} {problem}, got {v!r}")
    del times["arrival_ms"]
    return Request(
        rid,
        ints.get("l1_cached_tokens", 0),
        ints.get("l2_cached_tokens", 0),
        ints["extend_tokens"],
        ints.get("max_new_tokens"),
        priority,
        float(arrival),
        **times,
    )


SOURCES.register(
    "synthetic",
    "cpkv.workload.synthetic:synthetic_requests",
    help="count seeded random requests (synthetic: count, seed, l1/l2/extend/max_new distributions)",
)
