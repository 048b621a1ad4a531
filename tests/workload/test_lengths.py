"""Empirical (prompt, output) lengths from a file for the synthetic source
(``admit.workload.synthetic.lengths``)."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cpkv.core.errors import InputError
from cpkv.core.schema import FieldError
from cpkv.workload.lengths import LengthsFile, read_lengths, split_prompt
from cpkv.workload.sources import WorkloadSpec
from cpkv.workload.synthetic import SyntheticSpec, TokenDist, synthetic_draws
from tests.helpers.paths import REPO, SHARED

AZURE_CONVERSATION = SHARED / "data" / "azure_llm_2023" / "conversation.csv"


def write(tmp_path: Path, name: str, text: str) -> LengthsFile:
    path = tmp_path / name
    path.write_text(text)
    return LengthsFile(str(path))


def test_csv_and_jsonl_rows_are_read_in_file_order(tmp_path):
    csv_file = write(tmp_path, "l.csv", "prompt_tokens, output_tokens\n100,5\n 7 ,9\n")
    assert read_lengths(csv_file) == ((100, 5), (7, 9))
    jsonl = write(
        tmp_path, "l.jsonl",
        '{"prompt_tokens": 3, "output_tokens": 1}\n\n{"prompt_tokens": 8.0, "output_tokens": 2}\n',
    )  # fmt: skip
    assert read_lengths(jsonl) == ((3, 1), (8, 2))


def test_other_field_names(tmp_path):
    spec = write(tmp_path, "a.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n")
    spec = LengthsFile(spec.path, "num_prefill_tokens", "num_decode_tokens")
    assert read_lengths(spec) == ((374, 44),)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "a.csv",
            "prompt_tokens,output_tokens\n10,2\n0,5\n",
            ":3: field 'prompt_tokens': must be >= 1",
        ),
        (
            "a.csv",
            "prompt_tokens,output_tokens\n10,x\n",
            ":2: field 'output_tokens': expected an integer",
        ),
        (
            "a.csv",
            "prompt_tokens,output_tokens\n10,-3\n",
            ":2: field 'output_tokens': expected an integer",
        ),
        (
            "a.csv",
            "prompt_tokens,output_tokens\n1e20,3\n",
            ":2: field 'prompt_tokens': expected an integer",
        ),
        (
            "a.csv",
            "prompt_tokens,output_tokens\n99999999999,3\n",
            ":2: field 'prompt_tokens': must be <= 2147483647",
        ),
        (
            "a.csv",
            "input,output\n10,2\n",
            ":2: no field 'prompt_tokens' (fields here: input, output)",
        ),
        ("a.csv", "prompt_tokens,output_tokens\n10,\n", ":2: no field 'output_tokens'"),
        ("a.csv", "", ":1: empty file"),
        ("a.csv", "prompt_tokens,output_tokens\n", "holds no length row"),
        ("a.jsonl", '{"prompt_tokens": 1, "output_tokens": 1}\n{bad\n', ":2: not valid JSON"),
        ("a.jsonl", "[1, 2]\n", ":1: expected a JSON object"),
        ("a.jsonl", '{"prompt_tokens": true, "output_tokens": 1}\n', ":1: field 'prompt_tokens'"),
        ("a.jsonl", '{"prompt_tokens": 2.5, "output_tokens": 1}\n', ":1: field 'prompt_tokens'"),
    ],
)
def test_a_bad_row_names_file_line_and_field(tmp_path, name, text, message):
    spec = write(tmp_path, name, text)
    with pytest.raises(InputError) as err:
        read_lengths(spec)
    assert str(err.value).startswith(spec.path)
    assert message in str(err.value)


def test_a_missing_file_names_the_key(tmp_path):
    with pytest.raises(InputError, match=r"admit\.workload\.synthetic\.lengths\.path"):
        read_lengths(LengthsFile(str(tmp_path / "nope.csv")))


@pytest.mark.parametrize(
    ("prompt", "l1", "l2", "expected"),
    [
        (100, 0, 0, (0, 0, 100)),
        (100, 30, 20, (30, 20, 50)),
        (100, 150, 20, (99, 0, 1)),  # at least one token is computed
        (100, 60, 60, (60, 39, 1)),
        (1, 5, 5, (0, 0, 1)),
    ],
)
def test_hits_are_clipped_into_the_prompt(prompt, l1, l2, expected):
    assert split_prompt(prompt, l1, l2) == expected


def spec_of(lengths: LengthsFile, count: int, seed: int, l1=None, l2=None) -> WorkloadSpec:
    kw = {}
    if l1 is not None:
        kw["l1_cached_tokens"] = l1
    if l2 is not None:
        kw["l2_cached_tokens"] = l2
    return WorkloadSpec(
        source="synthetic", synthetic=SyntheticSpec(count=count, seed=seed, lengths=lengths, **kw)
    )


def test_draw_order_hits_then_a_row(tmp_path):
    """The documented order: per request the l1 and l2 draws, then ``randrange(rows)``."""
    pairs = [(50, 3), (2000, 700), (9, 1), (300, 40)]
    lengths = write(
        tmp_path, "l.csv", "prompt_tokens,output_tokens\n" + "".join(f"{p},{o}\n" for p, o in pairs)
    )
    l1 = TokenDist(low=1, high=500, zero_fraction=0.5)
    l2 = TokenDist(choices=(0, 10, 20))
    drawn = list(synthetic_draws(spec_of(lengths, 300, 11, l1, l2)))
    rng = random.Random(11)
    for k, (rid, a, b, e, m) in enumerate(drawn):
        ra = 0 if rng.random() < 0.5 else rng.randint(1, 500)
        rb = rng.choice((0, 10, 20))
        prompt, output = pairs[rng.randrange(len(pairs))]
        assert rid == f"s{k}"
        assert (a, b, e, m) == (*split_prompt(prompt, ra, rb), output)
        assert a + b + e == prompt


def test_the_joint_distribution_is_the_files(tmp_path):
    pairs = [(1000, 2), (10, 900)]
    lengths = write(
        tmp_path, "l.jsonl",
        "".join(json.dumps({"prompt_tokens": p, "output_tokens": o}) + "\n" for p, o in pairs),
    )  # fmt: skip
    zero = TokenDist(choices=(0,))
    drawn = [(e, m) for _, _, _, e, m in synthetic_draws(spec_of(lengths, 4000, 3, zero, zero))]
    assert set(drawn) == set(pairs)  # never a long prompt with the other row's output
    share = drawn.count(pairs[0]) / len(drawn)
    assert 0.45 < share < 0.55  # uniform rows: 4000 draws, 6 standard deviations


def test_lengths_refuse_distributions_they_replace(tmp_path):
    lengths = LengthsFile(str(tmp_path / "l.csv"))
    for kw in ({"max_new_tokens": TokenDist(choices=(5,))}, {"extend_tokens": TokenDist(1, 10)}):
        with pytest.raises(FieldError, match="lengths"):
            SyntheticSpec(lengths=lengths, **kw).validate()
    SyntheticSpec(lengths=lengths).validate()


@pytest.mark.skipif(
    not AZURE_CONVERSATION.is_file(), reason="../shared/data is not beside this checkout"
)
def test_azure_lengths_match_the_trace():
    lengths = LengthsFile(str(AZURE_CONVERSATION), "num_prefill_tokens", "num_decode_tokens")
    with AZURE_CONVERSATION.open() as f:
        rows = [
            (int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(f)
        ]
    assert read_lengths(lengths) == tuple(rows)
    zero = TokenDist(choices=(0,))
    drawn = [e for _, _, _, e, _ in synthetic_draws(spec_of(lengths, 20000, 0, zero, zero))]
    file_mean = sum(p for p, _ in rows) / len(rows)
    assert abs(sum(drawn) / len(drawn) - file_mean) / file_mean < 0.05


def test_a_bad_lengths_file_is_one_line_and_exit_2_with_no_run_left(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt_tokens,output_tokens\n10,2\n0,5\n")
    out = tmp_path / "runs"
    res = subprocess.run(
        [sys.executable, "-m", "cpkv", "admit", str(REPO / "configs/admit/serving_empirical_lengths.yaml"),
         f"admit.workload.synthetic.lengths.path={bad}",
         "admit.workload.synthetic.lengths.prompt_field=prompt_tokens",
         "admit.workload.synthetic.lengths.output_field=output_tokens", "-o", str(out)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"cpkv: error: {bad}:3: field 'prompt_tokens': must be >= 1, got 0"
    ]
    assert not out.exists() or not any(out.rglob("results.json"))
