"""The forked helper processes of long serving runs: an error in a child comes back as one
``RuntimeError`` naming it, the child is reaped (no orphan), and no helper is used where
``fork`` is missing, where threads run, when switched off or for short runs."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from cpkv.serving import helper as helper_module
from cpkv.serving.helper import Helper, Producer, helper_wanted

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")


class Lines:
    path = "/nonexistent/requests.jsonl"  # a file: helpers may be used

    def flush(self) -> None:
        pass


class FailingStats:
    forward = None

    def process(self, packed: bytes, rids: list[str]) -> None:
        raise ValueError("boom in the child")


class Samples:
    forward = None

    def discard(self) -> None:
        pass


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped already
    return False


@needs_fork
def test_an_error_in_the_output_child_is_one_runtime_error_and_the_child_is_reaped() -> None:
    helper = Helper(FailingStats(), Samples(), Lines())
    pid = helper.pid
    helper.records(b"\x00" * 8, ["r0"])
    with pytest.raises(RuntimeError, match="helper process failed: ValueError: boom in the child"):
        helper.finish(1.0, 16, 4)
    assert helper.pid == 0 and _gone(pid)


@needs_fork
def test_an_error_while_drawing_arrivals_is_one_runtime_error() -> None:
    def arrivals():
        raise KeyError("no such field")
        yield  # a generator

    producer = Producer(arrivals())
    pid = producer.pid
    with pytest.raises(RuntimeError, match="arrival process failed: KeyError"):
        list(producer)
    assert producer.pid == 0 and _gone(pid)


@needs_fork
def test_a_parent_that_stops_early_ends_the_arrival_child() -> None:
    def arrivals():  # arrival rows (cpkv.serving.arrivals.as_reqs)
        for i in range(10**9):  # endless: the child blocks on a full pipe
            yield i, f"r{i}", float(i), 10, 1, 0, 0, None

    producer = Producer(arrivals())
    pid = producer.pid
    first = next(iter(producer))
    assert first.rid == "r0"
    producer.close()  # the parent stops reading: the child ends on a broken pipe
    assert producer.pid == 0 and _gone(pid)


def test_no_helper_without_fork_threads_a_file_or_enough_requests(monkeypatch) -> None:
    monkeypatch.delenv("CPKV_SERVING_HELPER", raising=False)
    big = helper_module.HELPER_MIN_REQUESTS
    if hasattr(os, "fork"):
        assert helper_wanted(big, Lines()) == sys.platform.startswith("linux")
    assert not helper_wanted(big - 1, Lines())  # too short
    assert not helper_wanted(big, object())  # lines kept in memory: no file
    monkeypatch.setenv("CPKV_SERVING_HELPER", "0")
    assert not helper_wanted(big, Lines())
    monkeypatch.delenv("CPKV_SERVING_HELPER")
    monkeypatch.delattr(os, "fork", raising=False)
    assert not helper_wanted(big, Lines())


def test_no_helper_while_another_thread_runs(monkeypatch) -> None:
    monkeypatch.delenv("CPKV_SERVING_HELPER", raising=False)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not helper_wanted(helper_module.HELPER_MIN_REQUESTS, Lines())
    finally:
        stop.set()
        other.join()
