"""Copies and key shares blamed on a replica are all counted, and logged without flooding
the log (:func:`security.agreement.worth_logging`), in a broker and in the SDK, in memory."""

from __future__ import annotations

import logging

import pytest

from broker.client import Client, _Link
from broker.daemon import forwarding
from broker.wire.protocol import Forward, Share
from security.agreement import ALTERED, LOGGED_BLAMES, Blame
from tests.broker.daemon.test_held_removals import copy, forwarder_with_subscriber


def test_a_replica_altering_every_copy_is_counted_each_time_and_logged_a_hundred_times(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """b0.2 alters every copy: each is blamed (``trellis_copy_blame_total``), but the log
    gets its first ``LOGGED_BLAMES`` (it got a line per publication at every replica below
    until 2026-12-02), and the publications are delivered from the honest copies."""
    events: list[str] = []
    forwarder, b0 = forwarder_with_subscriber(events)
    with caplog.at_level(logging.WARNING, logger=forwarding.log.name):
        for seq in range(1, 501):
            forwarder.forward(b0, "b0.2", Forward("p", seq, {"class": "x"}, b"altered"))
            forwarder.forward(b0, "b0.0", copy(seq))
            forwarder.forward(b0, "b0.1", copy(seq))
    assert events == [f"deliver {seq}" for seq in range(1, 501)]
    assert forwarder.stats.copy_blamed == {("b0.2", ALTERED): 500}
    logged = [r.getMessage() for r in caplog.records if "from b0.2" in r.getMessage()]
    assert len(logged) == LOGGED_BLAMES
    assert logged[-1].endswith(f"({LOGGED_BLAMES} blamed on b0.2 so far)")


def test_the_sdk_counts_every_altered_copy_and_logs_a_hundred(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    with caplog.at_level(logging.WARNING, logger="trellis.client"):
        client._blame_copies([Blame(2, seq, ALTERED) for seq in range(1, 20_001)])
    assert client.copy_blames == {"replica #2": 20_000}
    logged = [r.getMessage() for r in caplog.records if "replica #2" in r.getMessage()]
    assert len(logged) == LOGGED_BLAMES + 2  # and the 10,000th and the 20,000th


def test_the_sdk_names_a_replica_whose_shares_are_bad_every_epoch_and_logs_a_hundred(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An equivocating replica's shares are bad in every epoch: the subscriber logged a line
    per publication (until 2026-12-02); now a culprit's first ``LOGGED_BLAMES`` epochs, and
    :meth:`Client.share_culprits` names it whatever was logged."""
    client = Client(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    with caplog.at_level(logging.WARNING, logger="trellis.client"):
        for seq in range(1, 501):
            assembly = client._assembly("pub", seq)
            assembly.report(frozenset({"b1.0"}))
            assembly.report(frozenset({"b1.0"}))  # the audit finds it again: counted once
    assert client._share_blames.counts == {"b1.0": 500}
    assert client.share_culprits() == {"b1.0"}
    logged = [r.getMessage() for r in caplog.records if "bad shares from b1.0" in r.getMessage()]
    assert len(logged) == LOGGED_BLAMES
    assert logged[-1].endswith(f"(epochs blamed so far: b1.0 {LOGGED_BLAMES})")


async def test_the_sdk_logs_a_hundred_of_a_brokers_malformed_shares_and_counts_them_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker sending junk where key shares belong put a line per frame in the client's
    log (until 2026-12-02); now its first ``LOGGED_BLAMES`` and every 10,000th."""
    client = Client(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    link = _Link(client, 0)
    link.broker_id = "b0.0"
    with caplog.at_level(logging.WARNING, logger="trellis.client"):
        for _ in range(500):
            client._share_arrived(link, Share("pub", 1, b"junk"))
    logged = [r.getMessage() for r in caplog.records if "malformed key share" in r.getMessage()]
    assert len(logged) == LOGGED_BLAMES
    assert logged[-1].endswith(f"({LOGGED_BLAMES} such from b0.0)")
    assert client._warned.counts == {"b0.0": 500}
