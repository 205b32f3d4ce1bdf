"""An operator's move as one live round (reconfig.live.RequestedMove, ``RECONF move``).

The property that makes a requested move safe to run through the protocol: the local tree it
asks for is a plan every member of the neighbourhood accepts (:func:`plan_problem`), and
applying it is exactly the planner's move (:class:`reconfig.rebuild.Move`) on the whole tree.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.tree import Tree, broker_names, random_tree
from reconfig.live import Prepare, RequestedMove, parse_move, plan_problem
from reconfig.rebuild import Move
from security.errors import InvalidRequest


@given(seed=st.integers(0, 10**6), n=st.integers(3, 10), data=st.data())
def test_a_requested_move_is_a_plan_every_member_accepts_and_is_the_planners_move(
    seed: int, n: int, data: st.DataObject
) -> None:
    tree = random_tree(broker_names(n), random.Random(seed))
    masters = sorted(v for v in tree.brokers if len(tree.neighbours(v)) >= 2)
    master = data.draw(st.sampled_from(masters))
    nbrs = sorted(tree.neighbours(master))
    vn = data.draw(st.sampled_from(nbrs))
    via = data.draw(st.sampled_from([x for x in nbrs if x != vn]))
    move = RequestedMove(vn, via, "cycle 1 move 1/1")
    assert move.problem(master, nbrs) is None
    links = move.local_links(master, nbrs)
    step = Prepare("prepare", "m#1", master, (master, *nbrs), tuple(links))
    for member in (master, *nbrs):
        assert plan_problem(step, member, tree.neighbours(member)) is None
    hood = {master, *nbrs}
    kept = [(a, b) for a, b in tree.links if not (a in hood and b in hood)]
    after = Tree(tree.brokers, [*kept, *links])  # what the round installs
    planned = Move(master, vn, via)
    assert after.links == tree.swap(planned.remove, planned.add).links


def test_a_stale_or_degenerate_move_is_refused_naming_why() -> None:
    assert RequestedMove("b", "b").problem("m", ["a", "b"]) == "move b via itself"
    problem = RequestedMove("c", "a").problem("m", ["a", "b"])
    assert problem == "VN c is not a neighbour of master m (its neighbours: a, b)"


def test_a_move_request_round_trips_and_bad_fields_are_named() -> None:
    move = RequestedMove("b", "a", "cycle 2 move 1/3")
    assert parse_move(move.to_data()) == move
    assert RequestedMove.op == "move"
    with pytest.raises(InvalidRequest, match="'via' must be a VN id"):
        parse_move({"vn": "b"})
    with pytest.raises(InvalidRequest, match="'vn' must be a VN id"):
        parse_move({"vn": 3, "via": "a"})
    with pytest.raises(InvalidRequest, match="'tag' must be a string"):
        parse_move({"vn": "b", "via": "a", "tag": 1})
