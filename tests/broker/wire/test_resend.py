"""The frames a connection keeps to send again on a resume (broker.wire.resend)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.wire.resend import RecentFrames


@given(st.integers(0, 300), st.lists(st.binary(max_size=120), max_size=60))
def test_the_newest_frames_that_fit_the_budget_are_kept_oldest_first(
    budget: int, frames: list[bytes]
) -> None:
    recent = RecentFrames(budget)
    for frame in frames:
        recent.keep(frame)
        assert recent.size <= budget

    def longest_suffix_within(limit: int) -> int:
        fit = 0
        while fit < len(frames) and sum(map(len, frames[len(frames) - fit - 1 :])) <= limit:
            fit += 1
        return fit

    kept = recent.take()
    # the newest frames, in order: all that fit the budget, or at least those that fit in
    # seven eighths of it (a trim leaves room for the next ones)
    assert kept == frames[len(frames) - len(kept) :]
    assert sum(map(len, kept)) <= budget
    assert len(kept) >= longest_suffix_within(budget - budget // 8)
    assert recent.take() == []
    assert recent.size == 0
