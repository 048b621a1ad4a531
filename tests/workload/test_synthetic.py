"""The synthetic workload source and writing workloads as JSONL (`cpkv admit --write-workload`)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.core.config import load_config
from cpkv.core.schema import FieldError, build
from cpkv.workload.jsonl_writer import write_jsonl
from cpkv.workload.request import Request
from cpkv.workload.sources import WorkloadSpec, load_workload
from cpkv.workload.synthetic import SyntheticSpec, TokenDist
from tests.helpers.paths import REPO


def reference(count, seed, dists):
    """The documented draw order: per request l1, l2, extend (, max_new); for each field a
    random() < zero_fraction draw only when zero_fraction > 0, then choice() or randint()."""
    rng = random.Random(seed)

    def draw(d):
        if d["zero_fraction"] > 0 and rng.random() < d["zero_fraction"]:
            return 0
        if d.get("choices") is not None:
            return rng.choice(d["choices"])
        return rng.randint(d["low"], d["high"])

    out = []
    for k in range(count):
        l1, l2, ext = draw(dists[0]), draw(dists[1]), draw(dists[2])
        mx = draw(dists[3]) if len(dists) > 3 else None
        out.append(Request(f"s{k}", l1, l2, ext, mx))
    return tuple(out)


def spec(**synthetic):
    return build(WorkloadSpec, {"source": "synthetic", "synthetic": synthetic})


def test_defaults_follow_the_documented_draws():
    got = load_workload(spec(count=300), seed=7)
    want = reference(
        300,
        7,
        [
            {"zero_fraction": 0.4, "low": 1, "high": 40320},
            {"zero_fraction": 0.5, "low": 1, "high": 32768},
            {"zero_fraction": 0.0, "low": 1, "high": 4096},
        ],
    )
    assert got == want
    # the defaults' shape: about 40% without an L1 hit, about half without an L2 hit
    assert 90 <= sum(r.l1_cached_tokens == 0 for r in got) <= 150
    assert 110 <= sum(r.l2_cached_tokens == 0 for r in got) <= 190


def test_choices_zero_fraction_and_max_new():
    got = load_workload(
        spec(
            count=50,
            seed=3,
            l1_cached_tokens={"choices": [0, 64, 128]},
            l2_cached_tokens={"zero_fraction": 1.0, "low": 5, "high": 9},
            extend_tokens={"low": 10, "high": 10},
            max_new_tokens={"choices": [1, 2], "zero_fraction": 0.5},
        ),
        seed=99,  # synthetic.seed wins over the experiment's seed
    )
    want = reference(
        50,
        3,
        [
            {"zero_fraction": 0.0, "choices": [0, 64, 128]},
            {"zero_fraction": 1.0, "low": 5, "high": 9},
            {"zero_fraction": 0.0, "low": 10, "high": 10},
            {"zero_fraction": 0.5, "choices": [1, 2]},
        ],
    )
    assert got == want
    assert {r.l2_cached_tokens for r in got} == {0} and {r.extend_tokens for r in got} == {10}
    assert {r.max_new_tokens for r in got} == {0, 1, 2}


def test_seed_null_takes_the_experiment_seed():
    a = load_workload(spec(count=20), seed=1)
    assert a == load_workload(spec(count=20), seed=1)
    assert a != load_workload(spec(count=20), seed=2)
    assert load_workload(spec(count=20, seed=2), seed=1) == load_workload(spec(count=20), seed=2)


@pytest.mark.parametrize(
    ("synthetic", "key"),
    [
        ({"count": 0}, "synthetic.count"),
        ({"l1_cached_tokens": {"low": 9, "high": 3}}, "synthetic.l1_cached_tokens.high"),
        ({"l2_cached_tokens": {"low": -1, "high": 3}}, "synthetic.l2_cached_tokens.low"),
        ({"l2_cached_tokens": {"choices": []}}, "synthetic.l2_cached_tokens.choices"),
        ({"l1_cached_tokens": {"zero_fraction": 1.5}}, "synthetic.l1_cached_tokens.zero_fraction"),
        ({"extend_tokens": {"low": 0, "high": 5}}, "synthetic.extend_tokens.low"),
        ({"extend_tokens": {"choices": [0, 1]}}, "synthetic.extend_tokens.choices"),
        (
            {"extend_tokens": {"low": 1, "high": 5, "zero_fraction": 0.1}},
            "synthetic.extend_tokens.zero_fraction",
        ),
        ({"max_new_tokens": {"choices": [-1]}}, "synthetic.max_new_tokens.choices[0]"),
        ({"counts": 5}, "synthetic.counts"),
    ],
)
def test_bad_keys_are_named(synthetic, key):
    with pytest.raises(FieldError) as err:
        spec(**synthetic)
    assert err.value.key == key


def test_config_error_names_the_full_key(cli):
    res = cli("admit", "admit.workload.source=synthetic", "admit.workload.synthetic.count=-3")
    assert res.exit_code == 2 and cli.run_dirs() == []
    assert "admit.workload.synthetic.count: must be >= 1, got -3" in res.stderr


dist = st.builds(
    lambda lo, span, zf, ch: TokenDist(low=lo, high=lo + span, zero_fraction=zf, choices=ch),
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.sampled_from([0.0, 0.3, 1.0]),
    st.one_of(st.none(), st.lists(st.integers(0, 9000), min_size=1, max_size=4).map(tuple)),
)


@settings(max_examples=60, deadline=None)
@given(dist, dist, st.integers(1, 3000), st.integers(0, 3000), st.integers(0, 2**32))
def test_draws_stay_inside_their_distributions(l1, l2, ext_low, ext_span, seed):
    ext = TokenDist(low=ext_low, high=ext_low + ext_span)
    syn = SyntheticSpec(
        count=40, seed=seed, l1_cached_tokens=l1, l2_cached_tokens=l2, extend_tokens=ext
    )
    reqs = load_workload(WorkloadSpec(source="synthetic", synthetic=syn))
    assert [r.rid for r in reqs] == [f"s{k}" for k in range(40)]
    for d, values in (
        (l1, [r.l1_cached_tokens for r in reqs]),
        (l2, [r.l2_cached_tokens for r in reqs]),
    ):
        for v in values:
            if d.zero_fraction == 1.0:
                assert v == 0
            elif d.choices is not None:
                assert v in d.choices or (v == 0 and d.zero_fraction > 0)
            else:
                assert d.low <= v <= d.high or (v == 0 and d.zero_fraction > 0)
    assert all(ext_low <= r.extend_tokens <= ext_low + ext_span for r in reqs)


requests = st.lists(
    st.builds(
        Request,
        rid=st.text(min_size=1, max_size=8),
        l1_cached_tokens=st.integers(0, 10**6),
        l2_cached_tokens=st.integers(0, 10**6),
        extend_tokens=st.integers(1, 10**6),
        max_new_tokens=st.one_of(st.none(), st.integers(0, 10**5)),
        priority=st.integers(-5, 5),
        arrival_ms=st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
    ),
    max_size=20,
    unique_by=lambda r: r.rid,
)


@settings(max_examples=80, deadline=None)
@given(requests)
def test_written_jsonl_reads_back_the_same_requests(tmp_path_factory, reqs):
    path = tmp_path_factory.mktemp("w") / "sub" / "requests.jsonl"
    assert write_jsonl(reqs, path) == len(reqs)
    if reqs:
        assert load_workload(WorkloadSpec(source="jsonl", path=str(path))) == tuple(reqs)
    assert not path.with_name("requests.jsonl.tmp").exists()


def test_write_workload_then_run_it_as_jsonl(cli, tmp_path):
    path = tmp_path / "w" / "requests.jsonl"
    base = ["admit.workload.synthetic.count=300", "admit.available_tokens=60000", "seed=5"]
    res = cli("admit", *base, "admit.workload.source=synthetic", "--write-workload", str(path))
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"wrote 300 requests (synthetic workload) to {path}"
    assert cli.run_dirs() == []  # writing the workload runs nothing
    first = json.loads(path.read_text().splitlines()[0])
    assert first["rid"] == "s0" and set(first) <= {
        "rid",
        "l1_cached_tokens",
        "l2_cached_tokens",
        "extend_tokens",
    }
    assert cli("admit", *base, "admit.workload.source=synthetic").exit_code == 0
    assert (
        cli("admit", *base, "admit.workload.source=jsonl", f"admit.workload.path={path}").exit_code
        == 0
    )
    synthetic, jsonl = (cli.results(run) for run in cli.run_dirs())

    def deterministic(doc):
        timing = set(doc["columns"]["timing"])
        rows = [{k: v for k, v in r.items() if k not in timing} for r in doc["rows"]]
        summary = {
            k: v
            for k, v in doc["summary"].items()
            if k not in ("timing", "duration_us", "workload")
        }
        return rows, summary

    assert deterministic(synthetic) == deterministic(jsonl)
    assert jsonl["summary"]["decisions"] > 100
    # the timing block: decisions per second of the model run, the JSONL parse apart
    t = jsonl["summary"]["timing"]
    assert set(t) == {"workload_s", "workload_cpu_s", "admission_s", "admission_cpu_s",
                      "decisions_per_s", "decisions_per_cpu_s"}  # fmt: skip
    assert t["workload_s"] > 0 and t["admission_s"] > 0
    assert t["decisions_per_s"] == pytest.approx(
        jsonl["summary"]["decisions"] / t["admission_s"], rel=1e-2
    )
    assert any(n.startswith("timing: ") and "decisions/s" in n for n in jsonl["notes"])


def test_write_workload_errors_are_one_line(cli, tmp_path):
    (tmp_path / "taken").mkdir()
    res = cli(
        "admit", "admit.workload.source=synthetic", "--write-workload", str(tmp_path / "taken")
    )
    assert res.exit_code == 2 and "cannot write the workload" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = cli("admit", "admit.workload.source=jsonl", "--write-workload", str(tmp_path / "x.jsonl"))
    assert res.exit_code == 2 and "admit.workload.path" in res.stderr


def test_perf_configs_load(monkeypatch):

    root = REPO
    blocks = {
        name: load_config("admit", root / f"configs/perf/{name}.yaml").experiment.admit
        for name in ("admit_100k", "admit_100k_release", "admit_100k_paged")
    }
    for b in blocks.values():
        # drawn on the fly: a fresh checkout runs them without writing a file first
        assert b.workload.source == "synthetic" and b.workload.synthetic.count == 100_000
        assert b.workload.path is None
        assert (b.available_tokens, b.cp.max_total_cached_tokens) == (200_000, 131072)
    assert not blocks["admit_100k"].release_each_tick
    assert blocks["admit_100k_release"].release_each_tick
    paged = blocks["admit_100k_paged"]
    assert (paged.page_size, paged.chunked_prefill_size, paged.release_each_tick) == (
        64,
        8192,
        True,
    )


def test_the_perf_configs_synthetic_source_admits_like_the_file_it_writes(cli, tmp_path) -> None:
    """configs/perf/admit_100k*.yaml draw their requests on the fly; before, they read the JSONL
    file `--write-workload` wrote from the same spec. The admission records must not differ
    (here on the first 3,000 requests of each variant, timings aside)."""
    count = "admit.workload.synthetic.count=3000"
    for name in ("admit_100k", "admit_100k_release", "admit_100k_paged"):
        config = str(REPO / f"configs/perf/{name}.yaml")
        path = tmp_path / f"{name}.jsonl"
        assert cli("admit", config, count, "--write-workload", str(path)).exit_code == 0
        before = set(cli.run_dirs())
        assert cli("admit", config, count).exit_code == 0
        from_file = ["admit.workload.source=jsonl", f"admit.workload.path={path}"]
        assert cli("admit", config, *from_file).exit_code == 0
        synthetic, jsonl = sorted(set(cli.run_dirs()) - before)

        def records(run):
            ticks = [
                {k: v for k, v in json.loads(line).items() if k != "duration_us"}
                for line in (run / "ticks.jsonl").read_text().splitlines()
            ]
            summary = cli.results(run)["summary"]
            return ticks, {
                k: v for k, v in summary.items() if k not in ("timing", "duration_us", "workload")
            }

        assert records(synthetic) == records(jsonl), name
