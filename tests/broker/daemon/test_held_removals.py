"""A removal of an advertisement waits for the publications its VN still owes
(:meth:`broker.daemon.forwarding.Forwarder.after_undecided`), in memory.

A VN's majority for the removal may include a replica that never had the publications (a
Byzantine one, or one the publisher had not reached): applied before they are agreed, the
removal would travel on ahead of them and withdraw their route.
"""

from __future__ import annotations

import time
from typing import Any, cast

from broker.daemon.forwarding import Forwarder
from broker.daemon.hops import Hop, VNHop
from broker.daemon.stats import BrokerStats
from broker.language.grammar import parse_filter
from broker.routing.router import Router
from broker.wire.protocol import Deliver, Forward, decode_body


class Subscriber:
    """A local client hop that records what it is delivered, and when."""

    is_broker = False
    peer_id = "sub"
    closing = False
    congested = False

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def deliver_raw(self, data: bytes) -> None:
        msg = decode_body(data[4:])  # past the length prefix
        assert isinstance(msg, Deliver)
        self.events.append(f"deliver {msg.seq}")

    def note_dropped(self, keys: list[str]) -> None:
        raise AssertionError("nothing is dropped here")


def forwarder_with_subscriber(events: list[str]) -> tuple[Forwarder, VNHop]:
    router: Router[Hop] = Router("b1")
    upstream = VNHop("b0", 3)
    router.subscribe(cast(Hop, Subscriber(events)), "s1", parse_filter("class = 'x'"))
    forwarder = Forwarder(router, BrokerStats(), cast(Any, None), patience=1.0)
    return forwarder, upstream


def copy(seq: int) -> Forward:
    return Forward("p", seq, {"class": "x"}, b"payload")


def test_a_removal_waits_until_the_publications_waiting_for_agreement_are_routed() -> None:
    events: list[str] = []
    forwarder, b0 = forwarder_with_subscriber(events)
    forwarder.forward(b0, "b0.0", copy(1))
    forwarder.forward(b0, "b0.0", copy(2))  # the fast replica's copies: one each, undecided
    forwarder.after_undecided("b0", lambda: events.append("removed"), time.monotonic())
    assert events == []
    forwarder.forward(b0, "b0.1", copy(1))
    assert events == ["deliver 1"]
    forwarder.forward(b0, "b0.1", copy(2))
    assert events == ["deliver 1", "deliver 2", "removed"]


def test_a_removal_waits_at_most_the_copy_patience() -> None:
    events: list[str] = []
    forwarder, b0 = forwarder_with_subscriber(events)
    forwarder.forward(b0, "b0.2", copy(7))  # a Byzantine replica's copy alone: never agreed
    now = time.monotonic()
    forwarder.after_undecided("b0", lambda: events.append("removed"), now)
    forwarder.tick(now + 0.5)
    assert events == []
    forwarder.tick(now + 1.0)
    assert events == ["removed"]


def test_a_removal_with_nothing_undecided_from_its_vn_applies_at_once() -> None:
    events: list[str] = []
    forwarder, b0 = forwarder_with_subscriber(events)
    forwarder.forward(b0, "b0.0", copy(1))
    forwarder.forward(b0, "b0.1", copy(1))
    forwarder.forward(VNHop("b2", 3), "b2.0", Forward("q", 1, {"class": "x"}, b""))
    forwarder.after_undecided("b0", lambda: events.append("removed"), time.monotonic())
    assert events == ["deliver 1", "removed"]  # b2's undecided copy does not hold b0's removal
