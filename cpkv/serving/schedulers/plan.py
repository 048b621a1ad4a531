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

from typing import Final

from cpkv.serving.model.request import Req


class Admit:
    """A request leaves the queue: its L1 prefix (no pool blocks), its L2 hit as looked up
    (loaded back when at least ``load_back_threshold`` tokens) and the tokens its blocks
    reserve (None: only its prompt's)."""

    def __init__(
        self, device_prefix: int, host_hit: int, reserve_tokens: int | None = None
    ) -> None:
        self.device_prefix = device_prefix
        self.host_hit = host_hit
        self.reserve_tokens = reserve_tokens


class Prefill:
    """One prefill row: ``tokens`` of ``request``'s prompt this iteration."""

    def __init__(self, request: Req, tokens: int) -> None:
        self.request = request
        self.tokens = tokens


class Plan:
    """One iteration's prefill side (module docstring); ``uniform``: every prefilling
    request but the last ``held`` computes ``min(left, chunk)`` tokens by its lane's rule
    (:class:`~cpkv.serving.model.prefill_lane.PrefillLane`) and has no row; the last
    ``held`` (where a budget runs out) compute their rows' tokens, or none without a row."""

    def __init__(
        self, admitted: list[tuple[Req, Admit]], prefills: list[Prefill], stops: list[str],
        uniform: bool = False, held: int = 0,
    ) -> None:  # fmt: skip
        self.admitted = admitted
        self.prefills = prefills
        self.stops = stops
        self.uniform = uniform
        self.held = held


class Quiet:
    """The iterations, the next one included, whose plans the scheduler knows without being
    asked, as long as nothing but decode steps and those prefill chunks happens in them (no
    arrival, finish, completed prompt or preemption): ``steps`` of them (0: ask every
    iteration), each admitting nothing, recording ``stop`` (or nothing), and, ``uniform``,
    each prefilling request computing its lane's chunk (without it, none may be
    prefilling). ``admits`` (with no steps): the next iteration admits, and the scheduler
    may name its admissions (:meth:`~cpkv.serving.schedulers.base.Scheduler.joining`)."""

    def __init__(
        self, steps: int, stop: str | None = None, uniform: bool = False, admits: bool = False
    ) -> None:
        self.steps = steps
        self.stop = stop
        self.uniform = uniform
        self.admits = admits


NOT_QUIET: Final = Quiet(0)
ADMITS: Final = Quiet(0, admits=True)
"""No quiet steps: the next iteration admits (the queue's head fits)."""
FOREVER: Final = 1 << 62
"""``Quiet.steps`` when only an event can change the scheduler's decision."""
