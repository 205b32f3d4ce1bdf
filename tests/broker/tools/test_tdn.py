"""The TDN's protocol handler in-process (no sockets): what it answers, what it refuses."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from broker.errors import InvalidRequest
from broker.tools.tdn import TdnConfig, TopicDiscoveryNode, load_trusted
from broker.tools.tdn_wire import (
    REPLY_CLASS,
    TDN_CLASS,
    TOPICS_CLASS,
    error_from_wire,
    open_answer,
)
from security.envelope import Signer, public_key_to_bytes
from security.topics import TopicAdvertisement, issue_advertisement, make_request
from security.topics_channel import ReplyKey, sign_request
from security.topics_hierarchy import MaxWidthExceeded

TDN = Signer.generate("tdn-1")
OTHER = Signer.generate("tdn-2")
TRUSTED = {s.id: public_key_to_bytes(s.public_key) for s in (TDN, OTHER)}


def ask(node: TopicDiscoveryNode, signer: Signer, op: str, **args: Any) -> dict[str, Any]:
    """Send one request to the node; the body of its answer (opened and verified)."""
    key = ReplyKey()
    body = {"op": op, "rid": os.urandom(4).hex(), "time": time.time(), "reply": key.public, **args}
    node.handle({"class": TDN_CLASS, "from": signer.id}, sign_request(signer, body), time.time())
    sent = [node.outbox.get_nowait() for _ in range(node.outbox.qsize())]
    (attrs, payload), *others = [m for m in sent if m[0]["class"] == REPLY_CLASS]
    assert attrs["to"] == signer.id
    assert not others
    for item in sent:  # notifications stay queued for the test to read
        if item[0]["class"] != REPLY_CLASS:
            node.outbox.put_nowait(item)
    signer_id, signer_key, answer, _certificate = open_answer(key, payload)
    assert (signer_id, signer_key) == ("tdn-1", TRUSTED["tdn-1"])
    return answer


def test_the_tdn_creates_once_per_request_and_refuses_requests_sent_by_another_key() -> None:
    node = TopicDiscoveryNode(TDN, TRUSTED)
    alice, mallory = Signer.generate("alice"), Signer.generate("mallory")
    req = make_request(alice, "t", nonce=os.urandom(16), now=time.time(), lifetime=60)
    first = ask(node, alice, "create", request=req.to_wire())
    again = ask(node, alice, "create", request=req.to_wire())  # a replayed request
    assert first["ok"]
    assert again["result"] == first["result"]
    assert len(node.topics) == 1
    stolen = ask(node, mallory, "create", request=req.to_wire())
    assert not stolen["ok"]
    assert "must be sent by the key that creates" in stolen["error"]["message"]


def test_refusals_keep_their_class_and_data_across_the_wire() -> None:
    from security.topics import HierarchySpec

    node = TopicDiscoveryNode(TDN, TRUSTED)
    alice = Signer.generate("alice")

    def create(**kw: Any) -> dict[str, Any]:
        req = make_request(alice, "t", nonce=os.urandom(16), now=time.time(), lifetime=60, **kw)
        return ask(node, alice, "create", request=req.to_wire())

    root = create(hierarchy=HierarchySpec(root=True, allow_children=True, max_width=0))
    uuid = TopicAdvertisement.from_wire(root["result"]["ad"]).uuid
    refused = create(hierarchy=HierarchySpec(parent=uuid))
    exc = error_from_wire(refused["error"])
    assert isinstance(exc, MaxWidthExceeded)
    assert (exc.limit, exc.children, exc.topic) == (0, 0, uuid)


def test_disseminated_advertisements_are_held_only_when_a_trusted_tdn_signed_them() -> None:
    node = TopicDiscoveryNode(TDN, TRUSTED)
    alice = Signer.generate("alice")
    now = time.time()
    req = make_request(alice, "t", nonce=os.urandom(16), now=now, lifetime=60)
    good = issue_advertisement(OTHER, req, uuid="u-1", now=now, depth=0, expires=now + 60)
    forged = issue_advertisement(
        Signer.generate("tdn-2"), req, uuid="u-2", now=now, depth=0, expires=now + 60
    )
    mallory = Signer.generate("mallory")
    claim_req = make_request(mallory, "mine", nonce=os.urandom(16), now=now, lifetime=60)
    claim = issue_advertisement(OTHER, claim_req, uuid="u-1", now=now, depth=0, expires=now + 60)
    for ad in (good, forged, claim):
        node.handle({"class": TOPICS_CLASS}, msgpack.packb(ad.to_wire()), now)
    node.handle({"class": TOPICS_CLASS}, b"\x93garbage", now)
    assert [ad.uuid for ad in node.topics] == ["u-1"]
    assert node.topics.get("u-1") == good
    assert node.stats.errors == {"AdvertisementError": 2, "InvalidRequest": 1}


def test_the_config_names_the_file_and_the_key_it_cannot_use(tmp_path: Path) -> None:
    path = tmp_path / "tdn.toml"
    path.write_text(
        '[tdn]\nendpoint = "127.0.0.1:1"\nidentity = "a.json"\ntrusted = "t.json"\ncolour = 1\n'
    )
    with pytest.raises(InvalidRequest, match="unknown key 'colour'"):
        TdnConfig.load(path)
    path.write_text('[tdn]\nendpoint = "127.0.0.1:1"\nidentity = "a.json"\n')
    with pytest.raises(InvalidRequest, match="trusted is required"):
        TdnConfig.load(path)
    path.write_text('[tdn]\nendpoint = "127.0.0.1:1"\nidentity = "a.json"\ntrusted = "t.json"\n')
    config = TdnConfig.load(path)
    assert config.trusted == tmp_path / "t.json"
    (tmp_path / "t.json").write_text('{"tdn-1": "abcd"}')
    with pytest.raises(InvalidRequest, match="not 32 bytes"):
        load_trusted(tmp_path / "t.json")


def test_malformed_collection_requests_get_an_answer_naming_the_problem() -> None:
    node = TopicDiscoveryNode(TDN, TRUSTED)
    alice = Signer.generate("alice")
    bad = ask(node, alice, "collection.create", name="c", limits=[1, 2])
    assert "max_breadth, max_depth, max_topics, fixed" in bad["error"]["message"]
    bad = ask(node, alice, "collection.create", name="c", editors="bob")
    assert "editors must be a list" in bad["error"]["message"]
    bad = ask(node, alice, "query", query=["regex", "("])
    assert "bad regular expression" in bad["error"]["message"]
    made = ask(node, alice, "collection.create", name="c", limits=[2, 1, 10, False])
    assert made["ok"]


def test_hierarchy_watchers_must_be_able_to_discover_and_hear_of_children_they_may_see() -> None:
    from security.topics import HierarchySpec

    node = TopicDiscoveryNode(TDN, TRUSTED)
    alice, bob, carol = (Signer.generate(n) for n in ("alice", "bob", "carol"))
    bob_p = public_key_to_bytes(bob.public_key).hex()

    def create(lifetime: float = 30, **kw: Any) -> str:
        req = make_request(
            alice, "t", nonce=os.urandom(16), now=time.time(), lifetime=lifetime, **kw
        )
        answer = ask(node, alice, "create", request=req.to_wire())
        return TopicAdvertisement.from_wire(answer["result"]["ad"]).uuid

    root = create(60, hierarchy=HierarchySpec(root=True, allow_children=True), discoverers=[bob_p])
    refused = ask(node, carol, "watch", topic=root)
    assert "nothing to watch" in refused["error"]["message"]
    assert ask(node, bob, "watch", topic=root)["ok"]
    child = create(hierarchy=HierarchySpec(parent=root))
    attrs, _ = node.outbox.get_nowait()  # the notification to bob
    assert (attrs["to"], attrs["subject"]) == ("bob", root)
    hidden = create(hierarchy=HierarchySpec(parent=root, registrars=None), discoverers=[])
    assert node.outbox.empty()  # bob may not discover that child: he hears nothing of it
    assert child != hidden
