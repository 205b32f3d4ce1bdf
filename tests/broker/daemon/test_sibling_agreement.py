"""Which neighbour VNs a restarted replica takes from its siblings (pure rule)."""

from __future__ import annotations

from broker.daemon.links import sibling_agreement
from reconfig.live import vouch_quorum

OLD, NEW = {"a", "b"}, {"b"}


def test_f_plus_one_matching_siblings_move_a_stale_replica() -> None:
    assert sibling_agreement(OLD, [NEW, NEW], vouch_quorum(3)) == frozenset(NEW)


def test_one_byzantine_sibling_alone_cannot_move_its_links() -> None:
    assert sibling_agreement(OLD, [NEW, OLD], vouch_quorum(3)) is None
    assert sibling_agreement(OLD, [NEW], vouch_quorum(3)) is None  # the other did not answer
    assert sibling_agreement(OLD, [{"x"}, NEW], vouch_quorum(3)) is None


def test_siblings_that_agree_with_the_saved_links_change_nothing() -> None:
    assert sibling_agreement(OLD, [OLD, OLD], vouch_quorum(3)) is None
    assert sibling_agreement(OLD, [], vouch_quorum(3)) is None


def test_a_vn_of_two_follows_its_one_sibling() -> None:
    # f = 0: a VN of two replicas tolerates no Byzantine replica; the live one is right.
    assert sibling_agreement(OLD, [NEW], vouch_quorum(2)) == frozenset(NEW)


def test_among_five_replicas_two_liars_are_outvoted() -> None:
    quorum = vouch_quorum(5)
    assert sibling_agreement(OLD, [NEW, NEW, {"x"}, {"x"}], quorum) is None
    assert sibling_agreement(OLD, [NEW, NEW, NEW, {"x"}], quorum) == frozenset(NEW)
