"""The routing hand-over of a live reconfiguration, on routers wired in memory.

A network of real :class:`Router` objects exchanges its control messages through a queue. The
overlay is a master with neighbours, each neighbour with a subtree of its own; clients
advertise and subscribe at random brokers. The master computes what each link of a new
neighbourhood tree carries (:func:`hood_routing`), every member installs it
(:meth:`Router.install_hood`), and the outcome must route exactly like a network that ran the
protocol on the new tree from scratch: every publication reaches every matching subscriber
once, and nobody else.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.language.grammar import parse_filter
from broker.routing.router import Router, hood_routing, reduce_covered
from broker.wire.protocol import Advertise, Subscribe, Unadvertise, Unsubscribe
from overlay.tree import Tree, random_tree


@dataclass(frozen=True)
class Hop:
    peer_id: str
    is_broker: bool


_HOPS: dict[tuple[str, bool], Hop] = {}


def hop_of(peer_id: str, is_broker: bool = True) -> Hop:
    """One object per peer, as the broker keeps one hop per neighbour VN (the router tells
    hops apart by identity)."""
    return _HOPS.setdefault((peer_id, is_broker), Hop(peer_id, is_broker))


class Network:
    """Routers joined by the links of ``tree``, messages delivered in FIFO order."""

    def __init__(self, tree: Tree, covering: bool) -> None:
        self.routers: dict[str, Router[Hop]] = {
            b: Router(b, covering=covering) for b in tree.brokers
        }
        self.queue: deque[tuple[str, str, Any]] = deque()
        for a, b in sorted(tree.links):
            self.run(a, self.routers[a].add_neighbour(hop_of(b)))
            self.run(b, self.routers[b].add_neighbour(hop_of(a)))

    def run(self, sender: str, actions: list[tuple[Hop, Any]]) -> None:
        for hop, msg in actions:
            if hop.is_broker:
                self.queue.append((sender, hop.peer_id, msg))
        while self.queue:
            src, dst, msg = self.queue.popleft()
            router, hop = self.routers[dst], hop_of(src)
            match msg:
                case Advertise(_, key, flt):
                    out = router.advertise(hop, key, flt)
                case Unadvertise(_, key):
                    out = router.unadvertise(hop, key)
                case Subscribe(_, key, flt):
                    out = router.subscribe(hop, key, flt)
                case Unsubscribe(_, key):
                    out = router.unsubscribe(hop, key)
            for h, m in out:
                if h.is_broker:
                    self.queue.append((dst, h.peer_id, m))

    def client(self, broker: str, client: str, kind: str, key: str, text: str) -> None:
        router = self.routers[broker]
        act = router.advertise if kind == "adv" else router.subscribe
        self.run(broker, act(hop_of(client, False), key, parse_filter(text)))

    def deliveries(self, broker: str, client: str, attrs: dict[str, Any]) -> list[str]:
        """Clients a publication from ``client`` at ``broker`` reaches (with repeats)."""
        got: list[str] = []
        frontier = [(broker, hop_of(client, False))]
        hops = 0
        while frontier:
            at, source = frontier.pop()
            hops += 1
            assert hops < 10_000, "publication loops"
            for hop in self.routers[at].route(attrs, source):
                if hop.is_broker:
                    frontier.append((hop.peer_id, hop_of(at)))
                else:
                    got.append(f"{at}/{hop.peer_id}")
        return got


def build(seed: int) -> tuple[Tree, Tree, list[tuple[str, ...]], random.Random]:
    """A random overlay, a master with at least two neighbours, and a new local tree."""
    rng = random.Random(seed)
    brokers = [f"n{i}" for i in range(rng.randint(4, 10))]
    tree = random_tree(brokers, rng)
    master = max(brokers, key=lambda b: (len(tree.neighbours(b)), b))
    hood = sorted({master} | tree.neighbours(master))
    local = random_tree(hood, rng)
    star = {tuple(sorted((master, n))) for n in tree.neighbours(master)}
    new = Tree(tree.brokers, (set(tree.links) - star) | set(local.links))
    workload = []
    for c in range(rng.randint(2, 10)):
        broker = rng.choice(brokers)
        topic = rng.choice("xyz")
        workload.append((broker, f"c{c}", "adv", f"a{c}", f"class = '{topic}'"))
        for s in range(rng.randint(0, 2)):
            lo = rng.randint(0, 8)
            text = rng.choice(
                [f"class = '{topic}'", f"class = '{topic}' and v >= {lo}", "v < 5", "*"]
            )
            where = rng.choice(brokers)
            workload.append((where, f"c{c}s{s}", "sub", f"s{c}.{s}", text))
    return tree, new, workload, rng


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), covering=st.booleans())
def test_installed_neighbourhood_routes_like_the_new_tree_built_from_scratch(
    seed: int, covering: bool
) -> None:
    tree, new, workload, rng = build(seed)
    master = max(tree.brokers, key=lambda b: (len(tree.neighbours(b)), b))
    hood = {master} | set(tree.neighbours(master))
    live = Network(tree, covering)
    fresh = Network(new, covering)
    for net in (live, fresh):
        for entry in workload:
            net.client(*entry)

    adverts, subs = live.routers[master].owned_entries(master)
    carried = hood_routing(adverts, subs, sorted(_links_within(new, hood)), covering=covering)
    for x in sorted(hood):
        router = live.routers[x]
        new_neighbours = {y for y in new.neighbours(x) if y in hood}
        held = {y: carried[(y, x)] for y in new_neighbours}
        sent = {y: carried[(x, y)][1] for y in new_neighbours}
        hops = {y: hop_of(y) for y in new_neighbours}
        live.run(x, router.install_hood(hood, hops, held, sent))

    for broker, client, kind, _, text in workload:
        if kind != "adv":
            continue
        topic = text.split("'")[1]  # a publication stays inside its publisher's advertisement
        for attrs in ({"class": topic, "v": v} for v in (0, rng.randint(0, 9), 9)):
            want = sorted(fresh.deliveries(broker, client, attrs))
            got = sorted(live.deliveries(broker, client, attrs))
            assert got == want
            assert len(set(got)) == len(got), "a subscriber got a publication twice"


def _links_within(tree: Tree, nodes: set[str]) -> set[tuple[str, str]]:
    return {lk for lk in tree.links if lk[0] in nodes and lk[1] in nodes}


def test_covering_keeps_coverers_and_drops_what_they_cover_wherever_computed() -> None:
    broad = parse_filter("class = 'x'")
    narrow = parse_filter("class = 'x' and v < 3")
    other = parse_filter("class = 'y'")
    items = [("k2", narrow), ("k1", broad), ("k3", other), ("k0", broad)]
    kept = reduce_covered(items)
    assert kept == {"k0": broad, "k3": other}
    assert reduce_covered(reversed(items)) == kept
