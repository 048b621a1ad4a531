"""The end-of-run bucket sums (:mod:`cpkv.serving.bucket_sums`) against the plain loops that
define them, on random iterations (back to back, with idle gaps, some spanning several
buckets) spilled in chunks of several sizes, with breakdown columns stored, zero, constant in
a chunk and constant over the run: summed in one pass, and in ranges cut at every bucket (an
edge crossed by an iteration, or by none) taken by two processes, the numbers are the
loops', exactly; the spill's round trip; the run's totals."""

from __future__ import annotations

import numpy as np
import pytest

from cpkv.serving import bucket_sums
from cpkv.serving.sample_spill import SampleSpill
from cpkv.serving.timeline import TimelineBuckets, bucket_pieces
from tests.helpers.whole_run_breakdown import loop_breakdown

POINTS = 13


def _iterations(n: int = 2500, seed: int = 5):
    rng = np.random.default_rng(seed)
    duration = rng.exponential(1.0, n) * np.where(rng.random(n) < 0.01, 40.0, 1.0) + 1e-3
    duration[[300, 1700, 1701]] = 2000.0  # each over two buckets
    gap = np.where(rng.random(n) < 0.02, rng.exponential(100.0, n), 0.0)
    starts, t = [], 0.0
    for d, g in zip(duration.tolist(), gap.tolist(), strict=True):
        t += g
        starts.append(t)
        t += d  # (the loop's own additions: a start is the previous stop)
    rows = np.column_stack([duration, rng.random((n, 7)) * duration[:, None]])
    rows[:, 6] = 0.75  # the overhead: the same in every iteration of the run
    rows[:, 4] = 0.0  # no all-reduce
    rows[: n // 2, 5] = 0.0  # no load-back in the first half
    rows[:, 2] = np.repeat(rng.random(n // 100 + 1), 100)[:n]  # constant in runs of 100
    counts = rng.integers(0, 5000, (4, n))
    counts[3, :1200] = 0  # nobody waiting: no sum at all
    counts[2, 1200:1500] = 7  # as many running in every iteration of some chunks
    counts[1, 2000:] += 70_000  # (two bytes do not hold them)
    return np.array(starts), rows, counts, t


def _loop_kv(starts, rows, counts, end):
    """KV sums as the loop over the iterations: each adds its pieces to their buckets."""
    width = end / POINTS
    sums = [[0.0] * 4 for _ in range(POINTS)]
    peak = [0] * POINTS
    for i, t in enumerate(starts.tolist()):
        k = min(int(t / width), POINTS - 1)
        values = [int(v) for v in counts[:, i]]
        for kk, piece in bucket_pieces(t, t + float(rows[i, 0]), k, width, POINTS - 1, *values):
            sums[kk] = [a + v for a, v in zip(sums[kk], piece[:4], strict=True)]
            peak[kk] = max(peak[kk], piece[4])
    return sums, peak


def _spill(tmp_path, starts, rows, counts, chunk):
    spill = SampleSpill(tmp_path)
    stops = starts + rows[:, 0]
    for a in range(0, len(starts), chunk):
        b = min(a + chunk, len(starts))
        parts = [rows[a:b, j].copy() for j in range(1, 8)]
        runs = [0, *(i - a for i in range(a + 1, b) if starts[i] != stops[i - 1])]
        heads = [(i, float(starts[a + i])) for i in runs]
        spill.append(rows[a:b, 0], heads, starts[a:b], tuple(counts[:, a:b]), parts)
    return spill


@pytest.fixture(scope="module")
def run():
    starts, rows, counts, end = _iterations()
    kv, peak = _loop_kv(starts, rows, counts, end)
    parts = loop_breakdown(starts.tolist(), rows.tolist(), end, POINTS)
    return starts, rows, counts, end, (kv, peak, parts)


@pytest.mark.parametrize("chunk", [7, 100, 1000, 10**9])
def test_one_pass_is_the_plain_loops(tmp_path, monkeypatch, run, chunk) -> None:
    starts, rows, counts, end, (kv, peak, parts) = run
    monkeypatch.setattr(bucket_sums, "SPLIT_MIN_ITERATIONS", 10**12)
    spill = _spill(tmp_path, starts, rows, counts, chunk)
    if chunk == 100:  # what the spill kept as one value, and what it could skip at the end
        assert spill.constant_parts() == {4: 0.0, 6: 0.75}
        assert {type(c.parts[1]) for c in spill.chunks} == {float}  # column 2: one run a chunk
        assert {c.parts[4] for c in spill.chunks[: len(spill.chunks) // 2]} == {0.0}
        assert {c.counts[3] for c in spill.chunks[:12]} == {0}
        assert {c.counts[2] for c in spill.chunks[12:15]} == {7}
        assert [str(c.counts[1]) for c in spill.chunks[19:21]] == ["uint16", "uint32"]
    if chunk == 1000:  # column 2 as runs, the others (varying) as doubles
        assert [c.parts[1] for c in spill.chunks] == [10, 10, 5]
        assert {c.parts[0] for c in spill.chunks} == {None}
    got_kv, got_peak, got_parts = bucket_sums.spilled_bucket_sums(spill, end, POINTS)
    assert got_kv.tolist() == kv
    assert got_peak == peak
    assert got_parts.tolist() == parts
    # the KV sums are also those of the timeline of a kept run, chunk by chunk
    buckets = TimelineBuckets(end, POINTS)
    for a in range(0, len(starts), chunk):
        buckets.add(starts[a : a + chunk], rows[a : a + chunk, 0], *counts[:, a : a + chunk])
    buckets.rows(100)
    assert buckets.sums.tolist() == kv


@pytest.mark.parametrize("chunk", [7, 1000])
def test_ranges_cut_at_any_bucket_are_the_plain_loops(tmp_path, monkeypatch, run, chunk) -> None:
    """Two ranges cut at every bucket (edges crossed by an iteration, and by none), and
    many, taken by this process and a forked one: the loops' numbers."""
    starts, rows, counts, end, (kv, peak, parts) = run
    width = end / POINTS
    stops = starts + rows[:, 0]
    crossed = 0
    spill = _spill(tmp_path, starts, rows, counts, chunk)
    for cuts in [[k] for k in range(1, POINTS)] + [[2, 3, 7, 8, 11], list(range(1, POINTS))]:
        if len(cuts) == 1:
            crossed += bool(((starts < cuts[0] * width) & (stops > cuts[0] * width)).any())
        monkeypatch.setattr(bucket_sums, "_range_cuts", lambda *a, c=cuts: c)
        got_kv, got_peak, got_parts = bucket_sums.spilled_bucket_sums(spill, end, POINTS, True)
        assert got_kv.tolist() == kv, cuts
        assert got_peak == peak, cuts
        assert got_parts.tolist() == parts, cuts
    assert 0 < crossed < POINTS - 1  # edges crossed by an iteration, and edges crossed by none
    spans = [int(b / width) - int(a / width) for a, b in zip(starts, stops, strict=True)]
    assert max(spans) >= 2  # an iteration with pieces in three buckets


def test_the_ranges_hold_about_as_many_iterations(tmp_path, monkeypatch, run) -> None:
    starts, rows, counts, end, _ = run
    spill = _spill(tmp_path, starts, rows, counts, 100)
    monkeypatch.setattr(bucket_sums, "SPLIT_MIN_ITERATIONS", 0)
    monkeypatch.setattr(bucket_sums, "RANGES", 4)
    width = end / POINTS
    # the buckets of the iterations 1/4, 2/4, 3/4 in, their starts interpolated in their chunks
    expected = set()
    for r in (1, 2, 3):
        index = len(starts) * r // 4
        a = index // 100 * 100
        b = min(a + 99, len(starts) - 1)
        expected.add(
            int((starts[a] + (starts[b] - starts[a]) * ((index - a) / (b - a + 1))) / width)
        )
    expected = sorted(expected)
    assert bucket_sums._range_cuts(spill, end, POINTS) == [k for k in expected if k > 0]
    assert len(expected) > 1
    monkeypatch.setattr(bucket_sums, "SPLIT_MIN_ITERATIONS", len(starts) + 1)
    assert bucket_sums._range_cuts(spill, end, POINTS) == []
    # asked to fork, it does (here: one thread, Linux); not on one core, nor when not asked
    monkeypatch.setattr(bucket_sums, "SPLIT_MIN_ITERATIONS", 0)
    forks = []
    monkeypatch.setattr(bucket_sums, "forked", lambda work: forks.append(1) or work)
    for fork, cores, expected_forks in ((True, 2, 1), (False, 2, 0), (True, 1, 0)):
        monkeypatch.setattr(bucket_sums.os, "cpu_count", lambda c=cores: c)
        forks.clear()
        bucket_sums.spilled_bucket_sums(spill, end, POINTS, fork)
        linux = bucket_sums.sys.platform.startswith("linux")
        assert len(forks) == (expected_forks if linux else 0)


def test_an_error_in_the_forked_process_is_one_error_here() -> None:
    if not hasattr(bucket_sums.os, "fork"):
        pytest.skip("no fork here")
    wait = bucket_sums.forked(lambda: 1 / 0)
    with pytest.raises(RuntimeError, match="forked process failed: ZeroDivisionError"):
        wait()
    assert bucket_sums.forked(lambda: {"sums": [1.5]})() == {"sums": [1.5]}


def test_the_spill_gives_back_what_it_was_given(tmp_path) -> None:
    """Chunks written in every form (runs of a column, one float, doubles; counts of one
    value, one byte, two, four, eight) read back as written; starts recomputed from each run
    of back-to-back iterations (idle time between them) are the starts given."""
    from cpkv.serving.iteration_log import IterationLog

    rng = np.random.default_rng(2)
    n = 5000
    dt = rng.exponential(3.0, n)
    gaps = np.where(rng.random(n) < 0.01, 50.0, 0.0)
    t0 = np.empty(n)
    t = 10.0
    for i in range(n):  # the loop's own additions
        t += gaps[i]
        t0[i] = t
        t += dt[i]
    counts = (
        rng.integers(0, 200, n), rng.integers(0, 60_000, n), np.full(n, 3),
        rng.integers(2**33, 2**34, n),
    )  # fmt: skip
    parts = [np.repeat(rng.random(50), 100), 0.0, rng.random(n), np.full(n, 2.5)] + [
        rng.random(n) for _ in range(3)
    ]
    spill = SampleSpill(tmp_path)
    for a in range(0, n, 1800):
        b = min(a + 1800, n)
        runs = [0, *(i - a for i in range(a + 1, b) if gaps[i])]
        spill.append(
            dt[a:b], [(i, float(t0[a + i])) for i in runs], t0[a:b],
            tuple(c[a:b] for c in counts), [p if isinstance(p, float) else p[a:b] for p in parts],
        )  # fmt: skip
    first = spill.chunks[0]
    assert first.parts[:4] == (18, 0.0, None, 2.5)  # runs, one float, doubles, one float
    assert [str(k) for k in first.counts] == ["uint8", "uint16", "3", "uint64"]
    runs = sum(c.parts[0] for c in spill.chunks)  # 8-byte values, 4-byte lengths
    assert spill.size == sum(c.size for c in spill.chunks) == n * (8 * 5 + 1 + 2 + 8) + 12 * runs
    reader = spill.reader()
    for chunk in spill.chunks:
        a, b = chunk.first, chunk.first + chunk.count
        got = reader.read(chunk)
        assert got.t0.tolist() == t0[a:b].tolist()
        assert got.stop.tolist() == (t0[a:b] + dt[a:b]).tolist()
        for s, values in enumerate(counts):
            assert np.array_equal(np.broadcast_to(got.counts[s], (b - a,)), values[a:b])
        for r, j in enumerate(got.stored):
            expected = dt if j == 0 else parts[j - 1]
            assert got.floats[r].tolist() == expected[a:b].tolist()
        assert got.constants == {2: 0.0, 4: 2.5}
    assert spill.start_us(4321) == t0[4321]
    spill.close()
    # the samples of a spilled run, read back a chunk at a time (IterationLog.chunks)
    log = IterationLog(16, 16, keep=False, spill_dir=tmp_path, cost=object())
    log.spill = _spill(tmp_path, t0, np.column_stack([dt, *np.zeros((7, n))]),
                       np.array([c % 1000 for c in counts]), 1800)  # fmt: skip
    read = [np.concatenate(c) for c in zip(*log.chunks(), strict=True)]
    assert [v.tolist() for v in read] == [
        t0.tolist(),
        dt.tolist(),
        *([int(v) for v in c % 1000] for c in counts),
    ]
    log.discard()


def test_the_run_totals_are_the_sums_one_by_one() -> None:
    """The breakdown summed over batches, columns as arrays or as one float (zero too): the
    sums of a loop over the rows, in order."""
    from cpkv.serving.cost.report import TimeTotals

    rng = np.random.default_rng(4)
    rows = rng.random((3000, 8)) * 1e3
    rows[:, 2] = 0.0
    rows[:, 6] = 0.3
    totals = TimeTotals()
    for a in range(0, 3000, 700):
        b = min(a + 700, 3000)
        columns = [rows[a:b, j].copy() for j in range(8)]
        columns[2], columns[6] = 0.0, 0.3
        totals.add(columns, b - a)
    expected = [0.0] * 8
    for row in rows.tolist():
        expected = [s + v for s, v in zip(expected, row, strict=True)]
    assert totals.sums.tolist() == expected
    assert totals.sums[6] != 0.3 * 3000  # (what a product would give instead)
