"""What a broker keeps of other brokers' link-state announcements (``LINKSTATE``)."""

from __future__ import annotations

import pytest

from broker.daemon import links
from broker.daemon.links import LinkStates
from broker.wire.protocol import LinkState


def test_announcements_under_ever_new_ids_are_not_kept_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica announcing under a new broker id in every frame grew every broker's table
    (and was flooded on) without bound until 2026-11-29; known brokers still update."""
    monkeypatch.setattr(links, "MAX_STATES", 10)
    states = LinkStates("b1", "b1")
    assert states.learn(LinkState("b0", "b0", 1, ["b1"]))
    for n in range(100):
        states.learn(LinkState(f"ghost-{n}", "g", 1, []))
    assert len(states.states) == 10
    assert states.learn(LinkState("b0", "b0", 2, ["b1", "b2"]))  # known: still news
    assert states.states["b0"][2] == frozenset({"b1", "b2"})


def test_an_announcement_naming_too_many_neighbours_is_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(links, "MAX_NEIGHBOURS", 3)
    states = LinkStates("b1", "b1")
    assert not states.learn(LinkState("b0", "b0", 1, ["a", "b", "c", "d"]))
    assert states.learn(LinkState("b0", "b0", 1, ["a", "b", "c"]))
