"""The time breakdown of a streamed run (``timeline.jsonl``'s ``<part>_ms``, ``busy_pct``,
``mfu_pct`` and the summary's ``time``) against the whole-run computation: every iteration
recorded by :class:`~tests.helpers.whole_run_breakdown.CostRecorder` in a kept
:func:`~cpkv.serving.engine.simulate.simulate` that runs every iteration in full, and broken
down at once by :func:`~tests.helpers.whole_run_breakdown.bucket_breakdown` /
``time_summary`` over the iteration starts and the makespan of the same run with its
closed-form stretches (the runner's). The runner instead logs each full iteration's cost
arguments and each stretch as one segment, expands the segments and breaks the iterations
down with the model's vectorised ``breakdowns`` once the run has ended, summing the buckets
and the ``time`` as it reads them back; the numbers must be the same, byte for byte, for
both cost kinds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cpkv.core.config import load_config
from cpkv.runs.runner import run_experiment
from cpkv.serving.cost.model import CostModel
from cpkv.serving.cost.report import breakdown_columns
from cpkv.serving.cost.spec import CostSpec
from cpkv.serving.engine.settings import settings_from
from cpkv.serving.engine.simulate import simulate
from cpkv.serving.input.workload import ServingRequest, with_arrivals
from cpkv.serving.record.metrics import timeline
from tests.helpers.same_run import assert_same_result
from tests.helpers.whole_run_breakdown import CostRecorder, bucket_breakdown, time_summary

WORKLOAD = """\
kind: admit
name: streamed-breakdown
seed: 3
admit:
  mode: serving
  engine: cpkv
  workload:
    source: synthetic
    synthetic:
      count: 1500
      l1_cached_tokens: {choices: [0]}
      l2_cached_tokens: {choices: [0]}
      extend_tokens: {choices: [300, 1024, 3000]}
      max_new_tokens: {choices: [16, 256]}
  arrivals: {process: poisson, rate_rps: 12}
  iteration: {budget_tokens: 512}
  kv: {block_size: 16, capacity_blocks: 4096}
  serving: {timeline_points: 37}
"""
KV_KEYS = (
    "t_s", "kv_used_mean_pct", "kv_used_peak_pct", "kv_held_mean_pct", "running_mean",
    "waiting_mean",
)  # fmt: skip
"""The timeline's KV part (the rest of a point is the time breakdown, compared here)."""


def _requests(block, seed: int) -> tuple[ServingRequest, ...]:
    """The synthetic workload's requests drawn at once (``load_workload``), with their
    arrivals (the runner draws them lazily, as it reaches them)."""
    from cpkv.workload.sources import load_workload

    spec = block.workload
    if spec.synthetic.seed is None:
        spec = replace(spec, synthetic=replace(spec.synthetic, seed=seed))
    requests = [
        ServingRequest(
            r.rid,
            r.arrival_ms,
            r.fill_tokens,
            block.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens,
            r.l1_cached_tokens,
            r.l2_cached_tokens,
        )
        for r in load_workload(spec, seed=seed)
    ]
    return with_arrivals(requests, block.arrivals, seed)


def _compare(tmp_path: Path, overrides: list[str]) -> dict:
    config = tmp_path / "config.yaml"
    config.write_text(WORKLOAD)
    loaded = load_config("admit", str(config), overrides)
    run = run_experiment(loaded, tmp_path / "out", plots=False).path
    cfg = loaded.experiment
    block = cfg.admit
    requests = _requests(block, cfg.seed)
    # the runner's run (its stretches: its starts and makespan, float for float) ...
    res = simulate(requests, settings_from(block, block.cost.build(), cfg.seed))
    # ... and the same run iteration by iteration, each iteration's breakdown recorded
    recorder = CostRecorder(block.cost.build())
    full = simulate(requests, settings_from(block, recorder, cfg.seed), stretches=False)
    assert recorder.iterations == full.iterations == res.iterations > 2000
    assert_same_result(res, full)  # the same iterations (times within rounding)
    points = block.serving.timeline_points
    kv = [{k: p[k] for k in KV_KEYS} for p in timeline(res, block.kv.capacity_blocks, points)]
    parts = bucket_breakdown(res.timeline[0], recorder, res.end_us, points)
    expected = [
        json.dumps({**a, **b}, separators=(",", ":")) for a, b in zip(kv, parts, strict=True)
    ]
    assert len(expected) == points
    assert (run / "timeline.jsonl").read_text().splitlines() == expected
    doc = json.loads((run / "results.json").read_text())
    assert doc["summary"]["time"] == json.loads(json.dumps(time_summary(recorder, res.end_us)))
    return doc


