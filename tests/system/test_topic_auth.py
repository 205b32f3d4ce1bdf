"""A broker with secured topics: delegations checked before advertise and subscribe."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from broker.client import Client
from broker.daemon.topic_guard import secured_class
from broker.errors import NotAuthorized, TrellisError
from broker.tools.launcher import BrokerProcess
from security.envelope import Signer, public_key_to_bytes
from security.topics import issue_advertisement, make_request
from security.topics_credentials import present_credentials
from security.topics_delegations import delegate

pytestmark = pytest.mark.slow

TDN = Signer.generate("tdn-1")


def key(s: Signer) -> bytes:
    return public_key_to_bytes(s.public_key)


async def test_only_holders_of_a_valid_delegation_advertise_or_subscribe_a_secured_topic(
    tmp_path: Path, run_broker: Callable[..., BrokerProcess]
) -> None:
    trust = tmp_path / "tdns.json"
    trust.write_text(json.dumps({"tdn-1": key(TDN).hex()}))
    broker = run_broker("b1", topic_trust=str(trust))
    now = time.time()
    alice, bob, carol, dave, eve = (
        Signer.generate(n) for n in ("alice", "bob", "carol", "dave", "eve")
    )
    req = make_request(alice, "orders", nonce=os.urandom(16), now=now, lifetime=600)
    ad = issue_advertisement(TDN, req, uuid="topic-1", now=now, depth=0, expires=now + 600)
    forged_ad = issue_advertisement(
        Signer.generate("tdn-1"), req, uuid="topic-1", now=now, depth=0, expires=now + 600
    )
    topic = f"class = '{secured_class(ad.uuid)}'"

    def client(s: Signer, grants: list[tuple[object, object]] | None) -> Client:
        options = (
            None
            if grants is None
            else {
                "credentials": present_credentials(s, s.id, time.time(), grants)  # type: ignore[arg-type]
            }
        )
        return Client(broker.endpoint, client_id=s.id, hello_options=options)

    expired = delegate(alice, ad, key(dave), "subscribe", now=now - 20, expires=now - 10)
    forged = replace(delegate(alice, ad, key(eve), "subscribe", now=now), expires=now + 9999)
    c_alice = client(alice, [(ad, None)])
    c_bob = client(bob, [(ad, delegate(alice, ad, key(bob), "subscribe", now=now))])
    c_carol = client(carol, None)
    c_dave = client(dave, [(ad, expired)])
    c_eve = client(eve, [(ad, forged)])
    c_mallory = client(Signer.generate("mallory"), [(forged_ad, None)])
    async with c_alice, c_bob, c_carol, c_dave, c_eve, c_mallory:
        await c_alice.advertise(topic)
        async with c_bob.subscribe(topic) as sub, c_carol.subscribe("class = 'stock'") as other:
            for who, flt, why in (
                (c_carol, topic, "needs the topic's advertisement and a delegation"),
                (c_carol, "*", "could match publications of secured topics"),
                (c_carol, "price > 5", "could match publications of secured topics"),
                (c_dave, topic, "expired"),
                (c_eve, topic, "does not verify"),
                (c_mallory, topic, "not a trusted TDN"),
            ):
                with pytest.raises(NotAuthorized, match=why):
                    async with who.subscribe(flt):
                        pass
            with pytest.raises(NotAuthorized, match="grants subscribe, not publish"):
                await c_bob.advertise(topic)
            await c_alice.publish({"class": secured_class(ad.uuid), "n": 1}, b"secret")
            got = await sub.get(5)
            assert got.payload == b"secret"
            await c_carol.flush()  # carol's connection is still open and serving
            with pytest.raises(TrellisError):
                await other.get(0.5)  # and she received nothing of the secured topic

    # a HELLO whose proof of key was made for another client id is refused
    stolen = present_credentials(bob, "bob", time.time(), [])
    with pytest.raises(TrellisError, match="proof of key"):
        async with Client(
            broker.endpoint,
            client_id="not-bob",
            reconnect=False,
            hello_options={"credentials": stolen},
        ):
            pass


async def test_over_tls_the_client_certificate_is_the_proof_of_key_and_must_match_the_grants(
    tmp_path: Path, run_broker: Callable[..., BrokerProcess]
) -> None:
    from security.ca import create_ca, issue, load_private_key, save_ca, write_issued
    from security.topics_identity import save_identity

    trust = tmp_path / "tdns.json"
    trust.write_text(json.dumps({"tdn-1": key(TDN).hex()}))
    pki = tmp_path / "pki"
    ca = create_ca("topics CA")
    save_ca(ca, pki)
    write_issued(issue(ca, "b1", "broker"), ca, pki, "b1")
    alice, bob = Signer.generate("alice"), Signer.generate("bob")
    for who in (alice, bob):
        # one key per entity: the identity file is what the CA certifies
        save_identity(who, tmp_path / f"{who.id}.json")
        own_key = load_private_key(tmp_path / f"{who.id}.json")
        write_issued(issue(ca, who.id, "client", key=own_key), ca, pki, who.id)
    broker = run_broker(
        "b1",
        topic_trust=str(trust),
        tls_ca=str(pki / "ca.crt"),
        tls_cert=str(pki / "b1.crt"),
        tls_key=str(pki / "b1.key"),
    )
    now = time.time()
    req = make_request(alice, "orders", nonce=os.urandom(16), now=now, lifetime=600)
    ad = issue_advertisement(TDN, req, uuid="topic-2", now=now, depth=0, expires=now + 600)
    topic = f"class = '{secured_class(ad.uuid)}'"

    def tls(name: str) -> dict[str, Path]:
        return {"ca": pki / "ca.crt", "cert": pki / f"{name}.crt", "key": pki / f"{name}.key"}

    stale = now - 3600  # a proof this old is refused on plain TCP; the certificate replaces it
    grant = delegate(alice, ad, key(bob), "subscribe", now=now)
    async with (
        Client(
            broker.endpoint,
            client_id="alice",
            hello_options={"credentials": present_credentials(alice, "alice", stale, [(ad, None)])},
            **tls("alice"),  # type: ignore[arg-type]
        ) as c_alice,
        Client(
            broker.endpoint,
            client_id="bob",
            hello_options={"credentials": present_credentials(bob, "bob", stale, [(ad, grant)])},
            **tls("bob"),  # type: ignore[arg-type]
        ) as c_bob,
    ):
        await c_alice.advertise(topic)
        async with c_bob.subscribe(topic) as sub:
            await c_alice.publish({"class": secured_class(ad.uuid), "n": 1}, b"over tls")
            assert (await sub.get(5)).payload == b"over tls"

    # bob's certificate with alice's credentials (her grants, her key): refused
    with pytest.raises(TrellisError, match="another key than its TLS client certificate"):
        async with Client(
            broker.endpoint,
            client_id="bob",
            reconnect=False,
            hello_options={"credentials": present_credentials(alice, "bob", now, [(ad, None)])},
            **tls("bob"),  # type: ignore[arg-type]
        ):
            pass
