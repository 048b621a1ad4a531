"""Stretches in closed form (:mod:`cpkv.serving.cost.stretch`): :class:`AffinePieces`'
sums and ``steps_within`` against brute force, :class:`Looped`, and every model's
``stretch`` against its own ``batch_us`` iteration by iteration (random shapes, both GPUs,
tensor parallelism, decode-only and mixed stretches, stretches crossing the prefill
attention's roofline corner) and summed over up to a million iterations; the CUDA-graph
wrapper's stretches and their padding accounting."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import numpy as np
import pytest

from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.graph_padding import PaddedDecodeCost
from cpkv.serving.cost.model import CostModel
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.shapes import MODELS
from cpkv.serving.cost.stretch import AffinePieces, Looped, stretch_durations

# -- AffinePieces -------------------------------------------------------------------------


class Counted(AffinePieces):
    """AffinePieces counting its ``total`` calls."""

    __slots__ = ("calls",)

    def __init__(self, pieces) -> None:
        super().__init__(pieces)
        self.calls = 0

    def total(self, steps: int) -> float:
        self.calls += 1
        return super().total(steps)


def random_pieces(
    rng: random.Random, count: int, continuous: bool = False, spread: int = 1
) -> list[tuple[int, float, float]]:
    """Random pieces; ``continuous``: as the models' (the larger of affine terms: each piece
    starts where the last one ended, with a steeper slope); firsts apart by up to ``5000 x
    spread``."""
    scale = 10.0 ** rng.uniform(-3, 5)
    pieces, first = [], 0
    for _ in range(count):
        b = 0.0 if rng.random() < 0.25 else scale * 10.0 ** rng.uniform(-9, 0)
        if continuous and pieces:
            _, a0, b0 = pieces[-1]
            b = b0 + b
            a = a0 + b0 * first - b * first
        else:
            a = scale * rng.uniform(0.01, 2.0)
        pieces.append((first, a, b))
        first += rng.choice((1, 2, rng.randint(1, 50), rng.randint(1, 5000))) * rng.choice(
            (1, spread)
        )
    return pieces


def brute_steps_within(durations, budget: float, limit: int) -> int:
    for k in range(1, limit + 1):
        if durations.total(k) >= budget:
            return k
    return limit


def test_total_and_duration_are_the_pieces_sums() -> None:
    rng = random.Random(1)
    for _ in range(300):
        pieces = random_pieces(rng, rng.choice((1, 2, 3, 4)))
        d = AffinePieces(pieces)
        firsts = [p[0] for p in pieces]
        last = firsts[-1] + rng.randint(1, 300)
        exact = [0.0]
        for j in range(last):
            first, a, b = pieces[max(i for i, f in enumerate(firsts) if f <= j)]
            assert d.duration(j) == a + b * j
            exact.append(exact[-1] + (a + b * j))
        for k in {0, 1, 2, *firsts, *(f + 1 for f in firsts), last, rng.randint(0, last)}:
            assert d.total(k) == pytest.approx(
                math.fsum(d.duration(j) for j in range(k)), rel=1e-12, abs=0.0
            )
    assert AffinePieces([(0, 1.0, 1.0)]).total(-3) == 0.0
    with pytest.raises(ValueError):
        AffinePieces([(0, 1.0, 1.0)]).duration(-1)
    with pytest.raises(ValueError):
        AffinePieces([(1, 1.0, 1.0)])
    with pytest.raises(ValueError):
        AffinePieces([(0, 1.0, 1.0), (0, 1.0, 1.0)])


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("continuous", [True, False])
def test_steps_within_is_the_least_k_by_brute_force(count: int, continuous: bool) -> None:
    rng = random.Random(count)
    most_calls = 0
    for _ in range(1500):
        d = Counted(random_pieces(rng, count, continuous))
        limit = rng.choice((1, 2, 3, rng.randint(1, 100), rng.randint(1, 3000)))
        full = d.total(limit)
        budget = rng.choice(
            (
                full * rng.uniform(0.0, 1.0),  # inside
                full * rng.uniform(1.0, 3.0),  # beyond: limit
                d.total(rng.randint(1, limit)),  # a sum exactly: that k
                math.nextafter(d.total(rng.randint(1, limit)), math.inf),  # just above one
                d.duration(0) * rng.uniform(1e-9, 1.0),  # tiny: 1
                1e-300,
                1e300,
            )
        )
        d.calls = 0
        got = d.steps_within(budget, limit)
        most_calls = max(most_calls, d.calls)
        assert got == brute_steps_within(d, budget, limit), (d.pieces, budget, limit)
    assert most_calls <= 8


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("continuous", [True, False])
def test_steps_within_huge_stretches_in_a_handful_of_sums(count: int, continuous: bool) -> None:
    rng = random.Random(10 + count)
    most_calls = 0
    for _ in range(2000):
        d = Counted(random_pieces(rng, count, continuous, spread=10**6))
        limit = rng.choice((10**6, 10**9, 10**12, 1 << 62))
        k_true = rng.randint(1, min(limit, 10**12))
        budget = rng.choice(
            (d.total(k_true), d.total(k_true) * rng.uniform(0.999, 1.0), d.total(limit) * 2)
        )
        d.calls = 0
        k = d.steps_within(budget, limit)
        most_calls = max(most_calls, d.calls)
        assert 1 <= k <= limit
        if d.total(limit) < budget:
            assert k == limit
        else:
            assert d.total(k) >= budget
            assert k == 1 or d.total(k - 1) < budget
    # (pieces far apart whose durations jump down below the sum's last bit make the float
    # sums flat over long runs: found by galloping, in more calls)
    assert most_calls <= (8 if continuous else 64)


def test_steps_within_edges() -> None:
    d = AffinePieces([(0, 5.0, 0.0)])
    assert d.steps_within(5.0, 10) == 1
    assert d.steps_within(5.000001, 10) == 2
    assert d.steps_within(50.0, 10) == 10
    assert d.steps_within(51.0, 10) == 10  # never reached: the limit
    assert d.steps_within(1.0, 1) == 1
    assert d.steps_within(1e9, 1) == 1
    assert d.steps_within(0.0, 10) == 1
    assert d.steps_within(math.inf, 1 << 62) == 1 << 62
    assert d.steps_within(1.0, 0) == 0


# -- Looped ---------------------------------------------------------------------------------


class NoStretch:
    """A model with ``batch_us`` only (the linear model's, through a wrapper)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0

    def batch_us(self, *args) -> float:
        self.calls += 1
        return self.inner.batch_us(*args)


def test_looped_is_the_models_iterations_in_order() -> None:
    inner = CostModel()
    cost = NoStretch(inner)
    args = (100, 7, 3000, 700, 9000, 100, 10000)
    d = stretch_durations(cost, *args)
    assert isinstance(d, Looped)
    P, D, dc, pc, pairs, pc_step, pairs_step = args
    ref = [
        inner.batch_us(P, D, dc + D * j, pc + pc_step * j, pairs + pairs_step * j, 0)
        for j in range(50)
    ]
    assert [d.duration(j) for j in range(50)] == ref
    running = 0.0
    for k in range(1, 51):
        running += ref[k - 1]
        assert d.total(k) == running
    assert d.total(0) == 0.0
    rng = random.Random(3)
    for _ in range(200):
        limit = rng.randint(1, 50)
        budget = d.total(limit) * rng.uniform(0.0, 1.2)
        assert d.steps_within(budget, limit) == brute_steps_within(d, budget, limit)
    assert cost.calls == 50  # each iteration priced once


# -- the models' stretches against batch_us -------------------------------------------------


def roofline_models() -> list[tuple[str, RooflineCost]]:
    out = []
    for gpu in GPUS:
        for model in ("llama-3-8b", "llama-2-70b", "qwen-72b", "codellama-34b"):
            shape = MODELS.get(model)
            for tp in (1, 2, 4, 8):
                if shape.heads % tp == 0:
                    out.append((f"{model}-{gpu}-tp{tp}", RooflineCost(shape, GPUS.get(gpu), tp)))
    return out


def cpu_models() -> list[tuple[str, RooflineCost]]:
    """Roofline models with the engine's CPU work: SGLang's defaults (hidden, mostly), no
    overlap, and CPU-bound (the CPU work beyond the GEMMs' cover at every batch)."""
    from cpkv.serving.cost.cpu import ENGINE_CPU, EngineCpu

    h100, a100 = GPUS.get("h100-sxm"), GPUS.get("a100-80gb")
    llama8, llama70 = MODELS.get("llama-3-8b"), MODELS.get("llama-2-70b")
    return [
        ("cpu-sglang-llama-3-8b-h100", RooflineCost(llama8, h100, cpu=ENGINE_CPU["sglang"])),
        ("cpu-serial-llama-2-70b-a100-tp4", RooflineCost(
            llama70, a100, 4, cpu=EngineCpu(310.0, 20.0, 0.01, overlap=False))),
        ("cpu-bound-llama-3-8b-h100-tp2", RooflineCost(
            llama8, h100, 2, cpu=EngineCpu(20000.0, 200.0, 1.0, overlap=True))),
    ]  # fmt: skip


def parallel_models() -> list[tuple[str, RooflineCost]]:
    """Experts (with and without expert parallelism), latent attention, pipeline stages."""
    from cpkv.serving.cost.cpu import ENGINE_CPU

    h100, a100, h200 = GPUS.get("h100-sxm"), GPUS.get("a100-80gb"), GPUS.get("h200")
    return [
        ("mixtral-h100-tp2-ep2", RooflineCost(MODELS.get("mixtral-8x7b"), h100, 2, ep=2)),
        ("qwen3-30b-a100", RooflineCost(MODELS.get("qwen3-30b-a3b"), a100, cpu=ENGINE_CPU["vllm"])),
        ("deepseek-v3-h200-tp8-ep8", RooflineCost(MODELS.get("deepseek-v3"), h200, 8, ep=8)),
        ("deepseek-v3-h200-tp8-pp2", RooflineCost(MODELS.get("deepseek-v3"), h200, 8, pp=2)),
        ("llama-3-70b-a100-tp2-pp4", RooflineCost(
            MODELS.get("llama-3-70b"), a100, 2, cpu=ENGINE_CPU["sglang"], pp=4)),
    ]  # fmt: skip


MODELS_UNDER_TEST = [
    *roofline_models(),
    *cpu_models(),
    *parallel_models(),
    ("linear", CostModel()),
    ("linear-fitted", CostModel(4000.0, 25.0, 28.0, 0.047, 131072, 51.6)),
    ("linear-no-context", CostModel(1000.0, 5.0, 20.0, 0.0, 1024, None)),
]


def random_stretch(rng: random.Random, mixed: bool) -> tuple[int, ...]:
    decode = (
        rng.choice((0, 1, rng.randint(1, 64), rng.randint(1, 1024)))
        if mixed
        else rng.randint(1, 1024)
    )
    dc = decode * rng.randint(1, 32768) if decode else 0
    if not mixed:
        return (0, decode, dc, 0, 0, 0, 0)
    prefill = pc = pairs = pc_step = pairs_step = 0
    for _ in range(rng.randint(1, 4)):  # prefill rows: chunk e after a prefix p
        e = rng.choice((1, rng.randint(1, 64), rng.randint(1, 8192)))
        p = rng.choice((0, rng.randint(0, 100_000)))
        prefill += e
        pc += p + e
        pairs += e * p + e * (e + 1) // 2
        pc_step += e
        pairs_step += e * e
    return (prefill, decode, dc, pc, pairs, pc_step, pairs_step)


def crossing_stretch(rng: random.Random, model: RooflineCost) -> tuple[int, ...]:
    """Arguments whose prefill attention changes term at a chosen iteration."""
    # (a latent model's FLOP term also grows by its prefixes' up-projection, prefix_us a
    # prefill context token: the KV term's rate net of it is what the pairs must beat)
    times = model.times
    pair_us, kv_us = times.pair_us, times.context_us - times.prefix_us
    at = rng.choice((1, 2, rng.randint(1, 100), rng.randint(1, 100_000)))
    pc, pc_step = rng.randint(1, 10**6), rng.randint(1, 10**4)
    if rng.random() < 0.5:  # KV reads first, FLOPs after
        pairs_step = math.ceil(pc_step * kv_us / pair_us * rng.uniform(1.1, 10.0))
    else:  # FLOPs first
        pairs_step = int(pc_step * kv_us / pair_us * rng.uniform(0.0, 0.9))
    pairs = round((kv_us * (pc + pc_step * at) - pair_us * pairs_step * at) / pair_us)
    if pairs < 0 or kv_us <= 0:  # (no crossing when the up-projection outgrows the reads)
        return crossing_stretch(rng, model) if kv_us > 0 else random_stretch(rng, mixed=True)
    decode = rng.choice((0, rng.randint(1, 256)))
    return (
        rng.randint(1, 8192),
        decode,
        decode * rng.randint(1, 4096),
        pc,
        pairs,
        pc_step,
        pairs_step,
    )


def per_iteration(model, args, js) -> list[tuple[int, float, float]]:
    P, D, dc, pc, pairs, pc_step, pairs_step = args
    d = model.stretch(*args)
    assert isinstance(d, AffinePieces)
    return [
        (
            j,
            d.duration(j),
            model.batch_us(P, D, dc + D * j, pc + pc_step * j, pairs + pairs_step * j, 0),
        )
        for j in js
    ]


def largest_error(rows) -> float:
    return max(abs(got - want) / want for _, got, want in rows)


@pytest.mark.parametrize(
    ("name", "model"), MODELS_UNDER_TEST, ids=[n for n, _ in MODELS_UNDER_TEST]
)
def test_every_piece_is_batch_us_per_iteration(name: str, model) -> None:
    rng = random.Random(name)
    worst = 0.0
    two = 0
    for case in range(60):
        args = random_stretch(rng, mixed=case % 3 != 0)
        if not (args[0] or args[1]):
            continue
        d = model.stretch(*args)
        splits = [p[0] for p in d.pieces[1:]]
        two += bool(splits)
        js = {0, 1, 2, 10, 1000, 10**5, rng.randint(0, 10**6)}
        js |= {max(0, s + o) for s in splits for o in range(-3, 4)}
        worst = max(worst, largest_error(per_iteration(model, args, sorted(js))))
        if not args[0]:
            assert len(d.pieces) == 1  # decode-only: affine
    if isinstance(model, RooflineCost):
        for _ in range(40):
            args = crossing_stretch(rng, model)
            d = model.stretch(*args)
            assert len(d.pieces) <= 2
            splits = [p[0] for p in d.pieces[1:]]
            two += bool(splits)
            js = {0, 1, 5, 10**6} | {max(0, s + o) for s in splits for o in range(-5, 6)}
            worst = max(worst, largest_error(per_iteration(model, args, sorted(js))))
        latent = model.times.context_us <= model.times.prefix_us
        assert two >= (1 if latent else 20)
    else:
        assert two == 0
    assert worst <= 1e-12


def reference_durations(model, args, steps: int):
    """Each iteration's time by the model's ``breakdowns`` (float for float its
    ``batch_us``), as a numpy array."""
    P, D, dc, pc, pairs, pc_step, pairs_step = args
    j = np.arange(steps, dtype=np.int64)
    full = np.full(steps, 1, dtype=np.int64)
    columns = model.breakdowns(
        P * full, D * full, dc + D * j, pc + pc_step * j, pairs + pairs_step * j, 0 * full
    )
    return columns[0]


def piece_durations(d: AffinePieces, steps: int):
    j = np.arange(steps, dtype=np.float64)
    out = np.empty(steps)
    firsts = [p[0] for p in d.pieces] + [steps]
    for (first, a, b), last in zip(d.pieces, firsts[1:], strict=False):
        out[first:last] = a + b * j[first:last]
    return out


@pytest.mark.parametrize(
    ("name", "model"),
    MODELS_UNDER_TEST[::3] + MODELS_UNDER_TEST[-3:],
    ids=[n for n, _ in MODELS_UNDER_TEST[::3] + MODELS_UNDER_TEST[-3:]],
)
def test_total_is_the_sum_of_batch_us_over_long_stretches(name: str, model) -> None:
    rng = random.Random("long" + name)
    cases = [random_stretch(rng, mixed=False), random_stretch(rng, mixed=True)]
    if isinstance(model, RooflineCost):
        cases.append(crossing_stretch(rng, model))
    steps = 10**5
    for args in cases:
        d = model.stretch(*args)
        want = reference_durations(model, args, steps)
        assert want[0] == model.batch_us(*args[:5], 0)  # (breakdowns: batch_us's times)
        got = piece_durations(d, steps)
        assert np.max(np.abs(got - want) / want) <= 1e-12
        for k in (1, 2, 1000, rng.randint(1, steps), steps):
            assert d.total(k) == pytest.approx(math.fsum(want[:k].tolist()), rel=1e-9, abs=0.0)


def test_total_over_a_million_iterations() -> None:
    model = RooflineCost(MODELS.get("llama-3-8b"), GPUS.get("h100-sxm"), 2)
    for args in (
        (0, 256, 256 * 1000, 0, 0, 0, 0),
        (4096, 64, 64 * 2000, 4096, 4096 * 4097 // 2, 4096, 4096**2),
    ):
        want = reference_durations(model, args, 10**6)
        d = model.stretch(*args)
        assert d.total(10**6) == pytest.approx(math.fsum(want.tolist()), rel=1e-9, abs=0.0)


def test_stretch_durations_uses_the_models_stretch() -> None:
    model = CostModel()
    args = (0, 8, 800, 0, 0, 0, 0)
    assert isinstance(stretch_durations(model, *args), AffinePieces)
    roof = RooflineCost(MODELS.get("llama-3-8b"), GPUS.get("a100-80gb"))
    assert isinstance(stretch_durations(roof, *args), AffinePieces)


def test_decode_context_step_is_the_contexts_growth() -> None:
    roof = RooflineCost(MODELS.get("llama-3-8b"), GPUS.get("a100-80gb"), 4)
    for model in (roof, CostModel()):
        d = model.stretch(0, 64, 6400, 0, 0, 0, 0, decode_context_step=50)
        for j in (0, 1, 77, 12345):
            want = model.batch_us(0, 64, 6400 + 50 * j, 0, 0, 0)
            assert d.duration(j) == pytest.approx(want, rel=1e-12)


# -- one formula: scalar, vectorised and breakdown agree ------------------------------------


@pytest.mark.parametrize(
    ("name", "model"),
    MODELS_UNDER_TEST[::4] + MODELS_UNDER_TEST[-3:],
    ids=[n for n, _ in MODELS_UNDER_TEST[::4] + MODELS_UNDER_TEST[-3:]],
)
def test_batch_us_breakdown_and_breakdowns_agree(name: str, model) -> None:
    rng = random.Random("agree" + name)
    rows = []
    for _ in range(300):
        P, D, dc, pc, pairs, _, _ = random_stretch(rng, mixed=rng.random() < 0.7)
        rows.append((P, D, dc, pc, pairs, rng.choice((0, 0, rng.randint(1, 5000)))))
    rows.append((0, 0, 0, 0, 0, 0))
    rows.append((0, 0, 0, 0, 0, 100))
    arrays = [np.array(col, dtype=np.int64) for col in zip(*rows, strict=True)]
    columns = model.breakdowns(*arrays)
    for i, row in enumerate(rows):
        parts = model.breakdown(*row)
        assert parts[0] == model.batch_us(*row)
        assert math.isclose(sum(parts[1:7]), parts[0], rel_tol=1e-9, abs_tol=1e-9)
        assert tuple(float(c if np.ndim(c) == 0 else c[i]) for c in columns) == parts


# -- CUDA-graph padding ---------------------------------------------------------------------

BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512)


def padded_models():
    roof = RooflineCost(MODELS.get("llama-3-8b"), GPUS.get("h100-sxm"), 2)
    return [("roofline", roof), ("linear", CostModel()), ("looped", NoStretch(CostModel()))]


@pytest.mark.parametrize(("name", "inner"), padded_models(), ids=[n for n, _ in padded_models()])
def test_padded_stretch_and_its_padding(name: str, inner) -> None:
    rng = random.Random("pad" + name)
    for case in range(40):
        args = random_stretch(rng, mixed=case % 4 == 3)
        if not (args[0] or args[1]):
            continue
        P, D, dc, pc, pairs, pc_step, pairs_step = args
        steps = rng.choice((1, 2, rng.randint(1, 300)))
        by_calls = PaddedDecodeCost(inner, BUCKETS)
        ref = [
            by_calls.batch_us(P, D, dc + D * j, pc + pc_step * j, pairs + pairs_step * j, 0)
            for j in range(steps)
        ]
        cost = PaddedDecodeCost(inner, BUCKETS)
        d = stretch_durations(cost, *args)
        assert (cost.padding_requests, cost.padding_us) == (0, 0.0)  # pricing counts nothing
        for j in range(steps):
            assert d.duration(j) == pytest.approx(ref[j], rel=1e-12)
        assert d.total(steps) == pytest.approx(math.fsum(ref), rel=1e-9)
        cost.stretch_ran(P, D, dc, steps, d)
        assert cost.padding_requests == by_calls.padding_requests
        assert cost.padding_us == pytest.approx(
            by_calls.padding_us, rel=1e-9, abs=1e-12 * steps * ref[0]
        )
        again = PaddedDecodeCost(inner, BUCKETS)
        again.stretch_ran(P, D, dc, steps)  # durations computed again
        assert (again.padding_requests, again.padding_us) == (
            cost.padding_requests,
            cost.padding_us,
        )
        if P:
            assert cost.padding_requests == 0
        elif D < 512 and D not in BUCKETS:
            assert cost.padding_requests == steps * (min(b for b in BUCKETS if b >= D) - D)


def test_padded_stretch_accumulates_over_a_long_stretch() -> None:
    inner = RooflineCost(MODELS.get("llama-2-70b"), GPUS.get("a100-80gb"), 8)
    cost, by_calls = PaddedDecodeCost(inner, BUCKETS), PaddedDecodeCost(inner, BUCKETS)
    D, dc, steps = 37, 37 * 900, 20_000
    for j in range(steps):
        by_calls.batch_us(0, D, dc + D * j, 0, 0, 0)
    cost.stretch_ran(0, D, dc, steps, cost.stretch(0, D, dc, 0, 0, 0, 0))
    assert cost.padding_requests == by_calls.padding_requests == 11 * steps
    assert cost.padding_us == pytest.approx(by_calls.padding_us, rel=1e-9)


# -- the interface's modules ----------------------------------------------------------------


def test_base_does_not_import_the_spec() -> None:
    code = (
        "import sys, cpkv.serving.cost.base as b; "
        "assert 'cpkv.serving.cost.spec' not in sys.modules, 'spec imported'; "
        "from cpkv.serving.cost.spec import CostSpec; "
        "assert CostSpec().build().kind == 'roofline'; "
        "assert CostSpec(kind='linear').build().kind == 'linear'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
