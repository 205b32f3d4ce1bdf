"""The frames a connection keeps to send again on a resume (broker.wire.resend)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from broker.wire.resend import RecentFrames


def longest_suffix_within(frames: list[bytes], limit: int) -> int:
    """How many of the newest ``frames`` fit in ``limit`` bytes."""
    fit = 0
    while fit < len(frames) and sum(map(len, frames[len(frames) - fit - 1 :])) <= limit:
        fit += 1
    return fit


def assert_newest_within(kept: list[bytes], frames: list[bytes], budget: int) -> None:
    """``kept`` are the newest ``frames``, in order: all that fit the budget, or at least
    those that fit in seven eighths of it (a trim leaves room for the next ones)."""
    assert kept == frames[len(frames) - len(kept) :]
    assert sum(map(len, kept)) <= budget
    assert len(kept) >= longest_suffix_within(frames, budget - budget // 8)


@given(st.integers(0, 300), st.lists(st.binary(max_size=120), max_size=60))
def test_the_newest_frames_that_fit_the_budget_are_kept_oldest_first(
    budget: int, frames: list[bytes]
) -> None:
    recent = RecentFrames(budget)
    for frame in frames:
        recent.keep(frame)
        assert recent.size <= budget
    assert_newest_within(recent.take(), frames, budget)
    assert recent.take() == []
    assert recent.size == 0


@given(
    st.integers(0, 600),
    st.lists(st.lists(st.binary(max_size=120), max_size=12), max_size=30),
)
@example(0, [[b"\x00", b""]])  # a trim that dropped a run whose last frame (empty) fits
def test_frames_kept_a_write_at_a_time_are_the_newest_that_fit_the_budget(
    budget: int, writes: list[list[bytes]]
) -> None:
    recent = RecentFrames(budget)
    frames: list[bytes] = []
    for write in writes:
        recent.keep_all(list(write))
        frames += write
        assert recent.size <= budget
    assert_newest_within(recent.take(), frames, budget)
    assert recent.size == 0


def test_of_a_write_the_frames_left_out_and_those_too_large_are_not_kept() -> None:
    recent = RecentFrames(1000)
    small = [b"d%d" % i for i in range(5)]
    large, notice, ack = b"x" * 101, b"notice", b"ack"
    recent.keep_written([small[0], notice, small[1], large, small[2], ack], [notice, ack], 100)
    recent.keep_written(small[3:], [], 100)
    assert recent.take() == small
