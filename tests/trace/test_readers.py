"""The trace reader registry and the Mooncake JSONL reader, on hand-written files."""

from __future__ import annotations

import json

import pytest

from cpkv.core.errors import ConfigError, InputError
from cpkv.trace.prefix_cache import CacheConfig, CachedRequest, replay
from cpkv.trace.readers import TRACE_FORMATS, TraceRequest, read_trace


def write(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def row(ts=0, n=5, out=3, hashes=(1, 2)):
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": list(hashes)}


def test_reads_requests_in_order_with_index_and_arrival(tmp_path):
    path = write(tmp_path, [row(0, 5, 3, [1, 2]), "", row(12.5, 4, 0, [1]) | {"extra": 1}])
    trace = read_trace(path, "mooncake", block_size=4)
    assert trace.format == "mooncake" and trace.block_size == 4
    assert trace.requests == (
        TraceRequest(0, 0, 5, 3, (1, 2)),
        TraceRequest(1, 12.5, 4, 0, (1,)),
    )
    assert trace.requests[0].block_tokens(0, 4) == 4
    assert trace.requests[0].block_tokens(1, 4) == 1  # the partial last block


def test_start_and_limit_keep_the_file_order_index(tmp_path):
    path = write(tmp_path, [row(ts=i, hashes=[i, i + 100]) for i in range(6)])
    trace = read_trace(path, block_size=4, start=2, limit=3)
    assert [r.index for r in trace.requests] == [2, 3, 4]
    assert [r.arrival_ms for r in trace.requests] == [2, 3, 4]
    assert read_trace(path, block_size=4, start=5, limit=None).requests[0].index == 5
    assert read_trace(path, block_size=4, limit=0).requests == ()
    assert read_trace(path, block_size=4, start=9).requests == ()


def test_lines_outside_the_window_are_not_parsed(tmp_path):
    path = write(tmp_path, ["not json", row(), row(), "{broken"])
    assert len(read_trace(path, block_size=4, start=1, limit=2).requests) == 2


@pytest.mark.parametrize(
    "line, message",
    [
        ("{oops", r"t.jsonl:2: not valid JSON"),
        ("[1, 2]", r"t.jsonl:2: expected a JSON object, got list"),
        (row() | {"timestamp": -1}, r"t.jsonl:2: field 'timestamp' must be a finite number"),
        (row() | {"timestamp": "now"}, r"field 'timestamp' .* got 'now'"),
        ({"input_length": 5, "output_length": 1, "hash_ids": [1, 2]}, r"'timestamp' is missing"),
        (
            row() | {"input_length": 0},
            r"t.jsonl:2: field 'input_length' must be an integer >= 1, got 0",
        ),
        (row() | {"input_length": 5.0}, r"field 'input_length' must be an integer"),
        (
            row() | {"output_length": True},
            r"field 'output_length' must be an integer >= 0, got True",
        ),
        ({"timestamp": 0, "input_length": 5, "hash_ids": [1, 2]}, r"'output_length' is missing"),
        (row() | {"hash_ids": "12"}, r"field 'hash_ids' must be a list of integers"),
        (
            row(hashes=[1, 2, 3]),
            r"t.jsonl:2: field 'hash_ids' has 3 entries; .* = 2 \(is block_size",
        ),
        (row(hashes=[1, "x"]), r"field 'hash_ids' must hold integers only, got 'x'"),
    ],
)
def test_malformed_lines_name_file_line_and_field(tmp_path, line, message):
    path = write(tmp_path, [row(), line])
    with pytest.raises(InputError, match=message):
        read_trace(path, block_size=4)


def test_bad_arguments_and_missing_files(tmp_path):
    path = write(tmp_path, [row()])
    with pytest.raises(ConfigError, match=r"unknown trace format 'sharegpt' \(allowed: .*mooncake"):
        read_trace(path, "sharegpt")
    with pytest.raises(ConfigError, match=r"block_size=0"):
        read_trace(path, block_size=0)
    with pytest.raises(ConfigError, match=r"limit=-1"):
        read_trace(path, block_size=4, limit=-1)
    with pytest.raises(InputError, match=r"nope.jsonl does not exist"):
        read_trace(tmp_path / "nope.jsonl")
    assert "mooncake" in TRACE_FORMATS.names()


def test_replay_turns_a_trace_into_admission_requests(tmp_path):
    rows = [row(0, 10, 7, [1, 2, 3]), row(5, 9, 2, [1, 2, 8]), row(9, 10, 1, [1, 2, 3])]
    trace = read_trace(write(tmp_path, rows), block_size=4)
    got = replay(trace, CacheConfig(l1_tokens=8, l2_tokens=12))
    # r0 (blocks of 4, 4, 2 tokens): cold. Inserted last block first: 3, 2, then 1 evicts 3
    # from L1 (L1 = 2, 1), L2 = 3, 2, 1 (10 tokens).
    # r1 (4, 4, 1): 1 and 2 hit in L1 (8 = its cap). Inserting 8, 2, 1 evicts 2, 1, 8 in turn
    # from L1 (ending L1 = 2, 1); L2 = 3, 8, 2, 1 (11 tokens).
    # r2: 1, 2 in L1 (8), then 3 in L2 (2): 10, capped at 9: L1 8, L2 1.
    assert got == (
        CachedRequest(0, "r0", 0, 10, 0, 0, 10, 7),
        CachedRequest(1, "r1", 5, 9, 8, 0, 1, 2),
        CachedRequest(2, "r2", 9, 10, 8, 1, 1, 1),
    )


def test_a_file_read_again_is_parsed_once_until_it_changes(tmp_path, monkeypatch):
    import os

    from cpkv.trace import readers

    path = write(tmp_path, [row(0, 5, 3, [1, 2]), row(1, 4, 1, [1])])
    parsed = []
    real = readers._parse_mooncake
    monkeypatch.setattr(readers, "_parse_mooncake", lambda *a: parsed.append(a[1]) or real(*a))
    first = read_trace(path, "mooncake", block_size=4)
    again = read_trace(str(path), "mooncake", block_size=4)
    assert again == first and parsed == [1, 2]
    other = read_trace(path, "mooncake", block_size=4, limit=1)  # another reading of the file
    assert len(other.requests) == 1 and len(parsed) == 3
    size = os.stat(path).st_size
    write(tmp_path, [row(0, 5, 3, [1, 2]), row(1, 4, 2, [1])])  # new content, the same size
    assert os.stat(path).st_size == size
    changed = read_trace(path, "mooncake", block_size=4)
    assert changed.requests[1].output_length == 2 and len(parsed) == 5
