"""The overlay tree model: validation, paths, minimal subtrees, changes, serialisation."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.tree import (
    TopologyChange,
    TopologyError,
    Tree,
    broker_names,
    line_tree,
    link,
    random_tree,
    star_tree,
)


@pytest.fixture
def small() -> Tree:
    """a – b – c – d with e hanging off b; clients x@a, y@d, z@e, w@b."""
    return Tree(
        "abcde",
        [("a", "b"), ("b", "c"), ("c", "d"), ("e", "b")],
        {"x": "a", "y": "d", "z": "e", "w": "b"},
    )


@st.composite
def trees(draw: st.DrawFn, max_brokers: int = 12) -> Tree:
    n = draw(st.integers(1, max_brokers))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    names = broker_names(n)
    clients = {f"c{i}": rng.choice(names) for i in range(draw(st.integers(0, 8)))}
    return random_tree(names, rng, clients)


# -- validation -------------------------------------------------------------------------------


def test_a_cycle_is_rejected_naming_its_nodes() -> None:
    with pytest.raises(TopologyError) as err:
        Tree("abc", [("a", "b"), ("b", "c"), ("c", "a")])
    assert err.value.reason == "cycle"
    assert set(err.value.nodes) == {"a", "b", "c"}


def test_a_disconnected_overlay_is_rejected_naming_the_unreachable_brokers() -> None:
    with pytest.raises(TopologyError) as err:
        Tree("abcd", [("a", "b"), ("c", "d")])
    assert err.value.reason == "disconnected"
    assert err.value.nodes == ("c", "d")


@pytest.mark.parametrize(
    ("brokers", "links", "clients", "reason"),
    [
        ("ab", [("a", "z")], {}, "unknown_node"),
        ("ab", [("a", "a")], {}, "self_loop"),
        ("ab", [("a", "b"), ("b", "a")], {}, "duplicate_link"),
        ("ab", [("a", "b", "c")], {}, "malformed"),
        ("ab", [("a", "b")], {"x": "q"}, "unknown_node"),
        ("ab", [("a", "b")], {"a": "b"}, "id_clash"),
        (["a", ""], [("a", "")], {}, "malformed"),
    ],
)
def test_invalid_topologies_are_rejected_with_a_reason(
    brokers: object, links: list[tuple[str, ...]], clients: dict[str, str], reason: str
) -> None:
    with pytest.raises(TopologyError) as err:
        Tree(brokers, links, clients)  # type: ignore[arg-type]
    assert err.value.reason == reason


def test_single_broker_and_empty_overlays_are_trees() -> None:
    assert Tree(["a"]).links == frozenset()
    assert Tree([]).brokers == frozenset()


def test_would_create_cycle_is_false_only_for_a_joining_broker(small: Tree) -> None:
    assert small.would_create_cycle("a", "d")
    assert small.would_create_cycle("a", "a")
    assert not small.would_create_cycle("a", "new")


def test_can_swap_requires_the_removed_link_on_the_new_links_cycle(small: Tree) -> None:
    assert small.can_swap(("c", "b"), ("a", "d"))
    assert not small.can_swap(("b", "e"), ("a", "d"))
    assert not small.can_swap(("a", "b"), ("b", "c"))


# -- queries ----------------------------------------------------------------------------------


def test_path_between_clients_runs_through_their_brokers(small: Tree) -> None:
    assert small.path("x", "y") == ["x", "a", "b", "c", "d", "y"]
    assert small.path("z", "c") == ["z", "e", "b", "c"]
    assert small.path("w", "w") == ["w"]


def test_minimal_subtree_holds_access_links_and_relay_brokers_only(small: Tree) -> None:
    nodes, links = small.minimal_subtree(["x", "z"])
    assert nodes == {"x", "a", "b", "e", "z"}
    assert links == {("a", "x"), ("a", "b"), ("b", "e"), ("e", "z")}
    assert small.minimal_subtree(["w"]) == ({"w", "b"}, {("b", "w")})
    assert small.minimal_subtree([]) == (frozenset(), frozenset())


@given(trees(), st.data())
@settings(max_examples=60, deadline=None)
def test_minimal_subtree_is_the_union_of_pairwise_paths(tree: Tree, data: st.DataObject) -> None:
    everyone = sorted(tree.brokers | set(tree.clients))
    picked = data.draw(st.lists(st.sampled_from(everyone), min_size=1, max_size=5, unique=True))
    nodes, links = tree.minimal_subtree(picked)
    want_nodes = set(picked)
    want_links = set()
    for a, b in itertools.combinations(picked, 2):
        path = tree.path(a, b)
        want_nodes.update(path)
        want_links.update(link(x, y) for x, y in itertools.pairwise(path))
    if len(picked) == 1 and picked[0] in tree.clients:
        want_nodes.add(tree.clients[picked[0]])
        want_links.add(link(picked[0], tree.clients[picked[0]]))
    assert nodes == want_nodes
    assert links == want_links


def test_neighbour_subtrees_partition_everything_but_the_broker_and_its_clients(
    small: Tree,
) -> None:
    parts = small.neighbour_subtrees("b")
    assert parts == {"a": {"a", "x"}, "c": {"c", "d", "y"}, "e": {"e", "z"}}


def test_sides_of_a_link_split_the_tree(small: Tree) -> None:
    left, right = small.sides(("c", "b"))
    assert right == {"b", "a", "e", "x", "z", "w"}
    assert left == {"c", "d", "y"}
    with pytest.raises(TopologyError):
        small.sides(("a", "d"))


# -- changes ----------------------------------------------------------------------------------


def test_a_swap_returns_a_new_tree_and_leaves_the_old_one(small: Tree) -> None:
    moved = small.swap(("b", "c"), ("a", "d"))
    assert ("a", "d") in moved.links
    assert ("b", "c") not in moved.links
    assert ("b", "c") in small.links
    assert moved.clients == small.clients


def test_a_change_that_breaks_the_tree_is_rejected(small: Tree) -> None:
    with pytest.raises(TopologyError) as err:
        small.swap(("b", "e"), ("a", "d"))  # e cut off, cycle a-b-c-d closed
    assert err.value.reason in {"cycle", "disconnected"}
    with pytest.raises(TopologyError) as err:
        small.apply(TopologyChange(remove=(("a", "d"),)))
    assert err.value.reason == "unknown_link"


@given(trees(), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_any_change_between_two_trees_decomposes_into_valid_swaps(tree: Tree, seed: int) -> None:
    rng = random.Random(seed)
    target = random_tree(sorted(tree.brokers), rng, tree.clients)
    change = TopologyChange(
        remove=tuple(tree.links - target.links), add=tuple(target.links - tree.links)
    )
    current = tree
    for remove, add in tree.decompose(change):
        assert current.can_swap(remove, add)
        current = current.swap(remove, add)
    assert current == target == tree.apply(change)


def test_brokers_and_clients_join_and_leave(small: Tree) -> None:
    grown = small.add_broker("f", "d").attach("v", "f")
    assert grown.clients["v"] == "f"
    assert grown.neighbours("f") == {"d"}
    with pytest.raises(TopologyError) as err:
        grown.remove_broker("f")
    assert err.value.reason == "not_a_leaf"
    assert grown.detach("v").remove_broker("f") == small
    with pytest.raises(TopologyError):
        small.remove_broker("b")


@given(trees())
@settings(max_examples=30, deadline=None)
def test_json_round_trip_preserves_the_tree(tree: Tree) -> None:
    assert Tree.from_dict(json.loads(json.dumps(tree.to_dict()))) == tree


def test_malformed_json_is_rejected() -> None:
    with pytest.raises(TopologyError):
        Tree.from_dict({"brokers": ["a", "b"], "links": [["a"]]})
    with pytest.raises(TopologyError):
        Tree.from_dict({"brokers": "ab"})
    with pytest.raises(TopologyError):
        TopologyChange.from_dict({"add": [["a", 1]]})
    change = TopologyChange(remove=(("b", "a"),), add=(("c", "a"),))
    assert TopologyChange.from_dict(json.loads(json.dumps(change.to_dict()))) == change


# -- generators -------------------------------------------------------------------------------


def test_random_trees_cover_all_labelled_trees_uniformly() -> None:
    rng = random.Random(7)
    counts = Counter(random_tree("abcd", rng).links for _ in range(3200))
    assert len(counts) == 16  # Cayley: 4^(4-2)
    assert min(counts.values()) > 120  # expected 200 each


def test_line_and_star_shapes() -> None:
    names = broker_names(5)
    assert names == ["b0", "b1", "b2", "b3", "b4"]
    line = line_tree(names)
    assert line.path("b0", "b4") == names
    star = star_tree(names, centre="b2")
    assert star.neighbours("b2") == set(names) - {"b2"}
    assert broker_names(11)[:2] == ["b00", "b01"]
