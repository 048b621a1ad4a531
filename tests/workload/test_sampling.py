"""The synthetic source's fast ``choice`` against ``random.Random.choice`` itself: the same
values and the same generator state after, for lists of every size class."""

from __future__ import annotations

import random

import pytest

from cpkv.workload.synthetic import _fast_choice


@pytest.mark.parametrize("values", [[0], [1024], [3, 9], [1, 2, 3], list(range(1000))])
def test_fast_choice_is_random_choice(values) -> None:
    plain, fast_rng = random.Random(17), random.Random(17)
    fast = _fast_choice(fast_rng, values)
    assert fast is not None
    # interleaved with other draws, as the samplers share one generator
    for _ in range(3000):
        assert fast() == plain.choice(values)
        assert fast_rng.random() == plain.random()
    assert fast_rng.getstate() == plain.getstate()


def test_a_subclassed_generator_keeps_its_own_choice() -> None:
    class Mine(random.Random):
        def choice(self, seq):
            return seq[0]

    assert _fast_choice(Mine(1), [1, 2]) is None
    assert _fast_choice(random.Random(1), []) is None
