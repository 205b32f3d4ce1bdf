"""Which neighbour VNs and tables a replica that missed a round takes from its siblings
(pure rules)."""

from __future__ import annotations

from typing import Any

from broker.daemon.links import sibling_agreement, sibling_tables
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


def tables(vns: set[str], sub: str = "x > 1") -> dict[str, Any]:
    """Wire tables holding one subscription from every VN of ``vns``."""
    return {
        "held": {vn: {"adv": {}, "sub": {f"{vn}/1": sub}} for vn in vns},
        "sent": {vn: {} for vn in vns},
    }


def test_tables_f_plus_one_siblings_sent_alike_are_taken() -> None:
    assert sibling_tables(NEW, [tables(NEW), tables(NEW)], vouch_quorum(3)) == tables(NEW)


def test_one_byzantine_sibling_cannot_choose_the_tables() -> None:
    forged = tables(NEW, sub="x > 99")
    assert sibling_tables(NEW, [tables(NEW), forged], vouch_quorum(3)) is None
    five = [tables(NEW), tables(NEW), tables(NEW), forged, forged]
    assert sibling_tables(NEW, five, vouch_quorum(5)) == tables(NEW)


def test_tables_for_other_neighbours_or_malformed_ones_do_not_count() -> None:
    quorum = vouch_quorum(3)
    assert sibling_tables(NEW, [tables(OLD), tables(OLD)], quorum) is None
    assert sibling_tables(NEW, [{"held": [], "sent": {}}, tables(NEW)], quorum) is None
    assert sibling_tables(NEW, [None, tables(NEW)], quorum) is None
