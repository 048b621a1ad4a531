"""When the prefill lane's next prompt ends (:meth:`PrefillLane.next_due`), against its
definition over the members one by one, through random joins, leaves, uniform steps and
completions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from cpkv.serving.model.prefill_lane import PrefillLane
from cpkv.serving.model.request import Req


def defined(members: list[Req], chunk: int, steps: int) -> tuple[int, bool]:
    """The uniform steps before the first in which a member's prompt ends (its tokens left
    at most a chunk), and whether every member ending in it has a multiple of the chunk
    left; ``(1 << 62, False)`` with no members."""
    lefts = [r.fill_tokens - r.lane_base - chunk * steps for r in members]
    if not lefts:
        return 1 << 62, False
    before = min((left - 1) // chunk for left in lefts)
    ending = [left for left in lefts if (left - 1) // chunk == before]
    return before, all(left % chunk == 0 for left in ending)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.integers(1, 60)),
        st.tuples(st.just("leave"), st.integers(0, 1000)),
        st.tuples(st.just("advance"), st.integers(0, 1000)),
        st.tuples(st.just("due"), st.just(0)),
        st.tuples(st.just("complete"), st.just(0)),
    ),
    max_size=60,
)


@hyp_settings(max_examples=300, deadline=None)
@given(chunk=st.integers(1, 16), ops=operations)
def test_next_due_is_its_definition_through_any_changes(chunk, ops):
    lane, members, made = PrefillLane(chunk), [], 0
    for op, value in ops:
        if op == "join":  # a request with ``value`` tokens of its prompt left
            r = Req(made, f"r{made}", 0.0, 4096, 1)
            r.stamp, r.fill_tokens, r.filled_tokens = made, 4096, 4096 - value
            made += 1
            lane.join(r)
            members.append(r)
        elif op == "leave" and members:
            lane.leave(members.pop(value % len(members)))
        elif op == "advance" and members:  # never past a step in which a prompt ends
            before, _ = defined(members, chunk, lane.steps)
            lane.advance(value % (before + 1))
        elif op == "due":
            lane.due_members()
        elif op == "complete" and members and defined(members, chunk, lane.steps)[0] == 0:
            due = lane.due_members()
            lane.complete(due)
            members = [r for r in members if r not in due]
        assert lane.next_due() == defined(members, chunk, lane.steps)
