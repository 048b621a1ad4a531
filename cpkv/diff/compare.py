"""Compare two runs (or two sweeps), as ``cpkv diff`` does. Reads saved results only.

First the summaries: every headline number and summary total of A against B
(:mod:`cpkv.diff.summary`). Then the rows, matched on their identity columns (every field
that is neither a metric, an outcome nor raw samples), never by position; a kind may first
turn its rows into rows that identify better (``diff_view`` of :mod:`cpkv.core.kinds`: an
admission run's ticks become one row per admitted request). Each compared metric of a matched
row gets A, B, ratio B/A, change % and a verdict:

* ``same``: the change is within the metric's limit: for a timing metric a factor (B/A and
  A/B at most ``--factor``, default 1.1), for the others a threshold (default 0 %: they are
  deterministic);
* ``noise``: a timing metric moved beyond its factor, but the move is not significant:
  the rows' raw samples do not differ by a Mann–Whitney U test at ``alpha`` (rows without
  samples: their uncertainty intervals overlap; :mod:`cpkv.diff.rules`);
* ``worse`` / ``better``: a significant move, in the metric's bad / good direction.

Any ``worse`` (of a row metric or of a summary number with a direction) is a regression
(``cpkv diff`` exits 1).

Two serving runs are judged instead by one ranked verdict (:mod:`cpkv.diff.serving.verdict`): their
row becomes the serving table, their requests are compared one by one
(:mod:`cpkv.diff.serving.requests`), and the rest of their summary is reported as ``changed``.

``cpkv diff --rerun`` measures instead of reading: :mod:`cpkv.diff.rerun.runs` runs both configs
again, interleaved, and judges each row's rounds in pairs (:mod:`cpkv.diff.rerun.paired`); its
:class:`Diff` says how (:class:`Rerun`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cpkv.core.errors import ConfigError, InputError
from cpkv.core.kinds import KINDS
from cpkv.diff.match import column_values, config_changes, index_rows
from cpkv.diff.ranktest import RankTest, benjamini_hochberg
from cpkv.diff.rules import (
    BETTER,
    DEFAULT_ALPHA,
    INFO,
    NA,
    NOISE,
    RANK,
    SAME,
    WORSE,
    MetricChange,
    Thresholds,
    compare_metric,
    rank_test,
    samples_field,
    spread,
)
from cpkv.diff.serving.verdict import (
    REGRESSION,
    ServingDiff,
    check_metrics,
    compare_serving,
    is_serving,
)
from cpkv.diff.summary import CHANGED, SummaryChange, compare_summaries, row_metric_of
from cpkv.runs.results import RunRecord
from cpkv.runs.rundir import LoadedRun, load_run
from cpkv.sweep.listing import SweepView, open_target

__all__ = [
    "BETTER",
    "NA",
    "NOISE",
    "SAME",
    "WORSE",
    "Diff",
    "MetricChange",
    "ServingDiff",
    "SummaryChange",
    "Thresholds",
    "compare_metric",
    "diff_paths",
    "spread",
]


@dataclass(frozen=True)
class Rerun:
    """How a ``--rerun`` diff measured: ``rounds`` of A then B; ``runs``: one
    ``{round, side, path, start_utc, end_utc}`` per run, in the order they ran; ``kept``: the
    folder holding them (None: a temporary folder, removed); ``tests``: paired tests
    (row x metric) adjusted together."""

    rounds: int
    runs: tuple[dict[str, Any], ...]
    kept: str | None
    tests: int


@dataclass(frozen=True)
class Diff:
    """Everything ``cpkv diff`` reports; ``regressions`` decides the exit code."""

    a: str
    b: str
    kind: str
    config_changes: list[tuple[str, Any, Any]]
    identity: list[str]
    matched: int
    only_a: list[dict[str, Any]]
    only_b: list[dict[str, Any]]
    changes: list[MetricChange]
    outcome_changes: list[tuple[str | None, dict[str, Any], str, Any, Any]]
    notes: list[str]
    thresholds: Thresholds
    summary: list[SummaryChange] = field(default_factory=list)
    alpha: float = DEFAULT_ALPHA
    views: list[str] = field(default_factory=list)  # how rows were turned before matching
    tested_rows: int = 0  # row pairs whose raw samples were rank-tested
    serving: list[ServingDiff] = field(default_factory=list)  # one per pair of serving runs
    rerun: Rerun | None = None  # set when both sides were measured again, in rounds

    @property
    def regressions(self) -> list[MetricChange | SummaryChange | ServingDiff]:
        worse: list[MetricChange | SummaryChange | ServingDiff] = [
            c for c in [*self.summary, *self.changes] if c.verdict == WORSE
        ]
        return worse + [s for s in self.serving if s.verdict == REGRESSION]

    def counts(self) -> dict[str, int]:
        """Verdicts of the row metrics."""
        return {
            v: sum(c.verdict == v for c in self.changes)
            for v in (WORSE, BETTER, NOISE, INFO, SAME, NA)
        }

    def rules(self) -> dict[str, int]:
        """How the timing changes beyond their factor were judged (rank, interval, threshold, paired)."""
        out: dict[str, int] = {}
        for c in self.changes:
            if c.rule:
                out[c.rule] = out.get(c.rule, 0) + 1
        return out


def diff_paths(
    a: str,
    b: str,
    thresholds: Thresholds | None = None,
    metrics: Sequence[str] = (),
    ignore: Sequence[str] = (),
    alpha: float = DEFAULT_ALPHA,
) -> Diff:
    """Compare two run directories or two sweep directories (InputError for anything else).

    ``ignore``: identity columns not to match rows on (to compare runs that differ in them);
    ``alpha``: the rank test's significance level for timing metrics.
    """
    check_alpha(alpha)
    ta, tb = open_target(a), open_target(b)
    th = thresholds or Thresholds()
    if isinstance(ta, SweepView) != isinstance(tb, SweepView):
        which = a if isinstance(ta, SweepView) else b
        raise InputError(
            f"{which}: is a sweep and the other is a run; compare two runs or two sweeps"
        )
    acc = _Acc(str(a), str(b), th, list(metrics), list(ignore), alpha)
    if isinstance(ta, SweepView) and isinstance(tb, SweepView):
        _sweeps(acc, ta, tb)
    else:
        assert isinstance(ta, LoadedRun) and isinstance(tb, LoadedRun)
        if ta.record.kind != tb.record.kind:
            raise InputError(
                f"{b}: is kind {tb.record.kind!r} but {a} is kind {ta.record.kind!r}; compare runs of one kind"
            )
        acc.kind = ta.record.kind
        acc.configs(None, ta, tb)
        acc.records(None, ta, tb)
    return acc.result()


def check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha {alpha:g}: must be between 0 and 1 (exclusive), e.g. 0.05")


def row_metrics(ra: RunRecord, rb: RunRecord, wanted: Sequence[str]) -> list[str]:
    """The row metrics to compare: ``wanted`` (ConfigError for one the kind lacks), else the
    metrics of the kind's table, else every metric; only those both runs have."""
    unknown = [m for m in wanted if m not in ra.columns.metrics]
    if unknown:
        raise ConfigError(
            f"--metric {unknown[0]}: not a metric of kind {ra.kind} (metrics: {', '.join(ra.columns.metrics)})"
        )
    metrics = (
        list(wanted)
        or [c for c in ra.table_columns or () if c in ra.columns.metrics]
        or list(ra.columns.metrics)
    )
    return [m for m in metrics if m in rb.columns.metrics]


