"""The sans-I/O router: advertisement flooding, subscription forwarding, covering."""

from __future__ import annotations

from dataclasses import dataclass

from broker.language.grammar import parse_filter
from broker.routing.router import Router
from broker.wire.protocol import Advertise, Subscribe, Unadvertise, Unsubscribe


@dataclass(eq=False)
class Hop:
    peer_id: str
    is_broker: bool

    def __repr__(self) -> str:
        return self.peer_id


def setup() -> tuple[Router[Hop], Hop, Hop, Hop]:
    router: Router[Hop] = Router("B")
    left, right = Hop("L", True), Hop("R", True)
    client = Hop("c", False)
    router.add_neighbour(left)
    router.add_neighbour(right)
    return router, left, right, client


def sent(actions, hop, kind) -> list[str]:
    return [
        m.adv_id if isinstance(m, Advertise | Unadvertise) else m.sub_id
        for h, m in actions
        if h is hop and isinstance(m, kind)
    ]


def test_client_advertisement_floods_to_every_neighbour_with_a_global_key() -> None:
    router, left, right, client = setup()
    actions = router.advertise(client, "a1", parse_filter("class = 'x'"))
    assert sent(actions, left, Advertise) == ["B/c/a1"]
    assert sent(actions, right, Advertise) == ["B/c/a1"]


def test_advertisement_from_a_neighbour_is_not_sent_back() -> None:
    router, left, right, _ = setup()
    actions = router.advertise(left, "L/p/a1", parse_filter("class = 'x'"))
    assert sent(actions, left, Advertise) == []
    assert sent(actions, right, Advertise) == ["L/p/a1"]


def test_subscription_goes_only_toward_intersecting_advertisements() -> None:
    router, left, right, client = setup()
    router.advertise(left, "L/p/a", parse_filter("class = 'x'"))
    router.advertise(right, "R/p/a", parse_filter("class = 'y'"))
    actions = router.subscribe(client, "s", parse_filter("class = 'x' and n > 1"))
    assert sent(actions, left, Subscribe) == ["B/c/s"]
    assert sent(actions, right, Subscribe) == []


def test_subscription_made_before_the_advertisement_is_forwarded_when_it_arrives() -> None:
    router, left, _, client = setup()
    assert router.subscribe(client, "s", parse_filter("class = 'x'")) == []
    actions = router.advertise(left, "L/p/a", parse_filter("class = 'x'"))
    assert sent(actions, left, Subscribe) == ["B/c/s"]


def test_covered_subscription_is_not_forwarded_until_its_coverer_leaves() -> None:
    router, left, _, client = setup()
    router.advertise(left, "L/p/a", parse_filter("class = 'x'"))
    assert sent(router.subscribe(client, "wide", parse_filter("class = 'x'")), left, Subscribe)
    narrow = router.subscribe(client, "narrow", parse_filter("class = 'x' and n < 5"))
    assert narrow == []
    actions = router.unsubscribe(client, "wide")
    assert sent(actions, left, Unsubscribe) == ["B/c/wide"]
    assert sent(actions, left, Subscribe) == ["B/c/narrow"]


def test_forwarding_a_coverer_retracts_what_it_covers() -> None:
    router, left, _, client = setup()
    router.advertise(left, "L/p/a", parse_filter("class = 'x'"))
    router.subscribe(client, "narrow", parse_filter("class = 'x' and n < 5"))
    actions = router.subscribe(client, "wide", parse_filter("class = 'x'"))
    assert sent(actions, left, Subscribe) == ["B/c/wide"]
    assert sent(actions, left, Unsubscribe) == ["B/c/narrow"]
    assert set(router.forwarded_to(left)) == {"B/c/wide"}


def test_publication_is_routed_to_matching_subscriptions_but_never_back() -> None:
    router, left, right, client = setup()
    router.subscribe(left, "L/q/s", parse_filter("class = 'x'"))
    router.subscribe(right, "R/q/s", parse_filter("class = 'x'"))
    router.subscribe(client, "s", parse_filter("class = 'x' and n > 3"))
    targets = router.route({"class": "x", "n": 1}, left)
    assert set(targets) == {right}
    targets = router.route({"class": "x", "n": 9}, client)
    assert set(targets) == {left, right, client}


def test_losing_a_neighbour_withdraws_what_was_learned_through_it() -> None:
    router, left, right, client = setup()
    router.advertise(left, "L/p/a", parse_filter("class = 'x'"))
    router.subscribe(left, "L/q/s", parse_filter("class = 'x'"))
    actions = router.remove_hop(left)
    assert sent(actions, right, Unadvertise) == ["L/p/a"]
    assert router.srt_size == 0
    assert router.prt_size == 0
    assert router.route({"class": "x"}, client) == {}


def test_unadvertise_retracts_subscriptions_nothing_there_needs() -> None:
    router, left, _, client = setup()
    router.advertise(left, "L/p/a", parse_filter("class = 'x'"))
    router.subscribe(client, "s", parse_filter("class = 'x'"))
    actions = router.unadvertise(left, "L/p/a")
    assert sent(actions, left, Unsubscribe) == ["B/c/s"]
