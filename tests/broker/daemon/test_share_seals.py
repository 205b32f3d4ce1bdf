"""Where a replica verifies the seals of the key shares it receives.

A share's seal (its splitter's signature over the batch of splits) is what lets a third party
hold the splitter to its split. A replica checks every share's hashes at once, but the seal of
its sender's certificate only where it vouches for it: before it splits the share for a next
VN. A share it only relays to a local subscriber has that seal checked by sample, after the
write; a sender caught with a bad seal is named and checked on every share from then on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.daemon import shares as shares_module
from broker.daemon.config import BrokerConfig
from broker.daemon.hops import VNHop
from broker.daemon.shares import SecureForwarding
from broker.daemon.stats import BrokerStats
from broker.wire.protocol import Publish
from overlay.manifest import Manifest
from overlay.tree import line_tree
from security import propagation
from security.agreement import LOGGED_BLAMES
from security.envelope import (
    Signer,
    generate_signing_key,
    private_key_to_bytes,
    public_key_to_bytes,
)
from security.propagation import ShareRecord, publisher_split, resplit, threshold_for
from security.publication import EpochKey, SecBlock, publication_id

K = threshold_for(3)


class LocalSubscriber:
    """A local client hop: records the SHARES frames it is sent."""

    is_broker = False
    peer_id = None
    closing = False
    congested = False

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, msg: Any) -> None:
        self.sent.append(msg)

    def shares(self) -> int:
        return sum(len(frame.entries) for frame in self.sent)


@dataclasses.dataclass
class Edge:
    """Replica b.0 of the subscriber's edge VN b on the line a - b, and the splitters above."""

    forwarding: SecureForwarding
    signers: dict[str, Signer]
    publisher: Signer
    sec: SecBlock

    def shares_for_b0(self, seq: int) -> dict[str, ShareRecord]:
        """The share each replica of a sends b.0 for publication ``seq``, by sender."""
        top = publisher_split(bytes(32), K, 3, self.publisher, publication_id("pub", seq))
        return {f"a.{i}": resplit(top[i], K, 3, self.signers[f"a.{i}"])[0] for i in range(3)}


def broken_seal(record: ShareRecord) -> ShareRecord:
    cert = record.certs[-1]
    bent = dataclasses.replace(cert, signature=bytes(b ^ 0xFF for b in cert.signature))
    return dataclasses.replace(record, certs=(*record.certs[:-1], bent))


def replica_b0(tmp_path: Path, vns: str) -> tuple[dict[str, Any], BrokerConfig]:
    """Keys of a line of VNs ``vns`` (three replicas each), its manifest, and the config of
    replica b.0, written under ``tmp_path``."""
    keys = {f"{vn}.{i}": generate_signing_key() for vn in vns for i in range(3)}
    manifest = Manifest(
        line_tree(vns),
        {vn: tuple(f"{vn}.{i}" for i in range(3)) for vn in vns},
        {b: public_key_to_bytes(k.public_key()) for b, k in keys.items()},
    )
    manifest.save(tmp_path / "manifest.json")
    (tmp_path / "b.0.key").write_text(private_key_to_bytes(keys["b.0"]).hex())
    config = BrokerConfig(
        id="b.0",
        vn="b",
        replica=0,
        manifest=tmp_path / "manifest.json",
        key_file=tmp_path / "b.0.key",
    )
    return keys, config


@pytest.fixture
def edge(tmp_path: Path) -> Edge:
    keys, config = replica_b0(tmp_path, "ab")
    publisher = Signer("pub", generate_signing_key())
    sec = SecBlock(pk=public_key_to_bytes(publisher.public_key), sig=b"", vn="a", epoch=1)
    return Edge(
        SecureForwarding(config, "b", BrokerStats(), {}),
        {b: Signer(b, k) for b, k in keys.items()},
        publisher,
        sec,
    )


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def relay(edge: Edge, seq: int, records: dict[str, ShareRecord]) -> LocalSubscriber:
    sub = LocalSubscriber()
    sec = dataclasses.replace(edge.sec, epoch=seq)
    edge.forwarding.routed("pub", seq, [sub], sec)
    for sender, record in records.items():
        edge.forwarding.share_arrived("pub", seq, record, sender)
    await turns()
    return sub