class _Acc:
    """Collects the parts of a diff while runs (or sweep points) are compared."""

    def __init__(
        self, a: str, b: str, th: Thresholds, metrics: list[str], ignore: list[str], alpha: float
    ) -> None:
        self.a, self.b, self.th, self.metrics, self.ignore, self.alpha = (
            a, b, th, metrics, ignore, alpha,
        )  # fmt: skip
        self.kind = ""
        self.summary: list[SummaryChange] = []
        self.views: list[str] = []
        # every row rank test of the diff, with the changes it judged (adjusted in result())
        self.tested: dict[int, tuple[RankTest, list[int]]] = {}
        self.config_changes: list[tuple[str, Any, Any]] = []
        self.identity: list[str] = []
        self.matched = 0
        self.only_a: list[dict[str, Any]] = []
        self.only_b: list[dict[str, Any]] = []
        self.changes: list[MetricChange] = []
        self.outcomes: list[tuple[str | None, dict[str, Any], str, Any, Any]] = []
        self.notes: list[str] = []
        self.serving: list[ServingDiff] = []

    def configs(self, point: str | None, ra: LoadedRun, rb: LoadedRun) -> None:
        for key, va, vb in config_changes(ra.config or {}, rb.config or {}):
            if point is None or (key, va, vb) not in self.config_changes:
                self.config_changes.append((key, va, vb))

    def records(self, point: str | None, run_a: LoadedRun, run_b: LoadedRun) -> None:
        if is_serving(run_a.record) and is_serving(run_b.record):
            self.serving_records(point, run_a, run_b)
            return
        self.summary += compare_summaries(point, run_a.record, run_b.record, self.th)
        ra, rb = _view(run_a), _view(run_b)
        if ra is None or rb is None:  # no view, or only one run's rows have one: its own rows
            ra, rb = run_a.record, run_b.record
        elif ra.notes and ra.notes[0] not in self.views:
            self.views.append(ra.notes[0])
        self.rows(point, ra, rb)

    def serving_records(self, point: str | None, run_a: LoadedRun, run_b: LoadedRun) -> None:
        """Two serving runs: the ranked serving table and the requests; the summary values
        that are not the row's, as ``changed`` (the serving verdict alone judges)."""
        ra, rb = run_a.record, run_b.record
        self.check_ignore(ra)
        check_metrics(self.metrics, ra)
        dirs = (Path(run_a.path), Path(run_b.path))
        found = compare_serving(point, ra, rb, dirs, self.th, self.metrics)
        self.serving.append(found)
        covered = found.covered() | set(ra.columns.metrics) | set(rb.columns.metrics)
        for c in compare_summaries(point, ra, rb, self.th):
            if c.key.rsplit(".", 1)[-1] in covered or row_metric_of(c.key) in covered:
                continue  # (the table shows it: a row metric, or a summary value mirroring one)
            self.summary.append(replace(c, verdict=CHANGED) if c.verdict in (WORSE, BETTER) else c)
        self.notes += [f"{point}: {n}" if point else n for n in found.notes]

    def check_ignore(self, record: RunRecord) -> None:
        bad = [c for c in self.ignore if c not in record.columns.identity]
        if bad:
            raise ConfigError(
                f"--ignore {bad[0]}: not an identity column of kind {record.kind} (identity: {', '.join(record.columns.identity)})"
            )

    def rows(self, point: str | None, ra: RunRecord, rb: RunRecord) -> None:
        self.check_ignore(ra)
        identity = [
            c for c in ra.columns.identity if c in rb.columns.identity and c not in self.ignore
        ]
        if not identity and (ra.columns.identity or rb.columns.identity) and not self.ignore:
            raise ConfigError(
                f"{point or 'runs'}: the rows of A ({', '.join(ra.columns.identity) or 'no identity'}) "
                f"and B ({', '.join(rb.columns.identity) or 'no identity'}) share no identity "
                "column, so no row of one matches a row of the other: nothing to compare "
                "(runs of different modes or policies?)"
            )
        if set(identity) | set(self.ignore) != set(ra.columns.identity) | set(rb.columns.identity):
            self.notes.append(
                f"{point or 'runs'}: identity columns differ; rows matched on {', '.join(identity)}"
            )
        self.identity += [c for c in identity if c not in self.identity]
        metrics = row_metrics(ra, rb, self.metrics)
        rows_b = index_rows(rb.rows, identity)
        for key, row_a in index_rows(ra.rows, identity).items():
            row_b = rows_b.pop(key, None)
            ident = {c: row_a.get(c) for c in identity}
            if row_b is None:
                self.only_a.append({"point": point, **ident} if point else ident)
                continue
            self.matched += 1
            tests = {f: rank_test(row_a, row_b, f) for f in ra.columns.samples if f in row_b}
            for m in metrics:
                field = samples_field(ra, row_a, m)
                test = tests.get(field) if field else None
                self.changes.append(
                    compare_metric(point, ident, m, row_a, row_b, ra, self.th, self.alpha, test)
                )
                if test is not None:
                    self.tested.setdefault(id(test), (test, []))[1].append(len(self.changes) - 1)
            for test in tests.values():
                if test is not None:
                    self.tested.setdefault(id(test), (test, []))
            for col in (c for c in ra.columns.outcomes if c in rb.columns.outcomes):
                if row_a.get(col) != row_b.get(col):
                    self.outcomes.append((point, ident, col, row_a.get(col), row_b.get(col)))
        for row_b in rows_b.values():
            ident = {c: row_b.get(c) for c in identity}
            self.only_b.append({"point": point, **ident} if point else ident)
        if ra.rows and rb.rows and not any(c.point == point for c in self.changes):
            apart = [c for c in identity if column_values(ra.rows, c) != column_values(rb.rows, c)]
            hint = (
                f" (they differ in {', '.join(apart)}: --ignore {' --ignore '.join(apart)})"
                if apart
                else ""
            )
            self.notes.append(f"{point or 'runs'}: no rows matched{hint}")

    def adjust(self) -> None:
        """Benjamini–Hochberg over every row tested: a timing change stays significant only
        when its row's adjusted p-value is below alpha (see :mod:`cpkv.diff.rules`)."""
        entries = list(self.tested.values())
        adjusted = benjamini_hochberg([t.p_value for t, _ in entries])
        for (_, indexes), q in zip(entries, adjusted, strict=True):
            for i in indexes:
                c = self.changes[i]
                if c.rule != RANK:
                    continue
                verdict = c.moved if q < self.alpha and c.agrees else NOISE
                self.changes[i] = replace(c, p_value=q, verdict=verdict)

    def result(self) -> Diff:
        self.adjust()
        return Diff(self.a, self.b, self.kind, self.config_changes, self.identity, self.matched, self.only_a,
                    self.only_b, self.changes, self.outcomes, self.notes, self.th, self.summary,
                    self.alpha, self.views, len(self.tested), self.serving)  # fmt: skip


