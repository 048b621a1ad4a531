"""A request's runs of consecutive tokens in cpkv's loop, for its token gaps
(:mod:`cpkv.serving.record.token_gaps`).

Every running request decodes one token an iteration, so the loop logs an iteration's
one-iteration gaps as a count (the requests that decoded in it) and keeps nothing per
request while it runs. A request's *run* starts with the token that makes it running (its
first, or the first after a preemption's recompute) at iteration ``s`` with ``g`` tokens:
while it runs, its last token came at iteration ``s + generated - g``. What is kept:

* at that token, the loop sets ``token_iteration = s`` and ``run_tokens = g``; when the
  request had a token before, :func:`run_restarted` logs its gap of several iterations (the
  iteration's end minus that token's time);
* :func:`run_left`: once an iteration that preempted it has ended, the iteration and the
  time of its last token (the end of this iteration if it decoded in it, else of the one
  before), and the run's one-iteration gaps in its history;
* :func:`withdraw`: a request that ends without finishing takes its gaps out of the pool.
"""

from __future__ import annotations

from typing import Any

from cpkv.serving.model.request import Req


def run_restarted(gaps: Any, r: Req, now: float) -> None:
    """``r``, which left a run, got a token again at ``now``: the gap since its token
    before."""
    gap = now - r.token_us
    gaps.point(-1, gap, 1)
    _history(r).append(gap)


def run_left(r: Req, iteration: int, start: float, now: float) -> None:
    """``r`` left the running set in ``iteration`` (from ``start`` to ``now``)."""
    if r.run_tokens < 0:
        return  # it was not running (a prefilled request preempted before its token)
    begun = r.token_iteration
    last = begun + r.generated - r.run_tokens
    r.token_us = now if last == iteration else start
    r.token_iteration, r.run_tokens = last, -1
    if last > begun:
        _history(r).append((begun + 1, last))


def withdraw(gaps: Any, r: Req) -> None:
    """``r`` ended without finishing: its gaps leave the pool (its current run, which a
    cancellation of a running request ends, included)."""
    if r.run_tokens >= 0:
        begun = r.token_iteration
        gaps.withdraw(begun + 1, begun + r.generated - r.run_tokens)
    for item in r.gap_history or ():
        if isinstance(item, tuple):
            gaps.withdraw(*item)
        else:
            gaps.point(-1, item, -1)


def _history(r: Req) -> list:
    if r.gap_history is None:
        r.gap_history = []
    return r.gap_history
