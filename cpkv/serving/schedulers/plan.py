"""What a scheduler decides for one iteration (:class:`Plan`) and for the iterations after it
in which nothing it reads changes (:class:`Quiet`).

A plan lists the requests the iteration admits, in order (each leaves the queue: its KV
blocks, its L2 load-back; :class:`Admit`), then its prefill rows in the order the engine
computes them: each row computes ``tokens`` prompt tokens of a prefilling or just admitted
request (a prompt with nothing left to compute, all of it cached, has a row of 0 tokens; a
request the budget does not reach this iteration has none). The running requests all decode
one token in the same iteration (a mixed batch), before the scheduler plans: the decode rows
are the running set. ``stops`` names what ended admission (one entry per request a scan
passed over, usually none or one).
"""

from __future__ import annotations

from typing import NamedTuple

from cpkv.serving.model.request import Req


class Admit(NamedTuple):
    """A request leaves the queue: its L1 prefix (no pool blocks), its L2 hit as looked up
    (loaded back when at least ``load_back_threshold`` tokens) and the tokens its blocks
    reserve (None: only its prompt's)."""

    device_prefix: int
    host_hit: int
    reserve_tokens: int | None = None


class Prefill(NamedTuple):
    """One prefill row: ``tokens`` of ``request``'s prompt this iteration."""

    request: Req
    tokens: int


class Plan(NamedTuple):
    """One iteration's prefill side (module docstring)."""

    admitted: list[tuple[Req, Admit]]
    prefills: list[Prefill]
    stops: list[str]


class Quiet(NamedTuple):
    """The iterations, the next one included, whose plans the scheduler knows without being
    asked, as long as nothing but decode steps and these prefill rows happens in them (no
    arrival, finish, completed prompt or preemption): ``steps`` of them (0: ask every
    iteration), each admitting nothing, recording ``stop`` (or nothing) and giving the
    prefilling requests ``chunks`` tokens each (in the engine's prefilling order; 0: no
    row)."""

    steps: int
    stop: str | None = None
    chunks: tuple[int, ...] = ()


NOT_QUIET = Quiet(0)
FOREVER = 1 << 62
"""``Quiet.steps`` when only an event can change the scheduler's decision."""
