"""Render a :class:`cpkv.diff.compare.Diff` as text, Markdown or JSON.

Text and Markdown lead with what changed and end with the verdict: config differences, the
summary (headline numbers always, other summary values when they changed), then the rows
that changed, worst first, at most ``ROW_LINES`` of them (``--all`` shows every row and
metric), with counts of the rest. Serving runs show their ranked table and their requests
instead of the row (:mod:`cpkv.diff.serving.render`). JSON holds everything, the verdict's
words included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cpkv.core.schema import to_dict
from cpkv.diff.cells import clip, num, pct, show, val
from cpkv.diff.compare import BETTER, NOISE, SAME, WORSE, Diff, MetricChange
from cpkv.diff.rules import DEFAULT_OTHER_PCT, INTERVAL, PAIRED, RANK, THRESHOLD
from cpkv.diff.serving.render import serving_json, serving_section, serving_verdict
from cpkv.diff.summary import CHANGED, INFO
from cpkv.runs.report import table
from cpkv.runs.results import finite_json

DIFF_FORMATS = ("text", "markdown", "json")
ROW_LINES = 15  # changed rows shown by default
SUMMARY_LINES = 16  # summary lines shown by default (the headline always)
LIST_LINES = 8  # outcome changes, rows only in A / B
RULE = (
    "a timing metric changes when B/A or A/B exceeds its factor and its rows' raw samples "
    "differ (two-sided Mann-Whitney U, p < alpha after Benjamini-Hochberg over the rows); rows "
    "without raw samples fall back to their uncertainty intervals not overlapping (a median: "
    "p50 +- 1.58 IQR/sqrt(n); a mean: +- 2 stdev/sqrt(n); else p05..p95, value +- stdev or "
    "min..max); another metric changes when |change| > its threshold"
)
RERUN_RULE = (
    "each side ran its config in rounds, A then B; a timing metric changes when the geometric "
    "mean of the rounds' B/A exceeds its factor either way and a paired t-test of log(B/A) "
    "over the rounds gives p < alpha after Benjamini-Hochberg over every paired test; "
    "another metric changes when the median of its rounds moved beyond its threshold"
)
_ORDER = {WORSE: 0, BETTER: 1, CHANGED: 2, NOISE: 3, INFO: 4, SAME: 5}


def render_diff(diff: Diff, fmt: str = "text", show_all: bool = False) -> str:
    if fmt == "json":
        return _json(diff)
    md = fmt == "markdown"
    tfmt = "markdown" if md else "text"
    out = [
        f"{'# ' if md else ''}cpkv diff ({diff.kind})",
        f"A: {_code(diff.a, md)}",
        f"B: {_code(diff.b, md)}",
    ]
    if diff.rerun:
        out.append(_rerun_line(diff))
    out += ["", _heading("config differences (A -> B)", md)]
    out += [f"- {k}: {val(a)} -> {val(b)}" for k, a, b in diff.config_changes] or ["(none)"]
    if diff.serving:
        out += ["", *serving_section(diff.serving, tfmt, md, show_all)]
        out += _summary_section(diff, tfmt, md, show_all)
    elif not diff.rerun:  # a rerun compares rows measured in pairs, not saved summaries
        out += ["", *_summary_section(diff, tfmt, md, show_all)]
    if diff.changes or diff.only_a or diff.only_b or not diff.serving:
        out += ["", *_rows_section(diff, tfmt, md, show_all)]
    out += _lists(diff, md, show_all)
    out += [f"note: {n}" for n in [*diff.notes, *_drift_note(diff)]]
    timing = _timing_line(diff)
    out += ["", *([timing] if timing else []), _verdict(diff)]
    return "\n".join(out) + "\n"


# -- summary ------------------------------------------------------------------------


def _summary_section(diff: Diff, fmt: str, md: bool, show_all: bool) -> list[str]:
    items = diff.summary
    has_point = any(c.point for c in items)
    if show_all:
        shown = list(items)
    else:
        # a run's headline always; a sweep's headline numbers (one set per point) and the
        # other summary values when they moved
        shown = [c for c in items if c.verdict != SAME or (c.headline and not has_point)]
    if not has_point:  # the headline in its own order, then the rest worst first
        shown.sort(key=lambda c: (not c.headline, 0 if c.headline else _ORDER.get(c.verdict, 9)))
    moved = sum(c.verdict != SAME for c in items)
    head = _heading("summary (A -> B)", md)
    if not items:
        return [head, "(no summary numbers)"]
    line = f"{len(items)} values, {moved} changed"
    if not show_all and len(shown) < len(items):
        after = "" if has_point or not any(c.headline for c in items) else " after the headline"
        line += f" (unchanged values left out{after})"
    cut = shown if show_all else shown[:SUMMARY_LINES]
    rows = []
    for c in cut:
        row: dict[str, Any] = {"point": c.point} if has_point else {}
        row.update(key=c.key, A=show(c.a), B=show(c.b), change=pct(c.change_pct), verdict=c.verdict)
        rows.append(row)
    columns = (["point"] if has_point else []) + ["key", "A", "B", "change", "verdict"]
    body = [head, line, ""]
    body.append(table(rows, columns, fmt) if rows else "(no summary value changed)")
    if len(shown) > len(cut):
        body.append(f"... {len(shown) - len(cut)} more summary values (--all shows them)")
    return body


# -- rows -----------------------------------------------------------------------------


def _rows_section(diff: Diff, fmt: str, md: bool, show_all: bool) -> list[str]:
    view = f" ({'; '.join(diff.views)})" if diff.views else ""
    if diff.rerun:
        view = (
            f" (A, B: geometric means over {diff.rerun.rounds} rounds; change: the geometric "
            "mean of the rounds' B/A)"
        )
    lines = [_heading(f"rows{view}", md), _rows_line(diff)]
    if not diff.changes:
        return [*lines, "(no metrics compared)"]
    groups = _by_row(diff.changes)
    verdicts = {key: _row_verdict(cs) for key, cs in groups.items()}
    tally: dict[str, int] = {}
    for v in verdicts.values():
        tally[v] = tally.get(v, 0) + 1
    counts = diff.counts()
    metric_tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n and v != SAME)
    lines.append(
        f"{len(groups)} rows compared: "
        + ", ".join(f"{tally[v]} {v}" for v in sorted(tally, key=lambda v: _ORDER.get(v, 9)))
        + (f" (metrics: {metric_tally})" if metric_tally else "")
    )
    constant, varying = _split_identity(diff)
    if constant:
        lines.append("every row: " + ", ".join(f"{k}={val(v)}" for k, v in constant.items()))
    keys = [k for k in groups if show_all or verdicts[k] in (WORSE, BETTER)]
    keys.sort(key=lambda k: _ORDER.get(verdicts[k], 9))
    cut = keys if show_all else keys[:ROW_LINES]
    lines.append("")
    if not cut:
        lines.append("(no row changed significantly; --all shows every row)")
        return lines
    lines.append(_table([groups[k] for k in cut], varying, fmt, show_all))
    if len(keys) > len(cut):
        lines.append(f"... {len(keys) - len(cut)} more changed rows (--all shows every row)")
    return lines


def _by_row(changes: Sequence[MetricChange]) -> dict[str, list[MetricChange]]:
    groups: dict[str, list[MetricChange]] = {}
    for c in changes:
        groups.setdefault(json.dumps([c.point, c.row], sort_keys=True, default=str), []).append(c)
    return groups


def _row_verdict(changes: Sequence[MetricChange]) -> str:
    return min((c.verdict for c in changes), key=lambda v: _ORDER.get(v, 9))


def _rows_line(diff: Diff) -> str:
    on = ", ".join(diff.identity) or "(no identity columns)"
    if len(diff.identity) > 4:
        on = f"{len(diff.identity)} identity columns ({', '.join(diff.identity[:3])}, ...)"
    return (
        f"matched on {on}: {diff.matched} matched, {len(diff.only_a)} only in A, "
        f"{len(diff.only_b)} only in B"
    )


def _split_identity(diff: Diff) -> tuple[dict[str, Any], list[str]]:
    rows = [c.row for c in diff.changes] + diff.only_a + diff.only_b
    constant, varying = {}, []
    for col in diff.identity:
        values = {json.dumps(r.get(col), sort_keys=True) for r in rows}
        if len(values) == 1 and len(rows) > 1:
            constant[col] = rows[0].get(col)
        else:
            varying.append(col)
    return constant, varying


def _table(
    rows_changes: Sequence[Sequence[MetricChange]], varying: Sequence[str], fmt: str, show_all: bool
) -> str:
    """One line per row: its identity, then ``A -> B (change)`` for each metric that moved."""
    flat = [c for cs in rows_changes for c in cs]
    has_point = any(c.point for c in flat)
    has_p = any(c.p_value is not None for c in flat)

    def moved(c: MetricChange) -> bool:
        return show_all or c.verdict in (WORSE, BETTER)

    metrics = list(dict.fromkeys(c.metric for c in flat if moved(c)))
    rows = []
    for cs in rows_changes:
        first = cs[0]
        row: dict[str, Any] = {"point": first.point} if has_point else {}
        row.update({k: first.row.get(k) for k in varying})
        for c in cs:
            if c.metric in metrics:
                row[c.metric] = _cell(c) if moved(c) else ""
        if has_p:
            ps = [c.p_value for c in cs if c.p_value is not None]
            row["p"] = f"{min(ps):.3g}" if ps else "-"
        row["verdict"] = _row_verdict(cs)
        rows.append(row)
    columns = (
        (["point"] if has_point else [])
        + list(varying)
        + metrics
        + (["p"] if has_p else [])
        + ["verdict"]
    )
    return table(rows, columns, fmt)


def _cell(c: MetricChange) -> str:
    """``A``, or ``A -> B (+x%)``; a change that is not significant (noise) ends in `` ns``."""
    if c.a == c.b:
        return num(c.a)
    change = "" if c.change_pct is None else f" ({pct(c.change_pct)})"
    return f"{num(c.a)} -> {num(c.b)}{change}" + (" ns" if c.verdict == NOISE else "")


def _lists(diff: Diff, md: bool, show_all: bool) -> list[str]:
    out: list[str] = []
    _, varying = _split_identity(diff)
    if diff.outcome_changes:
        items = [
            f"- {_label(p, r, varying)} {col}: {val(a)} -> {val(b)}"
            for p, r, col, a, b in diff.outcome_changes
        ]
        out += ["", _heading("outcome changes", md), *_capped(items, show_all, "outcome changes")]
    for title, rows in (("only in A", diff.only_a), ("only in B", diff.only_b)):
        if rows:
            items = [
                f"- {', '.join(f'{k}={val(v)}' for k, v in r.items() if k in varying or k == 'point')}"
                for r in rows
            ]
            out += ["", _heading(f"rows {title}", md), *_capped(items, show_all, f"rows {title}")]
    return out


def _capped(items: list[str], show_all: bool, what: str) -> list[str]:
    if show_all or len(items) <= LIST_LINES:
        return items
    return [*items[:LIST_LINES], f"... {len(items) - LIST_LINES} more {what} (--all shows them)"]


# -- verdict ----------------------------------------------------------------------------


def _timing_line(diff: Diff) -> str:
    judged = [c for c in diff.changes if c.rule]
    if not judged:
        return ""
    parts = []
    for rule, how in (
        (RANK, f"Mann-Whitney U on the raw samples, false discovery rate {diff.alpha:g} over {diff.tested_rows} rows"),
        (INTERVAL, "the interval rule: these rows have no raw samples (results written before cpkv kept them)"),
        (THRESHOLD, "the factor alone (no samples, no spread)"),
        (PAIRED, f"a paired t-test of log(B/A) over {diff.rerun.rounds if diff.rerun else 0} rounds, false discovery rate {diff.alpha:g} over {diff.tested_rows} tests"),
    ):  # fmt: skip
        mine = [c for c in judged if c.rule == rule]
        if mine:
            sig = sum(c.verdict in (WORSE, BETTER) for c in mine)
            parts.append(f"{len(mine)} by {how}: {sig} significant, {len(mine) - sig} noise")
    return "timing changes beyond their factor: " + "; ".join(parts)


def _drift_note(diff: Diff) -> list[str]:
    """A warning when every significant timing change points the same way in 3 rows or more:
    that is what a machine-wide change between the runs (load, clock) looks like too."""
    if diff.rerun:  # interleaved rounds: a change of the machine weighs on both sides
        return []
    moved = [c for c in diff.changes if c.rule and c.verdict in (WORSE, BETTER)]
    rows = {json.dumps([c.point, c.row], sort_keys=True, default=str) for c in moved}
    ways = {(c.b or 0) > (c.a or 0) for c in moved}
    if len(rows) < 3 or len(ways) != 1:
        return []
    way = "slower" if ways.pop() else "faster"
    return [
        f"every significant timing change ({len(rows)} rows) is {way} in B: a change of the "
        "machine between the runs (load, clock) looks the same; `cpkv diff A B --rerun` measures "
        "both again, interleaved, or compare ratios measured side by side in one run "
        "(vs_reference, vs_fifo_*)"
    ]


def _verdict(diff: Diff) -> str:
    """The last line: the plain verdict, or for serving runs the ranked one (both when a
    sweep holds serving points and others)."""
    if not diff.serving:
        return _plain_verdict(diff)
    head, detail = serving_verdict(diff.serving)
    served = {s.point for s in diff.serving}
    others = bool(diff.changes) or any(
        c.point not in served and c.verdict != SAME for c in diff.summary
    )
    if not others:
        return f"verdict: {head}" + (f" ({detail})" if detail else "")
    plain = _plain_verdict(diff).removeprefix("verdict: ")
    if plain.startswith("REGRESSION"):
        head = "REGRESSION"
    return f"verdict: {head} (serving: {detail or head}; other points: {plain})"


def _plain_verdict(diff: Diff) -> str:
    line = _verdict_words(diff)
    if not diff.rerun:
        return line
    head, _, rest = line.partition(" (")
    return f"{head} over {diff.rerun.rounds} interleaved rounds" + (f" ({rest}" if rest else "")


def _verdict_words(diff: Diff) -> str:
    counts = diff.counts()
    worse_summary = [c for c in diff.summary if c.verdict == WORSE]
    worse_rows = counts[WORSE]
    if worse_summary or worse_rows:
        parts = []
        if worse_summary:
            keys = ", ".join(dict.fromkeys(c.key for c in worse_summary))
            parts.append(f"summary: {len(worse_summary)} worse ({clip(keys, 80)})")
        if worse_rows:
            groups = _by_row(diff.changes)
            bad = sum(_row_verdict(cs) == WORSE for cs in groups.values())
            parts.append(f"rows: {bad} of {len(groups)} worse")
        return f"verdict: REGRESSION ({'; '.join(parts)})"
    moved = [c for c in diff.summary if c.verdict not in (SAME, INFO)]
    better = counts[BETTER] + sum(c.verdict == BETTER for c in diff.summary)
    if not moved and not counts[BETTER] and not diff.outcome_changes:
        extra = f" ({counts[NOISE]} timing changes within the noise)" if counts[NOISE] else ""
        return f"verdict: no significant change{extra}"
    tally = [f"{better} better"] if better else []
    changed = sum(c.verdict == CHANGED for c in diff.summary) + len(diff.outcome_changes)
    if changed:
        tally.append(f"{changed} changed")
    if counts[NOISE]:
        tally.append(f"{counts[NOISE]} timing changes within the noise")
    return f"verdict: no regression ({', '.join(tally) or 'nothing worse'})"


def _thresholds(diff: Diff) -> str:
    given = ", ".join(f"{k}:{v:g}%" for k, v in diff.thresholds.by_name.items())
    default = f"timings: factor {diff.thresholds.factor:g} either way, other:{DEFAULT_OTHER_PCT:g}%"
    return given + ("; " if given else "") + default


def _rerun_line(diff: Diff) -> str:
    assert diff.rerun is not None
    kept = diff.rerun.kept
    where = f"in {kept}" if kept else "in a temporary folder since removed; -o DIR keeps them"
    return (
        f"re-run here: {diff.rerun.rounds} rounds, interleaved A, B, A, B, ... "
        f"({len(diff.rerun.runs)} runs, {where})"
    )


def _json(diff: Diff) -> str:
    doc = {
        "a": diff.a, "b": diff.b, "kind": diff.kind,
        "regression": bool(diff.regressions), "counts": diff.counts(),
        "config_changes": [{"key": k, "a": a, "b": b} for k, a, b in diff.config_changes],
        "summary": [to_dict(c) for c in diff.summary],
        "views": diff.views,
        "identity": diff.identity, "matched": diff.matched, "only_a": diff.only_a, "only_b": diff.only_b,
        "changes": [to_dict(c) for c in diff.changes],
        "outcome_changes": [{"point": p, "row": r, "column": col, "a": a, "b": b} for p, r, col, a, b in diff.outcome_changes],
        "notes": diff.notes, "thresholds": dict(diff.thresholds.by_name), "alpha": diff.alpha,
        "timing_rules": diff.rules(), "rule": RERUN_RULE if diff.rerun else RULE,
        "threshold_defaults": _thresholds(diff), "factor": diff.thresholds.factor,
        "rerun": to_dict(diff.rerun) if diff.rerun else None,
        "serving": [serving_json(s) for s in diff.serving],
        "verdict": _verdict(diff).removeprefix("verdict: "),
    }  # fmt: skip
    return json.dumps(finite_json(doc), indent=1) + "\n"


# -- cells --------------------------------------------------------------------------------


def _label(point: str | None, row: Mapping[str, Any], varying: Sequence[str]) -> str:
    parts = [f"{k}={val(row.get(k))}" for k in varying]
    return (f"[{point}] " if point else "") + (", ".join(parts) or "row")


def _heading(text: str, md: bool) -> str:
    return f"## {text}" if md else f"{text}:"


def _code(text: str, md: bool) -> str:
    return f"`{text}`" if md else text
