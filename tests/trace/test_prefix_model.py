"""The synthetic prefix-sharing model for traces without prefix information (azure_csv):
hand-derived hashes and cache ratios, the draws' frequencies, slicing, and bad configs."""

from __future__ import annotations

import pytest

from cpkv.core.errors import ConfigError
from cpkv.trace.prefix_model import SHARED_HASH_BASE, PrefixSpec, shared_group, uniform
from cpkv.trace.readers import AZURE_HASH_BASE, read_trace

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _csv(tmp_path, lengths: list[int]):
    path = tmp_path / "azure.csv"
    path.write_text(HEADER + "".join(f"{i * 0.5},{n},10\n" for i, n in enumerate(lengths)))
    return path


def test_one_group_every_request_shares_its_whole_blocks(tmp_path) -> None:
    path = _csv(tmp_path, [1500, 700, 300, 1024])
    spec = PrefixSpec(model="shared", groups=1, tokens=1024, fraction=1.0)
    reqs = read_trace(path, "azure_csv", block_size=512, prefix=spec).requests
    own = [AZURE_HASH_BASE - i * (1 << 20) for i in range(4)]  # each request's first own hash
    s0, s1 = SHARED_HASH_BASE, SHARED_HASH_BASE - 1  # group 0's two blocks of 512
    # 1500 tokens: 3 blocks, min(1024, 1500) // 512 = 2 shared, the third its own (index 2)
    assert reqs[0].hash_ids == (s0, s1, own[0] - 2)
    # 700 tokens: 2 blocks, 700 // 512 = 1 shared
    assert reqs[1].hash_ids == (s0, own[1] - 1)
    # 300 tokens: 1 block shorter than a block: nothing shared
    assert reqs[2].hash_ids == (own[2],)
    # 1024 tokens: both blocks shared (the cache caps a hit at input_length - 1)
    assert reqs[3].hash_ids == (s0, s1)


def test_model_none_and_fraction_zero_change_nothing(tmp_path) -> None:
    path = _csv(tmp_path, [1500, 700, 300])
    plain = read_trace(path, "azure_csv", block_size=256).requests
    for spec in (PrefixSpec(), PrefixSpec(model="shared", fraction=0.0)):
        assert read_trace(path, "azure_csv", block_size=256, prefix=spec).requests == plain


def test_cache_ratio_of_shared_prefixes_by_hand(cli, tmp_path) -> None:
    # three requests of one group with a 1024-token prefix, blocks of 512, unlimited cache:
    # the first misses; the second (1200 tokens) and third (2000) hit the 2 shared blocks =
    # 1024 tokens each; cache ratio = 2048 / (1500 + 1200 + 2000) = 43.5745 %
    path = _csv(tmp_path, [1500, 1200, 2000])
    res = cli(
        "trace", "stats", str(path), "trace.format=azure_csv", "trace.block_size=512",
        "trace.prefix.model=shared", "trace.prefix.groups=1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    rows = cli.results(run)["rows"]
    assert rows[0]["cache_pct"] == pytest.approx(100 * 2048 / 4700, abs=0.005)


def test_draws_follow_fraction_and_zipf_weights() -> None:
    n = 20_000
    half = PrefixSpec(model="shared", groups=2, fraction=0.5, zipf=1.0, seed=7)
    groups = [shared_group(half, i) for i in range(n)]
    sharing = [g for g in groups if g is not None]
    # a binomial(20000, 0.5) is within 4 standard deviations (4 * 70.7) of 10,000
    assert abs(len(sharing) - n / 2) < 4 * (n * 0.25) ** 0.5
    # zipf 1 over two groups: weights 1 and 1/2, so group 0 with probability 2/3
    share0 = sharing.count(0) / len(sharing)
    assert abs(share0 - 2 / 3) < 4 * (2 / 9 / len(sharing)) ** 0.5
    # uniform draws: mean 1/2, never 1
    draws = [uniform(3, i, 1) for i in range(n)]
    assert abs(sum(draws) / n - 0.5) < 0.01 and max(draws) < 1.0 and min(draws) >= 0.0


def test_a_requests_prefix_does_not_depend_on_the_slice(tmp_path) -> None:
    path = _csv(tmp_path, [600 + 37 * i for i in range(40)])
    spec = PrefixSpec(model="shared", groups=5, tokens=512, fraction=0.6, zipf=1.2, seed=11)
    whole = read_trace(path, "azure_csv", block_size=64, prefix=spec).requests
    part = read_trace(path, "azure_csv", block_size=64, start=10, limit=7, prefix=spec).requests
    assert part == whole[10:17]
    other_seed = read_trace(
        path, "azure_csv", block_size=64, prefix=PrefixSpec(**{**spec.__dict__, "seed": 12})
    ).requests
    assert other_seed != whole


def test_a_trace_with_its_own_prefixes_refuses_a_synthetic_one(cli, tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(ConfigError, match="the mooncake format carries its own prefix hashes"):
        read_trace(trace, "mooncake", prefix=PrefixSpec(model="shared"))
    res = cli("admit", "admit.mode=serving", "admit.workload.source=trace",
              f"admit.workload.path={trace}", "admit.workload.prefix.model=shared")  # fmt: skip
    assert (
        res.exit_code == 2
        and "admit.workload.prefix.model: shared: the mooncake format" in res.output
    )
    res = cli("trace", "stats", str(trace), "trace.prefix.fraction=1.5")
    assert res.exit_code == 2 and "trace.prefix.fraction: must be in [0, 1], got 1.5" in res.output
