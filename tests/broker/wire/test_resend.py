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
    kept = recent.take()
    # the longest run of newest frames whose bytes fit
    fit = 0
    while fit < len(frames) and sum(map(len, frames[len(frames) - fit - 1 :])) <= budget:
        fit += 1
    assert kept == frames[len(frames) - fit :]
    assert recent.take() == []
    assert recent.size == 0