async def test_relayed_shares_cost_no_signature_check_unless_sampled(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shares_module, "RELAY_CHECK_ONE_IN", 1 << 60)
    monkeypatch.setattr(propagation, "DEFAULT_SEALS", propagation.SealCache())
    cache = propagation.DEFAULT_SEALS
    for seq in (1, 2, 3):
        sub = await relay(edge, seq, edge.shares_for_b0(seq))
        assert sub.shares() == 3
    assert cache.verified == 0
    assert edge.forwarding.stats.blamed == {}


async def test_a_sampled_bad_seal_names_its_sender_which_is_then_checked_every_time(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shares_module, "RELAY_CHECK_ONE_IN", 1)
    records = edge.shares_for_b0(1)
    records["a.1"] = broken_seal(records["a.1"])
    sub = await relay(edge, 1, records)
    assert sub.shares() == 3  # checked after the write: this one went out
    assert edge.forwarding.stats.blamed == {"a.1": 1}
    assert "a.1" in edge.forwarding.distrusted

    # From now on a.1's shares are checked before they are relayed, sampled or not.
    monkeypatch.setattr(shares_module, "RELAY_CHECK_ONE_IN", 1 << 60)
    records = edge.shares_for_b0(2)
    records["a.1"] = broken_seal(records["a.1"])
    sub = await relay(edge, 2, records)
    assert sub.shares() == 2
    assert edge.forwarding.stats.blamed == {"a.1": 2}
    good = edge.shares_for_b0(3)
    sub = await relay(edge, 3, good)
    assert sub.shares() == 3


async def test_honest_senders_are_never_named_however_often_they_are_checked(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shares_module, "RELAY_CHECK_ONE_IN", 1)
    for seq in range(1, 6):
        sub = await relay(edge, seq, edge.shares_for_b0(seq))
        assert sub.shares() == 3
    assert edge.forwarding.stats.blamed == {}
    assert edge.forwarding.distrusted == set()


class BrokerLink:
    """A link to one replica of the next VN: records the SHARES frames written to it."""

    is_broker = True
    closing = False
    congested = False

    def __init__(self, peer: str) -> None:
        self.peer_id = peer
        self.sent: list[Any] = []

    def send(self, msg: Any) -> None:
        self.sent.append(msg)

    def epochs(self) -> list[int]:
        """The epoch of every share entry sent, frame by frame."""
        return [entry[1] for frame in self.sent for entry in frame.entries]


@pytest.fixture
def middle(tmp_path: Path) -> tuple[SecureForwarding, dict[str, Signer], Signer, Any, Any]:
    """Replica b.0 of the middle VN of a - b - c, with links to c's three replicas."""
    keys, config = replica_b0(tmp_path, "abc")
    neighbours: Any = {f"c.{i}": SimpleNamespace(replica=i) for i in range(3)}
    forwarding = SecureForwarding(config, "b", BrokerStats(), neighbours)
    hop = VNHop("c", 3)
    for i in range(3):
        hop.members[f"c.{i}"] = BrokerLink(f"c.{i}")  # type: ignore[assignment]
    publisher = Signer("pub", generate_signing_key())
    return forwarding, {b: Signer(b, k) for b, k in keys.items()}, publisher, hop, None


def shares_for(signers: dict[str, Signer], publisher: Signer, seq: int) -> dict[str, ShareRecord]:
    top = publisher_split(bytes(32), K, 3, publisher, publication_id("pub", seq))
    return {f"a.{i}": resplit(top[i], K, 3, signers[f"a.{i}"])[0] for i in range(3)}


def sec_for(publisher: Signer, seq: int) -> SecBlock:
    return SecBlock(pk=public_key_to_bytes(publisher.public_key), sig=b"", vn="a", epoch=seq)


async def first_shares_then_the_last(
    forwarding: SecureForwarding, signers: dict[str, Signer], publisher: Signer, hop: Any
) -> None:
    """Epoch 1's shares from a.0 and a.1 in one pass, then a.2's in a pass of its own."""
    forwarding.routed("pub", 1, [hop], sec_for(publisher, 1))
    records = shares_for(signers, publisher, 1)
    for sender in ("a.0", "a.1"):
        forwarding.share_arrived("pub", 1, records[sender], sender)
    await turns()
    forwarding.share_arrived("pub", 1, records["a.2"], "a.2")
    await turns()


