"""Wave-3 vouches kept during a round: only tables some master replica's latest vouch names.

A replica of the master VN vouches for each other member's new tables over its broker link
(:mod:`broker.daemon.reconfig_agent`); a member keeps the tables under their digest until
``f + 1`` replicas vouched for the same. A Byzantine replica vouching again and again with
other tables (each up to a frame) made a member keep every one of them for the round (up to
three leases). Now a replica's new vouch replaces its own, and tables nobody's latest vouch
names go.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from broker.daemon.config import ReconfigConfig
from broker.daemon.reconfig_agent import VOUCH, Neighbourhood, ReconfigAgent
from reconfig.live import Pending, tables_digest


def _vouch(agent: ReconfigAgent, sender: str, n: int) -> str:
    held: dict[str, Any] = {"b0": {"adv": {}, "sub": {f"k{n}": ["filter", n]}}}
    sent: dict[str, Any] = {"b0": {}}
    digest = tables_digest("r1", held, sent)
    data = {"round": "r1", "wave": VOUCH, "digest": digest, "held": held, "sent": sent}
    agent.marker(sender, data)
    return digest


def test_a_replica_vouching_again_and_again_keeps_only_its_latest_tables() -> None:
    hood = cast(Neighbourhood, SimpleNamespace(broker_id="b2.0"))
    agent = ReconfigAgent(hood, ReconfigConfig())
    agent.member.pending = Pending("r1", "b1", {"b0", "b1", "b2"}, set(), set(), set())
    honest = _vouch(agent, "b1.0", 0)
    assert _vouch(agent, "b1.1", 0) == honest
    for n in range(1, 500):
        latest = _vouch(agent, "b1.2", n)
    assert set(agent._vouched["r1"]) == {honest, latest}
    # the honest replicas change their vouch: the old tables go once nobody names them
    newer = _vouch(agent, "b1.0", 1000)
    assert set(agent._vouched["r1"]) == {honest, latest, newer}
    _vouch(agent, "b1.1", 1000)
    assert set(agent._vouched["r1"]) == {latest, newer}
