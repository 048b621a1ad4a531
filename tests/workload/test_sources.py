"""Workload sources: the grid's order and names, JSONL parsing and its error messages."""

from __future__ import annotations

import json

import pytest

from cpkv.core.errors import ConfigError, InputError
from cpkv.core.schema import FieldError, build
from cpkv.workload.request import Request
from cpkv.workload.sources import SOURCES, GridSpec, WorkloadSpec, load_workload


def test_grid_is_the_seed_example_in_nesting_order():
    reqs = load_workload(WorkloadSpec())
    triples = [(r.l1_cached_tokens, r.l2_cached_tokens, r.extend_tokens) for r in reqs]
    expected = [(a, b, c) for a in (0, 4096) for b in (0, 4096) for c in (128, 2048)]
    assert triples == expected
    assert reqs[3].rid == "g3_0_4096_2048" and all(r.max_new_tokens is None for r in reqs)


def test_grid_with_max_new_tokens():
    spec = WorkloadSpec(grid=GridSpec((0,), (0,), (5, 6), (1, 2)))
    reqs = load_workload(spec)
    assert [(r.extend_tokens, r.max_new_tokens, r.rid) for r in reqs] == [
        (5, 1, "g0_0_0_5_1"), (5, 2, "g1_0_0_5_2"), (6, 1, "g2_0_0_6_1"), (6, 2, "g3_0_0_6_2"),
    ]  # fmt: skip


def test_grid_rejects_zero_extend():
    with pytest.raises(FieldError, match=r"grid\.extend_tokens.*>= 1"):
        build(WorkloadSpec, {"grid": {"extend_tokens": [0, 5]}})


def test_unknown_source_lists_the_registry():
    with pytest.raises(
        FieldError, match=r"source: unknown workload source .nope. \(allowed: grid, "
    ):
        build(WorkloadSpec, {"source": "nope"})
    assert {"grid", "jsonl"} <= set(SOURCES.names())


def write(tmp_path, lines):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_seed_example(tmp_path):
    path = write(
        tmp_path,
        [
            '{"rid":"r0","l1_cached_tokens":40320,"l2_cached_tokens":0,"extend_tokens":128}',
            "",
            '{"rid":"r1","l1_cached_tokens":0,"l2_cached_tokens":32768,"extend_tokens":512,'
            '"max_new_tokens":7,"priority":2,"arrival_ms":1.5}',
        ],
    )
    reqs = load_workload(WorkloadSpec(source="jsonl", path=str(path)))
    assert reqs == (
        Request("r0", 40320, 0, 128),
        Request("r1", 0, 32768, 512, 7, 2, 1.5),
    )


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ('{"rid":"a","extend_tokens":0}', r"field 'extend_tokens' must be an integer >= 1"),
        ('{"rid":"a"}', r"field 'extend_tokens' is missing"),
        ('{"rid":"a","extend_tokens":3,"prompt":1}', r"unknown field 'prompt' \(allowed: rid, "),
        (
            '{"rid":"a","extend_tokens":3,"l1_cached_tokens":-1}',
            r"field 'l1_cached_tokens' must be an integer >= 0",
        ),
        (
            '{"rid":"a","extend_tokens":3,"l2_cached_tokens":1.5}',
            r"field 'l2_cached_tokens' must be an integer",
        ),
        ('{"rid":"a","extend_tokens":true}', r"field 'extend_tokens' must be an integer"),
        ('{"extend_tokens":3}', r"field 'rid' must be a non-empty string"),
        (
            '{"rid":"a","extend_tokens":3,"arrival_ms":-2}',
            r"field 'arrival_ms' must be a finite number >= 0",
        ),
        (  # Python's json reads NaN and Infinity; a serving run would never reach them
            '{"rid":"a","extend_tokens":3,"arrival_ms":NaN}',
            r"field 'arrival_ms' must be a finite number >= 0, got nan",
        ),
        (
            '{"rid":"a","extend_tokens":3,"arrival_ms":Infinity}',
            r"field 'arrival_ms' must be a finite number >= 0, got inf",
        ),
        ('{"rid":"a","extend_tokens":3,"priority":"hi"}', r"field 'priority' must be an integer"),
        ('{"rid":"a",', r"not valid JSON"),
        ("[1, 2]", r"expected a JSON object, got list"),
    ],
)
def test_jsonl_errors_name_file_line_and_field(tmp_path, line, pattern):
    path = write(tmp_path, ['{"rid":"ok","extend_tokens":1}', line])
    with pytest.raises(InputError, match=pattern) as err:
        load_workload(WorkloadSpec(source="jsonl", path=str(path)))
    assert str(err.value).startswith(f"{path}:2: ")


def test_jsonl_repeated_rid(tmp_path):
    line = json.dumps({"rid": "x", "extend_tokens": 1})
    path = write(tmp_path, [line, line])
    with pytest.raises(InputError, match=r":2: field 'rid': 'x' repeats"):
        load_workload(WorkloadSpec(source="jsonl", path=str(path)))


def test_jsonl_needs_a_readable_path(tmp_path):
    with pytest.raises(ConfigError, match="admit.workload.path"):
        load_workload(WorkloadSpec(source="jsonl"))
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(InputError, match=rf"^admit.workload.path: {missing} does not exist"):
        load_workload(WorkloadSpec(source="jsonl", path=str(missing)))
    unreadable = tmp_path / "folder.jsonl"
    unreadable.mkdir()
    with pytest.raises(InputError, match="does not exist or is not a file"):
        load_workload(WorkloadSpec(source="jsonl", path=str(unreadable)))


def test_relative_paths_say_where_they_are_read_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=f"a relative path is read from {tmp_path}"):
        load_workload(WorkloadSpec(source="jsonl", path="here.jsonl"))
    with pytest.raises(InputError, match="^admit.workload.path: trace file here.jsonl"):
        load_workload(WorkloadSpec(source="trace", path="here.jsonl"))


def test_request_checks_its_counts():
    with pytest.raises(InputError, match="extend_tokens >= 1"):
        Request("x", 0, 0, 0)
    with pytest.raises(InputError, match="'y'"):
        Request("y", -1, 0, 5)