@pytest.mark.parametrize("kind", ["roofline", "linear"])
def test_streamed_breakdown_is_the_whole_run_breakdown(tmp_path, kind):
    doc = _compare(tmp_path, [f"admit.cost.kind={kind}"])
    time = doc["summary"]["time"]
    assert time["busy_s"] > 0 and (time["mfu_pct"] is None) == (kind == "linear")


def test_a_tensor_parallel_roofline_with_load_back(tmp_path):
    """All six parts non-zero: TP 2 (all-reduce), a trace with L2 hits (load-back)."""
    doc = _compare(
        tmp_path,
        [
            "admit.cost.gpu=a100-80gb", "admit.cost.tp=2", "admit.workload.synthetic.count=1200",
            "admit.workload.synthetic.l2_cached_tokens={choices: [0, 512]}",
        ],
    )  # fmt: skip
    time = doc["summary"]["time"]
    assert all(time[f"{p}_s"] > 0 for p in ("gemm", "attention", "communication", "load"))


MODELS = {
    "linear": CostModel(),
    "linear, fitted-like": CostModel(4000.0, 25.0, 28.0, 0.047, 131072, 51.6),
    "roofline": CostSpec(model="llama-3-8b", gpu="h100-sxm").build(),
    "roofline tp 4": CostSpec(model="llama-2-70b", gpu="h100-sxm", tp=4).build(),
    "roofline a100 tp 2": CostSpec(gpu="a100-80gb", tp=2).build(),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_breakdowns_are_breakdown_row_by_row(name) -> None:
    """The vectorised breakdown against the scalar one on random iterations (decode-only,
    prefill-only, mixed, empty, with load-back), compared exactly."""
    model = MODELS[name]
    rng = np.random.default_rng(7)
    n = 3000
    prefill = rng.integers(0, 9000, n) * (rng.random(n) < 0.5)
    decode = rng.integers(0, 300, n) * (rng.random(n) < 0.8)
    decode_ctx = rng.integers(0, 10**7, n) * (decode > 0)
    before = rng.integers(0, 10**5, n) * (prefill > 0)
    prefill_ctx = prefill + before
    pairs = prefill * before + prefill * (prefill + 1) // 2
    loaded = rng.integers(0, 5000, n) * (rng.random(n) < 0.3)
    args = (prefill, decode, decode_ctx, prefill_ctx, pairs, loaded)
    columns = model.breakdowns(*args)
    assert len(columns) == 8
    assert all(isinstance(c, float) or c.shape == (n,) for c in columns)
    rows = np.column_stack([np.broadcast_to(np.asarray(c, dtype=float), (n,)) for c in columns])
    scalar = [model.breakdown(*(int(v) for v in one)) for one in zip(*args, strict=True)]
    assert rows.tolist() == [list(r) for r in scalar]
    # the columns as the run takes them: arrays of its own, floats where every row agrees
    taken = breakdown_columns(model, *args)
    assert [c.tolist() if isinstance(c, np.ndarray) else [c] * n for c in taken] == [
        list(c) for c in zip(*scalar, strict=True)
    ]
    arrays = [c for c in taken if isinstance(c, np.ndarray)]
    assert len({id(c) for c in arrays}) == len(arrays)
    assert all(c.flags.writeable and c.flags.c_contiguous for c in arrays)


def test_a_model_without_breakdowns_is_broken_down_row_by_row() -> None:
    """A model offering only ``breakdown`` (and a wrapper delegating attributes, whose
    inner model's ``breakdowns`` must not be taken): its rows, one by one."""

    class Plain:
        def breakdown(self, *args):
            return (float(sum(args)), 1.0, 0.0, 2.0, 0.0, 0.0, 0.5, float(args[0]))

        def __getattr__(self, name):
            return getattr(MODELS["linear"], name)

    args = [np.array([1, 2, 3]), np.array([0, 5, 0]), np.zeros(3, np.int64)] + [
        np.zeros(3, np.int64)
    ] * 3
    columns = breakdown_columns(Plain(), *args)
    assert [list(c) for c in columns] == [
        [1.0, 7.0, 3.0], [1.0] * 3, [0.0] * 3, [2.0] * 3, [0.0] * 3, [0.0] * 3, [0.5] * 3,
        [1.0, 2.0, 3.0],
    ]  # fmt: skip


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("roofline")])
def test_the_decode_line_is_batch_us(name) -> None:
    """A decode-only iteration from the roofline model's decode line (what the engine's
    decode-only stretches price with), within rounding."""
    from cpkv.serving.engine.stretch import decode_line

    model = MODELS[name]
    rng = np.random.default_rng(11)
    for running, context in zip(
        rng.integers(1, 5000, 2000), rng.integers(0, 10**9, 2000), strict=True
    ):
        running, context = int(running), int(context)
        line = decode_line(model, running)
        assert line is not None
        intercept, per_context = line
        assert intercept + per_context * context == pytest.approx(
            model.batch_us(0, running, context, 0, 0, 0), rel=1e-9
        )


