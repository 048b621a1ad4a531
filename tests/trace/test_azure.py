"""The Azure LLM inference traces of 2023 (read from ../shared/data, never copied)."""

from __future__ import annotations

import statistics

import pytest

from cpkv.core.errors import InputError
from cpkv.trace.readers import read_trace
from tests.helpers.paths import SHARED

AZURE = SHARED / "data" / "azure_llm_2023"
needs_data = pytest.mark.skipif(
    not AZURE.exists(), reason="../shared/data/azure_llm_2023 is not present"
)


@needs_data
def test_conversation_trace_matches_its_published_shape():
    trace = read_trace(AZURE / "conversation.csv", "azure_csv", block_size=512)
    reqs = trace.requests
    # the data README: 19,366 requests; the Splitwise paper (Patel et al., ISCA'24, Table 2)
    # gives the conversation trace's medians: 1020 prompt tokens, 129 output tokens
    assert len(reqs) == 19366
    assert statistics.median(r.input_length for r in reqs) == 1020
    assert statistics.median(r.output_length for r in reqs) == 129
    # row 3 of the file: "4.314579,396,109" -> 4314.579 ms, 396 prompt tokens (1 block of 512)
    second = reqs[1]
    assert second.index == 1 and second.arrival_ms == pytest.approx(4314.579)
    assert (second.input_length, second.output_length, len(second.hash_ids)) == (396, 109, 1)
    # about one hour of arrivals, in order
    arrivals = [r.arrival_ms for r in reqs]
    assert arrivals == sorted(arrivals) and 3.0e6 < arrivals[-1] <= 3.6e6


@needs_data
def test_code_trace_and_no_prefix_sharing():
    reqs = read_trace(AZURE / "code.csv", "azure_csv", block_size=64).requests
    assert len(reqs) == 8819
    seen: set[int] = set()
    for r in reqs:
        assert len(r.hash_ids) == -(-r.input_length // 64)
        assert seen.isdisjoint(r.hash_ids)  # no two requests share a block: no prefix info
        seen.update(r.hash_ids)


@needs_data
def test_start_and_limit_slice_by_order():
    whole = read_trace(AZURE / "conversation.csv", "azure_csv").requests
    part = read_trace(AZURE / "conversation.csv", "azure_csv", start=10, limit=5).requests
    assert part == whole[10:15]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "x.csv:1: empty file"),
        (
            "arrived_at,num_prefill_tokens\n0,5\n",
            "x.csv:1: header lacks column(s) num_decode_tokens",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,0,5\n",
            "x.csv:2: field 'num_prefill_tokens' must be an integer >= 1, got '0'",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,-1\n",
            "x.csv:2: field 'num_decode_tokens' must be an integer >= 0, got '-1'",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n\nnan,5,1\n",
            "x.csv:3: field 'arrived_at' must be a finite number of seconds >= 0, got 'nan'",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n1.5,abc,1\n",
            "x.csv:2: field 'num_prefill_tokens' must be an integer >= 1, got 'abc'",
        ),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1.5,7\n", "x.csv:2: 2 columns"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, text, message):
    path = tmp_path / "x.csv"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_trace(path, "azure_csv")
    assert str(err.value).replace(str(tmp_path) + "/", "").startswith(message)


@needs_data
def test_cpkv_admit_runs_on_the_azure_trace(cli):
    res = cli(
        "admit", "admit.workload.source=trace", "admit.workload.format=azure_csv",
        f"admit.workload.path={AZURE / 'code.csv'}", "admit.workload.limit=200",
        "admit.release_each_tick=true",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = cli.results(cli.run_dirs()[0])["summary"]
    assert summary["requests"] == 200 and summary["requests_admitted"] == 200
    assert summary["loaded_tokens"] == 0  # no prefix information: no L2 hit to load


def test_not_utf8_is_one_line_with_the_byte_offset(cli, tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,\xff\xfe\n")
    res = cli("trace", "stats", str(path), "trace.format=azure_csv")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    # the header is 47 bytes and its newline 1 (offsets 0..47), "0,5," 4 more: the bad byte is at 52
    assert len(lines) == 1 and "x.csv:2: not UTF-8" in lines[0] and "offset 52" in lines[0]
    assert not cli.run_dirs()
