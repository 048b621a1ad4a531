"""trace.json streams: written as the events happen (the same document as one joined at the
end), read back by a strict JSON parser, memory that does not grow with the run, and the room
on the disk checked before and while it is written."""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from cpkv.core.errors import OutputError
from cpkv.serving.model.request import FINISHED, REJECTED
from cpkv.serving.record.trace import events as trace_events
from cpkv.serving.record.trace import file as trace_file
from cpkv.serving.record.trace.events import TraceEvents
from cpkv.serving.record.trace.file import REQUEST_EVENTS_MIN_BYTES, DiskRoom, open_trace
from tests.helpers.paths import MOONCAKE_TRACE, REPO

needs_trace = pytest.mark.skipif(
    not MOONCAKE_TRACE.is_file(), reason="configs/serving.yaml reads the Mooncake trace, not here"
)


def _strict(text: str):
    """``text`` parsed as JSON, refusing NaN and Infinity (which no strict reader accepts)."""

    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _engine(k: int) -> SimpleNamespace:
    """What an iteration hook reads of an engine, at its ``k``-th iteration."""
    pool = SimpleNamespace(n_running=k % 7, used_blocks=k % 11, preempted=[])
    return SimpleNamespace(
        pool=pool, prefill_tokens=(k % 3) * 64, prefilling=[], waiting=[None] * (k % 5),
        counters={"l1_hit_tokens": k}, iterations=k, admitted=k % 2, loaded=0,
    )  # fmt: skip


def _request(k: int, state: int = FINISHED) -> SimpleNamespace:
    t = 1000.0 * k
    return SimpleNamespace(
        index=k, rid=f"r{k}", arrival_us=t, finished_us=t + 500.0, state=state,
        prompt_tokens=128, max_new_tokens=16, admitted_us=t + 100.0, first_token_us=t + 200.0,
        reject_reason=None, generated=16,
    )  # fmt: skip


def _feed(events: TraceEvents, requests: int, iterations_each: int = 5) -> None:
    """A run's worth of hooks: ``iterations_each`` iterations per request, then its end."""
    hooks = events.instance(0)
    k = 0
    for r in range(requests):
        for _ in range(iterations_each):
            hooks.iteration(_engine(k), 10.0 * k, 9.5, k % 4, 1, 0)
            k += 1
        hooks.request(_request(r))


def test_streamed_document_is_the_joined_one(monkeypatch) -> None:
    kept = TraceEvents()
    _feed(kept, 300)
    monkeypatch.setattr(trace_events, "FLUSH_EVENTS", 7)  # many pieces, one a partial one
    pieces: list[str] = []
    streamed = TraceEvents(pieces.append)
    _feed(streamed, 300)
    streamed.close()
    assert len(pieces) > 100
    assert "".join(pieces) == kept.text()
    assert streamed.text() is None  # written, not kept
    assert streamed.chars == len("".join(pieces))
    assert streamed.events == len(_strict(kept.text())["traceEvents"])


def test_an_empty_trace_is_a_document() -> None:
    events = TraceEvents()
    assert _strict(events.text()) == {"traceEvents": [], "displayTimeUnit": "ms"}


def test_memory_does_not_grow_with_the_run() -> None:
    def peak(requests: int) -> tuple[int, int]:
        written = [0]

        def write(text: str) -> None:  # a sink that keeps nothing (the file)
            written[0] += len(text)

        tracemalloc.start()
        try:
            events = TraceEvents(write)
            _feed(events, requests)
            events.close()
            return tracemalloc.get_traced_memory()[1], written[0]
        finally:
            tracemalloc.stop()

    short, short_bytes = peak(1_000)
    long, long_bytes = peak(8_000)
    assert long_bytes > 7 * short_bytes  # eight times the events written...
    assert long < 1.25 * short + 64_000  # ...in the same memory
    assert long < long_bytes / 4  # far less than the file


def test_the_smallest_request_is_not_below_the_bound() -> None:
    events = TraceEvents()
    hooks = events.instance(0)
    events.flush()
    before = events.chars
    smallest = _request(0, REJECTED)
    smallest.rid, smallest.arrival_us, smallest.finished_us = "", 0.0, 0.0
    smallest.admitted_us = smallest.first_token_us = None
    smallest.prompt_tokens = smallest.max_new_tokens = smallest.generated = 0
    hooks.request(smallest)
    events.flush()
    assert events.chars - before >= REQUEST_EVENTS_MIN_BYTES


def test_a_trace_that_cannot_fit_is_refused_before_the_run(tmp_path: Path) -> None:
    with pytest.raises(OutputError) as err:
        open_trace(lambda text: None, 1_000_000, tmp_path, free=lambda folder: 10**6)
    message = str(err.value)
    assert "\n" not in message and "trace.json" in message and "1,000,000 requests" in message
    assert "admit.serving.trace_events=false" in message
    assert open_trace(lambda text: None, 1000, tmp_path, free=lambda folder: 10**9) is not None


def test_a_trace_on_course_to_fill_the_disk_stops_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(trace_file, "CHECK_EVERY_BYTES", 10_000)
    room = DiskRoom(tmp_path, requests=1000, free=lambda folder: 50_000)
    events = TraceEvents(lambda text: None, on_flush=room)
    monkeypatch.setattr(trace_events, "FLUSH_EVENTS", 16)
    with pytest.raises(OutputError) as err:
        _feed(events, 1000)
    message = str(err.value)
    assert "\n" not in message and "trace.json" in message and "left on the disk" in message
    # not before the projection can be trusted: 5 % of the requests ended
    assert events.requests_ended >= 50


def test_enough_room_lets_the_run_write_everything(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(trace_file, "CHECK_EVERY_BYTES", 10_000)
    monkeypatch.setattr(trace_events, "FLUSH_EVENTS", 16)
    checked = []

    def free(folder: Path) -> int:
        checked.append(folder)
        return 10**12

    events = TraceEvents(lambda text: None, on_flush=DiskRoom(tmp_path, 1000, free))
    _feed(events, 1000)
    events.close()
    assert checked and events.requests_ended == 1000


@needs_trace
def test_a_run_writes_a_strict_trace_json(cli) -> None:
    res = cli(
        "admit", str(REPO / "configs/serving.yaml"), "admit.workload.limit=60",
        "admit.serving.trace_events=true",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = _strict((run / "trace.json").read_text())
    events = doc["traceEvents"]
    phases = Counter(e["ph"] for e in events)
    summary = cli.results(run)["summary"]
    requests = sum(1 for _ in (run / "requests.jsonl").open())
    assert phases["X"] > 0 and phases["b"] == phases["e"] == 2 * requests
    assert (
        sum(e["args"]["decode_tokens"] for e in events if e["ph"] == "X")
        == (summary["decode_tokens"])
    )
    assert not list(run.glob(".*.tmp-*"))  # renamed into place
    assert any(f"{len(events):,} events" in n for n in cli.results(run)["notes"])


@needs_trace
def test_a_run_whose_trace_cannot_fit_fails_in_one_line(cli, monkeypatch) -> None:
    monkeypatch.setattr(trace_file, "free_bytes", lambda folder: 1000)
    res = cli(
        "admit", str(REPO / "configs/serving.yaml"), "admit.workload.limit=60",
        "admit.serving.trace_events=true",
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    (line,) = [x for x in res.output.splitlines() if x.strip()]
    assert "trace.json: needs at least" in line and "Traceback" not in res.output
    (run,) = cli.run_dirs()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "failed" and "trace.json" in meta["error"]
    assert not (run / "trace.json").exists() and not list(run.glob(".*.tmp-*"))