def _view(run: LoadedRun) -> RunRecord | None:
    """The rows ``cpkv diff`` matches for this run (its kind's ``diff_view``), or None."""
    kind = run.record.kind
    if kind not in KINDS:
        return None
    fn = KINDS.get(kind).diff_view_fn()
    return fn(run.record, Path(run.path)) if fn is not None else None


def _sweeps(acc: _Acc, sa: SweepView, sb: SweepView) -> None:
    points_b = {p.match_key: p for p in sb.plan.points}
    kinds = []
    for pa in sa.plan.points:
        pb = points_b.pop(pa.match_key, None)
        if pb is None:
            acc.notes.append(f"point {pa.name} is only in A")
            continue
        status = {
            side: _status(view, point) for side, view, point in (("A", sa, pa), ("B", sb, pb))
        }
        not_run = [f"{st} in {side}" for side, st in status.items() if st not in (None, "complete")]
        if not_run:
            acc.notes.append(f"point {pa.name} not compared: {', '.join(not_run)}")
            continue
        try:
            ra, rb = load_run(sa.point_dir(pa.name)), load_run(sb.point_dir(pb.name))
        except InputError as err:
            acc.notes.append(f"point {pa.name} not compared: {err}")
            continue
        kinds.append(pa.kind)
        label = pa.name.split("_", 1)[-1]
        acc.configs(label, ra, rb)
        acc.records(label, ra, rb)
    acc.notes.extend(f"point {p.name} is only in B" for p in points_b.values())
    if not kinds:
        raise InputError(
            f"{acc.b}: no point of this sweep matches a finished point of {acc.a} (same kind, config name and swept values)"
        )
    acc.kind = ",".join(dict.fromkeys(kinds))


def _status(view: SweepView, point: Any) -> str | None:
    """How a sweep's summary says ``point`` ended (None when it does not say)."""
    for entry in view.summary.get("points") or []:
        if entry.get("index") == point.index:
            return entry.get("status")
    return None
