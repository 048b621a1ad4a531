"""Judge a rerun: each side's runs by round, rows matched on identity, statistics in pairs.

Every round of a side ran the same config, so every round holds the same rows; a row of A
is matched on its identity columns with the row of B, round by round. Each timing statistic
of a matched row (``p50_us``, ``p99_us``, ``mean_us``, ...) gives one value per round on each
side, and the paired test of :mod:`cpkv.diff.rerun.paired` judges them: the change is the geometric
mean of the rounds' B/A (A and B are shown as each side's geometric mean over the rounds, so
that B/A is that change). It counts when it is larger than its factor (``--factor``; a
``--threshold`` naming the metric or ``timing``: 1 + PCT/100) **and** significant after
Benjamini–Hochberg over every paired test of the diff; beyond the factor but not significant
is ``noise``; within the factor is ``same``, however significant. Ratios of two rows
(``vs_fifo_p50``) are ``info``, as in a plain diff; the other metrics are deterministic and
compared on their median over the rounds with their threshold.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from cpkv.core.errors import ConfigError, InputError
from cpkv.diff.compare import Diff, Rerun, row_metrics
from cpkv.diff.match import index_rows
from cpkv.diff.ranktest import benjamini_hochberg
from cpkv.diff.rerun.paired import paired_test
from cpkv.diff.rules import (
    BETTER,
    NA,
    NOISE,
    PAIRED,
    SAME,
    WORSE,
    MetricChange,
    Thresholds,
    compare_metric,
    samples_field,
)
from cpkv.runs.results import RunRecord


def judge_rounds(
    a: str, b: str, rounds_a: Sequence[RunRecord], rounds_b: Sequence[RunRecord], rerun: Rerun,
    config_changes: list[tuple[str, Any, Any]], th: Thresholds, alpha: float,
    metrics: Sequence[str] = (), ignore: Sequence[str] = (), notes: Sequence[str] = (),
) -> Diff:  # fmt: skip
    """The :class:`Diff` of A's and B's rounds (``rounds_a[r]`` and ``rounds_b[r]`` ran in
    round r + 1), with ``rerun`` telling how they ran."""
    if not rounds_a or len(rounds_a) != len(rounds_b):
        raise ValueError("judge_rounds needs the same number of rounds (>= 1) on each side")
    ra, rb = rounds_a[0], rounds_b[0]
    identity = match_identity(ra, rb, ignore)
    wanted = row_metrics(ra, rb, metrics)
    index_a = [index_rows(r.rows, identity) for r in rounds_a]
    index_b = [index_rows(r.rows, identity) for r in rounds_b]
    changes: list[MetricChange] = []
    only_a: list[dict[str, Any]] = []
    matched = 0
    for key, row in index_a[0].items():
        ident = {c: row.get(c) for c in identity}
        rows_a, rows_b = [ix.get(key) for ix in index_a], [ix.get(key) for ix in index_b]
        if any(r is None for r in (*rows_a, *rows_b)):
            only_a.append(ident)
            continue
        matched += 1
        changes += [round_change(ident, m, rows_a, rows_b, ra, th) for m in wanted]  # type: ignore[arg-type]
    only_b = [{c: r.get(c) for c in identity} for k, r in index_b[0].items() if k not in index_a[0]]
    changes, tests = _adjust(changes, alpha)
    out_notes = list(notes)
    if not matched:
        out_notes.append("runs: no rows matched")
    return Diff(a, b, ra.kind, config_changes, identity, matched, only_a, only_b, changes, [],
                out_notes, th, [], alpha, [], tests, [], replace(rerun, tests=tests))  # fmt: skip


def round_change(
    ident: dict[str, Any], metric: str, rows_a: Sequence[Mapping[str, Any]],
    rows_b: Sequence[Mapping[str, Any]], record: RunRecord, th: Thresholds,
) -> MetricChange:  # fmt: skip
    """One metric of one row over the rounds, before the p-values are adjusted."""
    timing = metric in record.columns.timing
    xs, ys = _values(rows_a, metric), _values(rows_b, metric)
    if xs is None or ys is None:
        return MetricChange(None, ident, metric, None, None, None, None, NA, timing)
    first = rows_a[0]
    of_rows = samples_field(record, first, metric) is None and any(
        c in first for c in record.columns.samples
    )
    if not timing or of_rows or len(xs) < 2:  # deterministic, or a ratio of two rows: info
        row_a = {**first, metric: statistics.median(xs)}
        row_b = {**rows_b[0], metric: statistics.median(ys)}
        return compare_metric(None, ident, metric, row_a, row_b, record, th)
    test = paired_test(xs, ys)
    a, b = _centre(xs), _centre(ys)
    change = (test.ratio - 1) * 100.0
    verdict, rule, moved = SAME, None, None
    if th.exceeds(metric, True, a, b):
        worse = (b > a) == (metric in record.columns.lower_is_better)
        verdict = moved = WORSE if worse else BETTER
        rule = PAIRED
    return MetricChange(None, ident, metric, a, b, test.ratio, change, verdict, timing, rule,
                        test.p_value, moved, True, test.ratios)  # fmt: skip


def _adjust(changes: list[MetricChange], alpha: float) -> tuple[list[MetricChange], int]:
    """Benjamini–Hochberg over every paired test: a change beyond its factor stays
    ``worse`` / ``better`` only when its adjusted p-value is below ``alpha``."""
    tested = [i for i, c in enumerate(changes) if c.rounds and c.p_value is not None]
    adjusted = benjamini_hochberg([changes[i].p_value or 0.0 for i in tested])
    out = list(changes)
    for i, q in zip(tested, adjusted, strict=True):
        c = changes[i]
        verdict = c.verdict if c.rule != PAIRED else (c.moved if q < alpha else NOISE)
        out[i] = replace(c, p_value=q, verdict=verdict or NOISE)
    return out, len(tested)


def match_identity(ra: RunRecord, rb: RunRecord, ignore: Sequence[str]) -> list[str]:
    """The identity columns rows are matched on: both runs' less ``ignore`` (ConfigError
    for a column that is not one)."""
    bad = [c for c in ignore if c not in ra.columns.identity]
    if bad:
        raise ConfigError(
            f"--ignore {bad[0]}: not an identity column of kind {ra.kind} (identity: {', '.join(ra.columns.identity)})"
        )
    identity = [c for c in ra.columns.identity if c in rb.columns.identity and c not in ignore]
    if not identity and ra.columns.identity:
        raise InputError("runs: the rows of A and B share no identity column: nothing to compare")
    return identity


def _values(rows: Sequence[Mapping[str, Any]], metric: str) -> list[float] | None:
    out = []
    for row in rows:
        v = row.get(metric)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


def _centre(values: Sequence[float]) -> float:
    """The geometric mean (every value positive), else the mean."""
    if all(v > 0 for v in values):
        return math.exp(sum(math.log(v) for v in values) / len(values))
    return sum(values) / len(values)
