"""Token ids held as runs of consecutive integers.

A trace request's prompt is its hashed blocks' ids, ``h * block + offset``, then ids of its own,
and its outputs are ids of its own too: a few runs of consecutive integers, however long the
prompt. :class:`TokenRuns` keeps those runs instead of one Python int per token, so that the
radix cache's keys, slices and prefix comparisons cost the number of runs, not of tokens. It is
a ``Sequence[int]`` like the ``list`` and ``range`` ids the loop also takes, and it compares
equal to either when the ids are the same.

The runs are canonical: no run is empty and no run continues the one before it (a run that
would is merged into it), so two ``TokenRuns`` hold the same ids exactly when their runs are
the same.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Any


class TokenRuns(Sequence[int]):
    """Token ids as runs: ``starts[k]`` is the first id of run ``k``, ``ends[k]`` the position
    just past it (so run ``k`` covers positions ``ends[k - 1]`` to ``ends[k]``)."""

    __slots__ = ("starts", "ends")

    def __init__(self, starts: tuple[int, ...] = (), ends: tuple[int, ...] = ()) -> None:
        self.starts, self.ends = starts, ends  # canonical: see the module docstring

    @classmethod
    def of(cls, runs: Iterable[tuple[int, int]]) -> TokenRuns:
        """The ids of ``(first id, length)`` runs, in order (empty runs skipped, a run that
        continues the one before merged into it)."""
        starts: list[int] = []
        ends: list[int] = []
        end = 0
        for first, length in runs:
            if length <= 0:
                continue
            if starts and starts[-1] + (end - (ends[-2] if len(ends) > 1 else 0)) == first:
                end += length
                ends[-1] = end
                continue
            end += length
            starts.append(first)
            ends.append(end)
        return cls(tuple(starts), tuple(ends))

    def runs(self, at: int = 0) -> Iterator[tuple[int, int]]:
        """``(first id, length)`` of the runs from position ``at`` on."""
        ends, starts = self.ends, self.starts
        first = bisect_right(ends, at)
        begin = ends[first - 1] if first else 0
        for k in range(first, len(ends)):
            yield starts[k] + at - begin, ends[k] - at
            begin = at = ends[k]

    def then(self, first: int, count: int) -> TokenRuns:
        """These ids followed by ``count`` ids counting up from ``first``."""
        if count <= 0:
            return self
        return TokenRuns.of([*self.runs(), (first, count)])

    def __len__(self) -> int:
        ends = self.ends
        return ends[-1] if ends else 0

    def __iter__(self) -> Iterator[int]:
        for first, length in self.runs():
            yield from range(first, first + length)

    def __getitem__(self, index: Any) -> Any:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return list(self)[index]
            return self._slice(start, stop)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("TokenRuns index out of range")
        ends = self.ends
        k = bisect_right(ends, index)
        return self.starts[k] + index - (ends[k - 1] if k else 0)

    def _slice(self, start: int, stop: int) -> TokenRuns:
        if start >= stop:
            return EMPTY
        if start == 0 and stop == len(self):
            return self
        ends, starts = self.ends, self.starts
        first = bisect_right(ends, start)
        last = bisect_right(ends, stop - 1)
        begin = ends[first - 1] if first else 0
        new_starts = (starts[first] + start - begin, *starts[first + 1 : last + 1])
        new_ends = (*(e - start for e in ends[first:last]), stop - start)
        return TokenRuns(new_starts, new_ends)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRuns):
            return self.ends == other.ends and self.starts == other.starts
        if isinstance(other, range):
            return self == as_runs(other)
        if isinstance(other, Sequence):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        runs = ", ".join(f"{first}+{length}" for first, length in self.runs())
        return f"TokenRuns({runs})"


EMPTY = TokenRuns()


def as_runs(ids: Sequence[int]) -> TokenRuns:
    """``ids`` as :class:`TokenRuns` (a ``range`` of step 1 is one run)."""
    if isinstance(ids, TokenRuns):
        return ids
    if isinstance(ids, range) and ids.step == 1:
        return TokenRuns.of([(ids.start, len(ids))])
    return TokenRuns.of((i, 1) for i in ids)


def shared_prefix(key: Sequence[int], tokens: Sequence[int], at: int, n: int) -> int:
    """How many of ``key[:n]`` equal ``tokens[at:at + n]``, position by position, when one
    of them is :class:`TokenRuns` (the other: runs, a ``range``, or any ids)."""
    mine = as_runs(key).runs()
    theirs = as_runs(tokens).runs(at)
    same = 0
    mine_id = mine_left = theirs_id = theirs_left = 0
    while same < n:
        if not mine_left:
            mine_id, mine_left = next(mine, (None, 0))
        if not theirs_left:
            theirs_id, theirs_left = next(theirs, (None, 0))
        if not mine_left or not theirs_left or mine_id != theirs_id:
            break
        step = min(mine_left, theirs_left, n - same)
        same += step
        mine_id += step
        theirs_id += step
        mine_left -= step
        theirs_left -= step
    return same
