"""The serving plot's latency reading (a ``requests.jsonl`` a chunk at a time, two fields a
line) against ``json.loads`` of every line, and its CDF's order statistics."""

from __future__ import annotations

import json

from cpkv.plots import serving as plot_module
from cpkv.plots.serving import cdf_steps, finished_latencies


def _line(rid: str, status: str, ttft, tpot, **more) -> str:
    row = {"rid": rid, "status": status, "reason": None, "arrival_ms": 1.5, **more}
    row.update({"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": 9.0, "prompt_tokens": 3})
    return json.dumps(row, separators=(",", ":"))


def _by_json(text: str) -> tuple[list[float], list[float]]:
    rows = [json.loads(x) for x in text.splitlines() if x.strip()]
    done = [r for r in rows if r["status"] == "finished"]
    return [r["ttft_ms"] for r in done], [r["tpot_ms"] for r in done if r["tpot_ms"] is not None]


def test_the_fast_reading_is_json_and_a_chunk_edge_changes_nothing(tmp_path, monkeypatch) -> None:
    lines = [
        _line("a", "finished", 12.5, 3.25),
        _line('quo"te "status":"finished"', "rejected", None, None),  # an escaped quote
        _line("b", "finished", 1e-05, None),  # one output token: no TPOT
        _line("c", "finished", 7.0, 0.5, queue_ms=2.0),
    ] * 50
    text = "\n".join(lines) + "\n"
    path = tmp_path / "requests.jsonl"
    path.write_text(text)
    monkeypatch.setattr(plot_module, "CHUNK_BYTES", 97)  # chunks end inside lines
    ttft, tpot = finished_latencies(path)
    assert (list(ttft), list(tpot)) == _by_json(text)
    assert len(ttft) == 150 and len(tpot) == 100


def test_another_key_order_is_read_as_json(tmp_path) -> None:
    text = '{"status":"finished","rid":"x","tpot_ms":2.0,"ttft_ms":4.0}\n' + _line(
        "y", "finished", 1.0, 1.0
    )  # no newline at the end
    path = tmp_path / "requests.jsonl"
    path.write_text(text)
    ttft, tpot = finished_latencies(path)
    assert (list(ttft), list(tpot)) == ([4.0, 1.0], [2.0, 1.0])


def test_a_long_cdf_is_drawn_through_evenly_spaced_order_statistics(monkeypatch) -> None:
    x, f = cdf_steps([3.0, 1.0, 2.0])
    assert list(x) == [1.0, 2.0, 3.0] and list(f) == [1 / 3, 2 / 3, 1.0]
    monkeypatch.setattr(plot_module, "CDF_POINTS", 5)
    x, f = cdf_steps([float(v) for v in range(100, 0, -1)])  # 1..100, reversed
    # ranks 0, 24.75, 49.5, 74.25, 99 rounded: 0, 25, 50, 74, 99 (half to even)
    assert list(x) == [1.0, 26.0, 51.0, 75.0, 100.0]
    assert list(f) == [0.01, 0.26, 0.51, 0.75, 1.0]