async def test_the_last_upstream_share_is_split_later_and_joins_the_next_write(
    middle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All but one of the shares VN a sends are split at once (they suffice for the key);
    the last one waits for the next pass that writes to VN c anyway, or for its timer."""
    forwarding, signers, publisher, hop, _ = middle
    monkeypatch.setattr(shares_module, "SPARE_DELAY", 30.0)
    await first_shares_then_the_last(forwarding, signers, publisher, hop)
    link = hop.members["c.0"]
    assert link.epochs() == [1, 1]
    assert len(link.sent) == 1
    forwarding.routed("pub", 2, [hop], sec_for(publisher, 2))
    records = shares_for(signers, publisher, 2)
    for sender in ("a.0", "a.1"):
        forwarding.share_arrived("pub", 2, records[sender], sender)
    await turns()
    assert len(link.sent) == 2
    assert sorted(entry[1] for entry in link.sent[1].entries) == [1, 2, 2]
    assert forwarding.batch is not None
    assert forwarding.batch.signatures == 2  # the spare shared the second pass's seal


async def test_a_spare_split_is_sent_by_its_timer_when_nothing_else_is_written(
    middle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    forwarding, signers, publisher, hop, _ = middle
    monkeypatch.setattr(shares_module, "SPARE_DELAY", 0.02)
    await first_shares_then_the_last(forwarding, signers, publisher, hop)
    assert [len(hop.members[f"c.{i}"].epochs()) for i in range(3)] == [2, 2, 2]
    await asyncio.sleep(0.1)
    assert [len(hop.members[f"c.{i}"].epochs()) for i in range(3)] == [3, 3, 3]


def test_a_publish_whose_signature_fails_is_refused_and_counted(tmp_path: Path) -> None:
    _, config = replica_b0(tmp_path, "b")
    forwarding = SecureForwarding(config, "b", BrokerStats(), {})
    publisher = Signer("pub", generate_signing_key())
    epoch = EpochKey.start(publisher, 4, "b", 3)
    epoch.seal(publisher, 4, {"class": "q"}, b"first")  # opens the epoch
    sealed, sec = epoch.seal(publisher, 5, {"class": "q"}, b"second")
    assert forwarding.check_publish("pub", Publish(1, 5, {"class": "q"}, sealed, sec)) is None
    bent = bytes([sealed[0] ^ 1]) + sealed[1:]
    problem = forwarding.check_publish("pub", Publish(2, 5, {"class": "q"}, bent, sec))
    assert problem == "the publisher signature does not verify"
    assert forwarding.stats.bad_signatures == 1


async def test_a_sender_of_endless_bad_shares_for_one_epoch_leaves_no_blames_behind(
    edge: Edge, caplog: pytest.LogCaptureFixture
) -> None:
    """Each bad share is blamed as it comes (counted, and in the traffic log); the epoch's
    inbox kept every blame too, for as long as the epoch, and each was a line in the
    broker's log, so a Byzantine sender repeating bad shares for one publication grew both
    without bound. The log now gets a culprit's first ``LOGGED_BLAMES``."""
    records = edge.shares_for_b0(1)
    sub = await relay(edge, 1, records)
    assert sub.shares() == 3
    with caplog.at_level(logging.WARNING, logger=shares_module.log.name):
        for _ in range(500):  # a.0's share, sent again by a.1, who did not split it
            edge.forwarding.share_arrived("pub", 1, records["a.0"], "a.1")
        await turns()
    assert edge.forwarding.stats.blamed == {"a.1": 500}
    inboxes = edge.forwarding.inboxes[("pub", 1)].values()
    assert sum(len(inbox.blames) for inbox in inboxes) == 0
    logged = [r for r in caplog.records if "rejected: a.1" in r.getMessage()]
    assert len(logged) == LOGGED_BLAMES
    assert "(100 blamed on a.1 so far)" in logged[-1].getMessage()


async def test_a_sender_of_endless_malformed_shares_is_counted_each_time_and_logged_a_hundred(
    edge: Edge, caplog: pytest.LogCaptureFixture
) -> None:
    """Junk where a share belongs is counted and in the traffic log each time; the broker's
    log got a line for each (until 2026-12-02), now the sender's first ``LOGGED_BLAMES``."""
    with caplog.at_level(logging.WARNING, logger=shares_module.log.name):
        for _ in range(500):
            edge.forwarding.share_arrived("pub", 1, b"junk", "a.1")
    assert edge.forwarding.stats.bad_shares == 500
    logged = [r for r in caplog.records if "malformed share of pub/1 from a.1" in r.getMessage()]
    assert len(logged) == LOGGED_BLAMES
