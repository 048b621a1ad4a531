"""The serving parts of ``cpkv diff``'s output: the ranked table, the requests, the verdict.

One pair of serving runs: a table with one metric a row (tier, metric, A, B, change,
verdict; the metric that decided marked ``(decides)``), then the requests that changed, by
group with their rids, and a table of them, worst first, a screenful at most (``--all``:
every one). Several (a sweep): one line per point, and with ``--all`` each point in full.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpkv.diff.cells import NEW, amount, clip, pct
from cpkv.diff.rules import BETTER, WORSE
from cpkv.diff.serving.requests import RequestChange, RequestDiff
from cpkv.diff.serving.verdict import (
    CONTEXT,
    IMPROVEMENT,
    RANKED_TIERS,
    REGRESSION,
    ServingDiff,
    ServingMetric,
)
from cpkv.runs.report import table

ROW_LINES = 15  # changed requests shown by default
ID_LINES = 8  # rids listed by default for each group
DESPITE_SHOWN = 3  # metrics named after "despite" in a verdict
RANKING = "ranked by goodput, then requests lost, then latency, then cost"
_TIER_LABEL = {t: f"{k} {t}" for k, t in enumerate(RANKED_TIERS, 1)}
_HEADS = {IMPROVEMENT: "IMPROVEMENT", REGRESSION: "REGRESSION"}


def serving_section(found: Sequence[ServingDiff], fmt: str, md: bool, show_all: bool) -> list[str]:
    """The ranked table(s) and the requests (see the module docstring)."""
    if len(found) == 1 or show_all:
        out: list[str] = []
        for s in found:
            where = f" [{s.point}]" if s.point else ""
            out += [_heading(f"serving{where} (A -> B), {RANKING}", md), ""]
            out += [_metric_table(s, fmt, show_all), ""]
            out += requests_section(s.requests, fmt, md, show_all) if s.requests else []
        return out
    rows = [
        {"point": s.point, "verdict": s.verdict, "decided by": describe(s.decided_by),
         "despite": len(s.despite), **_request_counts(s.requests)}
        for s in found
    ]  # fmt: skip
    columns = ["point", "verdict", "decided by", "despite", "requests worse", "requests better"]
    head = _heading(f"serving (A -> B, one line a point; --all shows each in full), {RANKING}", md)
    return [head, "", table(rows, columns, fmt), ""]


def _metric_table(s: ServingDiff, fmt: str, show_all: bool) -> str:
    rows, last = [], None
    for m in s.metrics:
        if not m.ranked and m.tier != CONTEXT and not show_all and not (m.a or m.b):
            continue  # a part of requests_lost that is 0 in both runs
        tier = _TIER_LABEL.get(m.tier, m.tier)
        rows.append(
            {
                "tier": tier if tier != last else "",
                "metric": m.key if m.ranked or m.tier == CONTEXT else f"- {m.key}",
                "A": amount(m.a, m.key),
                "B": amount(m.b, m.key),
                "change": pct(m.change_pct),
                "verdict": m.verdict + (" (decides)" if m.decides else ""),
            }
        )
        last = tier
    return table(rows, ["tier", "metric", "A", "B", "change", "verdict"], fmt)


def requests_section(r: RequestDiff, fmt: str, md: bool, show_all: bool) -> list[str]:
    out = [
        _heading("requests (one per request, from requests.jsonl)", md),
        f"matched on rid: {r.matched} matched, {len(r.only_a)} only in A, {len(r.only_b)} only in B",
    ]
    for group, rids in r.groups.items():
        out.append(f"- {group}: {len(rids)} ({_ids(rids, show_all)})")
    for title, rids in (("only in A", r.only_a), ("only in B", r.only_b)):
        if rids:
            out.append(f"- {title}: {len(rids)} ({_ids(rids, show_all)})")
    if not r.rows:
        return [*out, "(no request changed)", ""]
    cut = r.rows if show_all else r.rows[:ROW_LINES]
    out += ["", table([_request_row(c) for c in cut], ["rid", "status", "queue_ms",
                                                        "preemptions", "change"], fmt)]  # fmt: skip
    if len(r.rows) > len(cut):
        out.append(f"... {len(r.rows) - len(cut)} more changed requests (--all shows every one)")
    return [*out, ""]


def _request_row(c: RequestChange) -> dict[str, Any]:
    def pair(a: Any, b: Any, with_change: bool = False) -> str:
        if a == b:
            return amount(a)
        if with_change and a is not None and b is not None and a:
            return f"{amount(a)} -> {amount(b)} ({pct((b - a) / abs(a) * 100.0)})"
        return f"{amount(a)} -> {amount(b)}"

    return {
        "rid": c.rid,
        "status": c.a.status if c.a.status == c.b.status else f"{c.a.status} -> {c.b.status}",
        "queue_ms": pair(c.a.queue_ms, c.b.queue_ms, with_change=True),
        "preemptions": pair(c.a.preemptions, c.b.preemptions),
        "change": "; ".join(c.groups),
    }


def _ids(rids: Sequence[str], show_all: bool) -> str:
    if show_all or len(rids) <= ID_LINES:
        return ", ".join(rids)
    return ", ".join(rids[:ID_LINES]) + f", ... {len(rids) - ID_LINES} more"


def _request_counts(r: RequestDiff | None) -> dict[str, Any]:
    if r is None:
        return {"requests worse": "-", "requests better": "-"}
    return {
        "requests worse": sum(c.verdict == WORSE for c in r.rows),
        "requests better": sum(c.verdict == BETTER for c in r.rows),
    }


def describe(m: ServingMetric | None) -> str:
    """``metric A -> B (change)``, as a verdict names it (no change from a zero base)."""
    if m is None:
        return "-"
    change = pct(m.change_pct)
    moved = f"{m.key} {amount(m.a, m.key)} -> {amount(m.b, m.key)}"
    return moved if change == NEW else f"{moved} ({change})"


def serving_verdict(found: Sequence[ServingDiff]) -> tuple[str, str]:
    """(head, detail) of the serving verdict: ``IMPROVEMENT`` / ``REGRESSION`` / ``no
    significant change``, and what decided it."""
    if len(found) == 1:
        s = found[0]
        if s.decided_by is None:
            return "no significant change", ""
        detail = f"decided by {describe(s.decided_by)}" + _despite(s.despite)
        return _HEADS[s.verdict], (f"point {s.point}: " if s.point else "") + detail
    worse = [s for s in found if s.verdict == REGRESSION]
    better = [s for s in found if s.verdict == IMPROVEMENT]
    same = len(found) - len(worse) - len(better)
    if not worse and not better:
        return "no significant change", ""
    main, head = (worse, "REGRESSION") if worse else (better, "IMPROVEMENT")
    named = ", ".join(f"{s.point} by {s.decided_by.key}" for s in main if s.decided_by)
    rest = ([f"{len(better)} better"] if worse and better else []) + (
        [f"{same} same"] if same else []
    )
    word = "worse" if worse else "better"
    detail = f"{len(main)} of {len(found)} points {word} ({clip(named, 80)})"
    return head, detail + (f"; {', '.join(rest)}" if rest else "")


def _despite(metrics: Sequence[ServingMetric]) -> str:
    if not metrics:
        return ""
    shown = ", ".join(describe(m) for m in metrics[:DESPITE_SHOWN])
    more = len(metrics) - DESPITE_SHOWN
    return f"; despite {shown}" + (f" and {more} more" if more > 0 else "")


def serving_json(s: ServingDiff) -> dict[str, Any]:
    """One serving comparison for ``--format json``: what the table and the verdict show."""

    def metric(m: ServingMetric) -> dict[str, Any]:
        return {"key": m.key, "tier": m.tier, "ranked": m.ranked, "a": m.a, "b": m.b,
                "change_pct": m.change_pct, "change": pct(m.change_pct), "verdict": m.verdict,
                "decides": m.decides}  # fmt: skip

    r = s.requests
    requests = None
    if r is not None:
        requests = {
            "matched": r.matched, "only_a": r.only_a, "only_b": r.only_b, "groups": r.groups,
            "rows": [{"rid": c.rid, "groups": list(c.groups), "verdict": c.verdict,
                      "a": _state(c.a), "b": _state(c.b)} for c in r.rows],
        }  # fmt: skip
    return {
        "point": s.point, "verdict": s.verdict, "ranking": RANKING,
        "decided_by": metric(s.decided_by) if s.decided_by else None,
        "despite": [metric(m) for m in s.despite], "metrics": [metric(m) for m in s.metrics],
        "requests": requests, "notes": s.notes,
    }  # fmt: skip


def _state(state: Any) -> dict[str, Any]:
    return {"status": state.status, "reason": state.reason, "queue_ms": state.queue_ms,
            "preemptions": state.preemptions}  # fmt: skip


def _heading(text: str, md: bool) -> str:
    return f"## {text}" if md else f"{text}:"
