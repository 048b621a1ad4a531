"""The samplers against ``random.Random``'s own methods: the same values and the same
generator state after, interleaved with other draws (the samplers share one generator)."""

from __future__ import annotations

import random

import pytest

from cpkv.workload.sampling import ExponentialSampler, RequestSampler, TokenSampler


@pytest.mark.parametrize("values", [[0], [1024], [3, 9], [1, 2, 3], list(range(1000))])
def test_a_choice_is_random_choice(values) -> None:
    plain, rng = random.Random(17), random.Random(17)
    sampler = TokenSampler(rng, values, 0, 0, 0.0)
    assert sampler.by_bits  # (its own steps, checked against rng.choice)
    for _ in range(3000):
        assert sampler.draw() == plain.choice(values)
        assert rng.random() == plain.random()
    assert rng.getstate() == plain.getstate()


@pytest.mark.parametrize("zero", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("choices", [None, (5, 7, 11)])
def test_a_token_count_is_the_documented_draw(zero, choices) -> None:
    """0 with probability ``zero`` (one ``random()`` first when positive), else ``choice``
    or ``randint``."""
    plain, rng = random.Random(3), random.Random(3)
    sampler = TokenSampler(rng, choices, 10, 20, zero)
    for _ in range(2000):
        if zero > 0 and plain.random() < zero:
            want = 0
        else:
            want = plain.randint(10, 20) if choices is None else plain.choice(choices)
        assert sampler.draw() == want
    assert rng.getstate() == plain.getstate()


def test_a_request_draws_its_counts_in_order() -> None:
    plain, rng = random.Random(5), random.Random(5)
    counts = [TokenSampler(rng, None, 0, 10**k, 0.0) for k in range(1, 5)]
    with_max = RequestSampler(*counts)
    without = RequestSampler(*counts[:3], None)
    for _ in range(500):
        want = tuple(plain.randint(0, 10**k) for k in range(1, 5))
        assert with_max.draw() == want
        assert without.draw() == (*(plain.randint(0, 10**k) for k in range(1, 4)), None)
    assert rng.getstate() == plain.getstate()


@pytest.mark.parametrize("rate", [8, 0.5, 1234.5])
def test_an_exponential_gap_is_expovariate(rate) -> None:
    plain, rng = random.Random(11), random.Random(11)
    sampler = ExponentialSampler(rng, rate)
    assert sampler.by_log
    for _ in range(3000):
        assert sampler.draw() == plain.expovariate(rate)
    assert rng.getstate() == plain.getstate()


def test_a_subclassed_generator_keeps_its_own_methods() -> None:
    class Mine(random.Random):
        def choice(self, seq):
            return seq[0]

        def expovariate(self, lambd=1.0):
            return 1.0 / lambd

    rng = Mine(1)
    sampler = TokenSampler(rng, [1, 2], 0, 0, 0.0)
    assert not sampler.by_bits
    assert [sampler.draw() for _ in range(50)] == [1] * 50
    gaps = ExponentialSampler(rng, 4.0)
    assert not gaps.by_log
    assert gaps.draw() == 0.25
