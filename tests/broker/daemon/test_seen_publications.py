"""SeenPublications: exact within its window, bounded in memory however sparse the seqs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.daemon.hops import SeenPublications

HORIZON = 64


@given(st.lists(st.tuples(st.sampled_from("pq"), st.integers(1, 2_000)), max_size=300))
def test_routed_seqs_are_never_fresh_and_recent_unrouted_ones_always_are(
    marks: list[tuple[str, int]],
) -> None:
    seen = SeenPublications(horizon=HORIZON)
    routed: dict[str, set[int]] = {"p": set(), "q": set()}
    for publisher, seq in marks:
        seen.add(publisher, seq)
        routed[publisher].add(seq)
        assert not seen.fresh(publisher, seq)
    for publisher, seqs in routed.items():
        newest = max(seqs, default=0)
        for seq in range(1, newest + HORIZON):
            if seq in seqs:
                assert not seen.fresh(publisher, seq)
            elif seq >= newest - HORIZON:
                assert seen.fresh(publisher, seq), (publisher, seq)


def test_a_sparse_stream_costs_a_bounded_bitmap_not_a_set_of_its_seqs() -> None:
    seen = SeenPublications(horizon=65536)
    for seq in range(1, 1_000_000, 3):  # a broker sees one publication in three
        seen.add("p", seq)
    window = seen._windows["p"]
    assert len(window.bits) <= 65536 // 4
    assert not seen.fresh("p", 999_997)
    assert seen.fresh("p", 999_998)


def test_only_the_most_recently_active_publishers_are_remembered() -> None:
    seen = SeenPublications(max_publishers=3)
    for publisher in "abcd":
        seen.add(publisher, 1)
    seen.add("b", 9)  # a new seq (in a new byte of its bitmap) makes it recent
    seen.add("e", 1)
    assert len(seen) == 3
    assert [p for p in "abcde" if seen.fresh(p, 1)] == ["a", "c"]
