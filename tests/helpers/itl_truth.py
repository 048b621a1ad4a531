"""Every token's timestamp of a serving run, recorded beside the engines (the reference the ITL
tests hold the reported statistics to): each engine runs every iteration in full, and a
recorder stamps a request's new tokens with the end of the iteration that emitted them.

* cpkv's loop: after each iteration, every request's token count (the KV pool's for a
  running request, else its own) against the count before it;
* SGLang's loop: each output token the loop hands a request (``Loop._emit``), stamped with
  its batch's end;
* vLLM: each token the scheduler appends (``Scheduler.update``), at the step's end.

The pooled gaps are the differences of consecutive stamps of each finished request, their
statistics numpy's (mean, linear percentiles, max), in ms.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cpkv.serving.engine import engine as engine_module
from cpkv.serving.model.request import FINISHED, RUNNING
from cpkv.sglang import loop as loop_module
from cpkv.vllm import scheduler as scheduler_module

STATS = ("mean", "p50", "p90", "p99", "max")


def pooled(stamps: dict[str, list[float]], finished: list[str]) -> dict[str, Any]:
    """The gaps of the finished requests' consecutive tokens: count and statistics (ms)."""
    gaps = np.concatenate([np.diff(np.array(stamps.get(rid, []))) for rid in finished] or [[]])
    if not len(gaps):
        return {"gaps": 0, **dict.fromkeys(STATS)}
    ms = gaps / 1000.0
    return {
        "gaps": len(gaps), "mean": float(ms.mean()), "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
    }  # fmt: skip


def same(reported: Any, truth: dict[str, Any], rel: float = 1e-9) -> None:
    """The reported :class:`~cpkv.serving.record.itl.ItlStats` is the recorded tokens'."""
    assert reported.gaps == truth["gaps"]
    for k in STATS:
        value, expected = getattr(reported, f"{k}_ms"), truth[k]
        if expected is None:
            assert value is None, k
        else:
            assert value is not None, k
            assert abs(value - expected) <= rel * abs(expected), (k, value, expected)


class CpkvTokens:
    """Stamps of cpkv's loop (module docstring): install with ``monkeypatch``."""

    def __init__(self, monkeypatch: Any) -> None:
        self.stamps: dict[str, list[float]] = {}
        self.seen: dict[int, dict[int, Any]] = {}  # by engine: its requests so far
        original = engine_module.Engine._iteration
        recorder = self

        def iteration(engine: Any) -> None:
            seen = recorder.seen.setdefault(id(engine), {})
            before = {key: recorder.count(engine, r) for key, r in seen.items()}
            original(engine)
            sink = getattr(engine.sink, "requests", None)  # (a sink that keeps them)
            sink = sink if isinstance(sink, list) else ()
            for r in (*engine.pool.running, *engine.prefilling, *engine.waiting, *sink):
                seen.setdefault(id(r), r)
            for key, r in seen.items():
                for _ in range(recorder.count(engine, r) - before.get(key, 0)):
                    recorder.stamps.setdefault(r.rid, []).append(engine.now)

        monkeypatch.setattr(engine_module.Engine, "_iteration", iteration)

    @staticmethod
    def count(engine: Any, r: Any) -> int:
        return engine.pool.gen_now(r) if r.state == RUNNING else r.generated


class SglangTokens:
    """Stamps of SGLang's loop: every output token, at its batch's end."""

    def __init__(self, monkeypatch: Any) -> None:
        self.stamps: dict[str, list[float]] = {}
        original = loop_module.Loop._emit
        stamps = self.stamps

        def emit(loop: Any, reqs: Any, batch: Any) -> list[Any]:
            for req in reqs:
                stamps.setdefault(req.rid, []).append(batch.end_us)
            return original(loop, reqs, batch)

        monkeypatch.setattr(loop_module.Loop, "_emit", emit)


class VllmTokens:
    """Stamps of vLLM's scheduler: every token appended, at the step's end (``clock()``)."""

    def __init__(self, monkeypatch: Any, clock: Any) -> None:
        self.stamps: dict[str, list[float]] = {}
        original = scheduler_module.Scheduler.update
        stamps = self.stamps

        def update(scheduler: Any, plan: Any) -> list[str]:
            entries = [e[0] for part in (plan.running, plan.admitted) for e in part]
            before = [request.num_tokens for request in entries]
            out = original(scheduler, plan)
            for request, n in zip(entries, before, strict=True):
                for _ in range(request.num_tokens - n):
                    stamps.setdefault(request.request_id, []).append(clock())
            return out

        monkeypatch.setattr(scheduler_module.Scheduler, "update", update)


def finished(requests: Any) -> list[str]:
    return [r.rid for r in requests if r.state == FINISHED]


def kinds_of_gaps(samples: Any) -> tuple[int, int, int]:
    """What a run's gap log holds: records of several-iteration gaps, withdrawn ranges, and
    stretch records (lines of more than one iteration)."""
    log = samples.settle_gaps()
    long = lines = 0
    for gaps in log.records():
        long += int((gaps.iteration < 0).sum())
        lines += int((gaps.n > 1).sum())
    return long, len(log.withdrawn), lines