@pytest.mark.parametrize("name", list(MODELS))
def test_batch_us_is_the_breakdowns_time(name) -> None:
    model = MODELS[name]
    rng = np.random.default_rng(3)
    for _ in range(3000):
        prefill = int(rng.integers(0, 9000)) * int(rng.random() < 0.5)
        before = int(rng.integers(0, 10**5)) if prefill else 0
        args = (
            prefill,
            int(rng.integers(0, 300)),
            int(rng.integers(0, 10**7)),
            prefill + before,
            prefill * before + prefill * (prefill + 1) // 2,
            int(rng.integers(0, 5000)) * int(rng.random() < 0.3),
        )
        assert model.batch_us(*args) == model.breakdown(*args)[0]


def test_a_wrapper_that_delegates_attributes_gets_no_decode_form() -> None:
    """A cost model wrapping another (CUDA-graph padding) changes decode times: the inner
    model's decode line (its stretch) must not be used for it, however its times come out."""
    from cpkv.serving.cost.stretch import Looped, stretch_durations
    from cpkv.serving.engine.stretch import decode_line

    class Wrapper:
        def __init__(self, inner) -> None:
            self.inner = inner

        def batch_us(self, *args):
            return self.inner.batch_us(*args)  # the same times: the probes would pass

        def __getattr__(self, name):
            return getattr(self.inner, name)

    assert decode_line(MODELS["roofline"], 8) is not None
    assert decode_line(Wrapper(MODELS["roofline"]), 8) is None
    assert isinstance(stretch_durations(Wrapper(MODELS["roofline"]), 0, 8, 100, 0, 0, 0, 0), Looped)


def test_the_dense_parts_remembered_across_batches_are_the_same(monkeypatch) -> None:
    """The roofline model remembers the dense parts of the token counts it has seen (and
    starts over past ``DENSE_MEMO``): batch after batch, the scalar breakdown's numbers."""
    from cpkv.serving.cost import roofline

    monkeypatch.setattr(roofline, "DENSE_MEMO", 40)
    model = CostSpec(model="llama-3-8b", gpu="h100-sxm").build()
    rng = np.random.default_rng(9)
    for batch in range(6):
        n = 400
        prefill = rng.integers(0, 30, n) * (rng.random(n) < 0.3)
        decode = rng.integers(0, 25 + 10 * batch, n)  # later batches: some counts not seen
        args = (prefill, decode, decode * 100, prefill, prefill, np.zeros(n, np.int64))
        columns = model.breakdowns(*args)
        rows = np.column_stack([np.broadcast_to(np.asarray(c, dtype=float), (n,)) for c in columns])
        scalar = [model.breakdown(*(int(v) for v in one)) for one in zip(*args, strict=True)]
        assert rows.tolist() == [list(r) for r in scalar], batch
        assert len(model._dense_known[0]) <= 40 + n
