"""Two serving runs request by request: their ``requests.jsonl`` lines matched on ``rid``.

The summary numbers of a serving diff say how much moved; the requests say which. Each
request of both runs is put in the groups it changed in, B against A:

* worse: ``<status> in B, finished in A`` (timed out, rejected, cancelled: lost in B),
  ``preempted in B, not in A``, ``admitted later in B``;
* changed: ``<status> in A, <status> in B`` (lost both times, another way);
* better: ``finished in B, <status> in A``, ``preempted in A, not in B``,
  ``admitted earlier in B``.

A request is admitted later (earlier) when its queue time (first admission - arrival) grew
(shrank) by more than 1 ms and by more than the ``queue_ms`` threshold (% of A's; default 0).
Requests with a line in one file only are listed as such. The files are read line by line;
a line that is not a JSON object with a ``rid`` is an error naming the file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpkv.core.errors import InputError
from cpkv.core.files.jsonl import parse_object
from cpkv.diff.rules import BETTER, WORSE, Thresholds

REQUESTS_FILE = "requests.jsonl"
FINISHED = "finished"
LOST_STATUSES = ("timed_out", "rejected", "cancelled")
CHANGED = "changed"
QUEUE_FLOOR_MS = 1.0
"""A queue time must move by more than this (and its threshold) to count as later/earlier."""
PREEMPTED_B, PREEMPTED_A = "preempted in B, not in A", "preempted in A, not in B"
LATER, EARLIER = "admitted later in B", "admitted earlier in B"


@dataclass(frozen=True, slots=True)
class RequestState:
    """What ``requests.jsonl`` says of one request."""

    status: str
    reason: str | None
    queue_ms: float | None
    preemptions: int


@dataclass(frozen=True)
class RequestChange:
    """One request that changed: its groups (worst first) and its state in A and B."""

    rid: str
    groups: tuple[str, ...]
    verdict: str
    a: RequestState
    b: RequestState

    @property
    def queue_delta_ms(self) -> float:
        qa, qb = self.a.queue_ms, self.b.queue_ms
        return 0.0 if qa is None or qb is None else qb - qa


@dataclass(frozen=True)
class RequestDiff:
    """Every request of A against B: ``groups`` maps each group (in order: worse, changed,
    better) to its rids, in the order of ``rows``: the changed requests, worst first (by
    their worst group, then by how far their queue time moved; else in input order)."""

    matched: int
    only_a: list[str]
    only_b: list[str]
    groups: dict[str, list[str]] = field(default_factory=dict)
    rows: list[RequestChange] = field(default_factory=list)


def compare_requests(
    dir_a: Path, dir_b: Path, th: Thresholds
) -> tuple[RequestDiff | None, list[str]]:
    """The requests of two run directories (None and a note when one has no requests.jsonl)."""
    fa, fb = dir_a / REQUESTS_FILE, dir_b / REQUESTS_FILE
    missing = [str(f) for f in (fa, fb) if not f.is_file()]
    if missing:
        return None, [f"no per-request rows: {' and '.join(missing)} missing"]
    pct = th.pct("queue_ms", False)
    a = dict(_read(fa))
    seen: set[str] = set()
    rows: list[RequestChange] = []
    only_b: list[str] = []
    for rid, sb in _read(fb):
        sa = a.get(rid)
        if sa is None:
            only_b.append(rid)
            continue
        seen.add(rid)
        groups = _groups(sa, sb, pct)
        if groups:
            rows.append(RequestChange(rid, groups, _group_verdict(groups[0]), sa, sb))
    only_a = [rid for rid in a if rid not in seen]
    rows.sort(key=lambda r: (_rank(r.groups[0]), -abs(r.queue_delta_ms)))
    by_group: dict[str, list[str]] = {}
    for r in rows:
        for g in r.groups:
            by_group.setdefault(g, []).append(r.rid)
    ordered = dict(sorted(by_group.items(), key=lambda kv: _rank(kv[0])))
    return RequestDiff(len(seen), only_a, only_b, ordered, rows), []


def _groups(a: RequestState, b: RequestState, pct: float) -> tuple[str, ...]:
    out: list[str] = []
    if a.status != b.status:
        if a.status == FINISHED:
            out.append(f"{b.status} in B, finished in A")
        elif b.status == FINISHED:
            out.append(f"finished in B, {a.status} in A")
        else:
            out.append(f"{a.status} in A, {b.status} in B")
    if b.preemptions and not a.preemptions:
        out.append(PREEMPTED_B)
    elif a.preemptions and not b.preemptions:
        out.append(PREEMPTED_A)
    qa, qb = a.queue_ms, b.queue_ms
    if qa is not None and qb is not None:
        delta = qb - qa
        if abs(delta) > QUEUE_FLOOR_MS and abs(delta) > pct / 100.0 * abs(qa):
            out.append(LATER if delta > 0 else EARLIER)
    return tuple(sorted(out, key=_rank))


def _group_verdict(group: str) -> str:
    if group in (PREEMPTED_B, LATER) or group.endswith("in B, finished in A"):
        return WORSE
    if group in (PREEMPTED_A, EARLIER) or group.startswith("finished in B"):
        return BETTER
    return CHANGED


def _rank(group: str) -> tuple[int, int, str]:
    """Worse groups first (lost, then preempted, then later), then changed, then better."""
    order = {WORSE: 0, CHANGED: 1, BETTER: 2}[_group_verdict(group)]
    within = 1 if group in (PREEMPTED_A, PREEMPTED_B) else 2 if group in (LATER, EARLIER) else 0
    return order, within, group


def _read(path: Path) -> Iterator[tuple[str, RequestState]]:
    """(rid, state) of each line; a rid seen before gets ``#k``, its k-th occurrence."""
    try:
        fh = open(path, encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err})") from None
    seen: dict[str, int] = {}
    with fh:
        try:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    rid, state = _state(parse_object(line, f"{path}:{n}"), f"{path}:{n}")
                    k = seen[rid] = seen.get(rid, 0) + 1
                    yield (rid if k == 1 else f"{rid}#{k}"), state
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text; expected one JSON object a line") from None


def _state(obj: dict[str, Any], where: str) -> tuple[str, RequestState]:
    rid, status = obj.get("rid"), obj.get("status")
    if not isinstance(rid, str | int) or isinstance(rid, bool):
        raise InputError(f"{where}: field 'rid' must be a string, got {rid!r}")
    if not isinstance(status, str):
        raise InputError(f"{where}: field 'status' must be a string, got {status!r}")
    queue, pre = obj.get("queue_ms"), obj.get("preemptions")
    queue = float(queue) if isinstance(queue, int | float) and not isinstance(queue, bool) else None
    pre = pre if isinstance(pre, int) and not isinstance(pre, bool) else 0
    reason = obj.get("reason") if isinstance(obj.get("reason"), str) else None
    return str(rid), RequestState(status, reason, queue, pre)
