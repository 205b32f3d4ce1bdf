"""Topic discovery nodes as real processes on a real overlay (SPEC §8)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.client import Client
from broker.errors import NotAuthorized, TrellisTimeout
from broker.tools.local import LocalOverlay
from broker.tools.tdn import start_tdn_process
from broker.tools.tdn_wire import (
    CHANGES_CLASS,
    REPLY_CLASS,
    TDN_CLASS,
    open_answer,
    seal_answer,
)
from broker.tools.topics_client import TopicsClient
from overlay.tree import line_tree
from security.envelope import Signer, public_key_to_bytes
from security.errors import IntegrityError
from security.topics import HierarchySpec
from security.topics_channel import ReplyKey, open_request
from security.topics_hierarchy import MaxDepthExceeded, MaxWidthExceeded

pytestmark = pytest.mark.slow


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM; the TDN stops gracefully (exit code 0)."""
    if proc.poll() is None:
        proc.terminate()
        assert proc.wait(10) == 0


@pytest.fixture
def world(
    tmp_path: Path, run_overlay: Callable[..., LocalOverlay]
) -> Iterator[tuple[LocalOverlay, dict[str, bytes], list[subprocess.Popen[bytes]]]]:
    overlay = run_overlay(line_tree(["b0", "b1"]))
    tdns = [Signer.generate("tdn-1"), Signer.generate("tdn-2")]
    trusted = {s.id: public_key_to_bytes(s.public_key) for s in tdns}
    trusted_file = tmp_path / "tdns.json"
    trusted_file.write_text(json.dumps({k: v.hex() for k, v in trusted.items()}))
    procs = [
        start_tdn_process(tmp_path, tdns[0], overlay.endpoint("b0"), trusted_file),
        start_tdn_process(tmp_path, tdns[1], overlay.endpoint("b1"), trusted_file),
    ]
    yield overlay, trusted, procs
    for proc in procs:
        stop(proc)


async def until(check: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[misc]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_topics_are_created_disseminated_and_discovered_by_every_query_kind_and_without_tdns(
    world: tuple[LocalOverlay, dict[str, bytes], list[subprocess.Popen[bytes]]],
) -> None:
    overlay, trusted, procs = world
    alice, bob = Signer.generate("alice"), Signer.generate("bob")
    ca = Client(overlay.endpoint("b0"), client_id="alice")
    cb = Client(overlay.endpoint("b1"), client_id="bob")
    async with ca, cb, TopicsClient(ca, alice, trusted) as ta, TopicsClient(cb, bob, trusted) as tb:
        assert [t.id for t in await ta.locate()] == ["tdn-1", "tdn-2"]
        paris = await ta.create_topic(
            "weather/paris", lifetime=60, descriptors={"kind": "weather", "floor": 2}, tdn="tdn-1"
        )
        lyon = await ta.create_topic(
            "weather/lyon", lifetime=60, descriptors={"kind": "weather", "floor": 5}, tdn="tdn-1"
        )
        secret = await ta.create_topic(
            "weather/secret", lifetime=60, discoverers=[public_key_to_bytes(alice.public_key).hex()]
        )
        assert paris.tdn == "tdn-1"

        async def bob_sees_both_at_tdn2() -> bool:
            found = await tb.discover("regex", r"weather/.*", tdn="tdn-2")
            return {a.uuid for a in found} == {paris.uuid, lyon.uuid}

        await until(bob_sees_both_at_tdn2)  # disseminated; the secret one stays hidden from bob
        assert [a.uuid for a in await tb.discover("exact", "weather/lyon")] == [lyon.uuid]
        found = await tb.discover("properties", "kind = 'weather' and floor < 3", tdn="tdn-2")
        assert [a.uuid for a in found] == [paris.uuid]
        mine = await ta.discover("regex", r".*secret", tdn="tdn-1")
        assert [a.uuid for a in mine] == [secret.uuid]

        for proc in procs:  # every TDN stopped: owners answer a flooded query
            stop(proc)
        found = await tb.discover("regex", r"weather/(paris|lyon|secret)", ttl=1.0)
        assert {a.uuid for a in found} == {paris.uuid, lyon.uuid}
        assert [a.uuid for a in await ta.flood_discover("exact", "weather/secret")] == []


async def test_hierarchy_limits_collections_and_attacks_over_the_overlay(
    world: tuple[LocalOverlay, dict[str, bytes], list[subprocess.Popen[bytes]]],
) -> None:
    overlay, trusted, _ = world
    alice, bob, carol = (Signer.generate(n) for n in ("alice", "bob", "carol"))
    clients = [
        Client(overlay.endpoint(b), client_id=s.id)
        for b, s in (("b0", alice), ("b1", bob), ("b1", carol))
    ]
    ca, cb, cc = clients
    async with (
        ca,
        cb,
        cc,
        TopicsClient(ca, alice, trusted) as ta,
        TopicsClient(cb, bob, trusted) as tb,
        TopicsClient(cc, carol, trusted, answer_floods=False) as tc,
    ):
        # hierarchy: MaxDepth 1 and MaxWidth 1 at the root; the parent's expiry ends the child
        root = await ta.create_topic(
            "plant",
            lifetime=3,
            hierarchy=HierarchySpec(root=True, allow_children=True, max_depth=1, max_width=1),
            tdn="tdn-1",
        )
        tree = await tb.watch_topic(root.uuid, tdn="tdn-1")  # bob hears of the hierarchy
        child = await ta.create_topic(
            "plant/line1",
            lifetime=2.5,
            hierarchy=HierarchySpec(allow_children=True, parent=root.uuid),
            tdn="tdn-1",
        )
        change = await asyncio.wait_for(tree.__anext__(), 5)
        assert (change.subject, change.op, change.member) == (root.uuid, "add", child.uuid)
        with pytest.raises(MaxDepthExceeded, match="allows 1 level") as err:
            await ta.create_topic(
                "plant/line1/m", lifetime=1, hierarchy=HierarchySpec(parent=child.uuid), tdn="tdn-1"
            )
        assert err.value.limit == 1
        with pytest.raises(MaxWidthExceeded, match="allows 1"):
            await ta.create_topic(
                "plant/line2", lifetime=1, hierarchy=HierarchySpec(parent=root.uuid), tdn="tdn-1"
            )
        assert len(await ta.discover("regex", "plant.*", tdn="tdn-1")) == 2

        # a collection only bob may discover: carol may not watch it; bob hears the change
        bob_p = public_key_to_bytes(bob.public_key).hex()
        cid = await ta.create_collection("plants", discoverers=[bob_p], tdn="tdn-1")
        changes = await tb.watch_collection(cid, tdn="tdn-1")
        with pytest.raises(NotAuthorized, match="not allowed to discover"):
            await tc.watch_collection(cid, tdn="tdn-1")
        async with cc.subscribe(f"class = '{CHANGES_CLASS}'") as eavesdrop:
            await ta.add_to_collection(cid, root.uuid, tdn="tdn-1")
            change = await asyncio.wait_for(changes.__anext__(), 5)
            assert (change.op, change.member) == ("add", root.uuid)
            overheard = await eavesdrop.get(5)  # carol sees the publication, cannot read it
            with pytest.raises(IntegrityError):
                open_answer(ReplyKey(), overheard.payload)
        assert await tb.collection_topics(cid, tdn="tdn-1") == [root.uuid]
        assert await tb.collections_of(root.uuid, tdn="tdn-1") == [cid]
        with pytest.raises(NotAuthorized):
            await tc.collection_topics(cid, tdn="tdn-1")

        # a forged TDN (a trusted id, another key) answering locate is not believed
        mallory = Signer.generate("tdn-1")
        cm = Client(overlay.endpoint("b1"), client_id="tdn-1-impostor")
        async with (
            cm,
            cm.subscribe(f"class prefix '{TDN_CLASS}'") as requests,
            cm.subscribe(f"class = '{REPLY_CLASS}'") as replies,
        ):
            await cm.advertise("class prefix 'Services/Discovery/'")

            async def answer_locates() -> None:
                while True:
                    msg = await requests.get()
                    _, body = open_request(msg.payload)
                    sealed = seal_answer(
                        mallory,
                        body["reply"],
                        {"rid": body["rid"], "ok": True, "result": {"id": "tdn-1", "topics": 0}},
                    )
                    await cm.publish(
                        {
                            "class": REPLY_CLASS,
                            "to": str(msg.attrs["from"]),
                            "rid": body["rid"],
                            "from": "tdn-1",
                        },
                        sealed,
                    )

            task = asyncio.create_task(answer_locates())
            located = await tb.locate()
            task.cancel()
            assert [t.id for t in located] == ["tdn-1", "tdn-2"]  # the genuine ones only
            assert all(t.key == trusted[t.id] for t in located)
            assert any("not a trusted TDN" in why for why in tb.rejected)

            # a replayed creation response: mallory re-sends tdn-1's answer to an earlier
            # request of bob's under the rid of a new one (to a TDN that is not there, so
            # nothing else answers it): bob cannot open it, and accepts nothing
            first = await tb.create_topic("bob/1", lifetime=30, tdn="tdn-1")
            captured = None
            while captured is None:
                msg = await replies.get(5)
                if msg.attrs.get("to") == "bob":
                    captured = msg.payload
            pending = asyncio.create_task(tb.create_topic("bob/2", lifetime=30, tdn="tdn-9"))
            while True:
                sent = await requests.get(5)
                _, body = open_request(sent.payload)
                if body["op"] == "create" and body["request"][6] == "bob/2":
                    break
            await cm.publish(
                {"class": REPLY_CLASS, "to": "bob", "rid": body["rid"], "from": "tdn-1"}, captured
            )
            with pytest.raises(TrellisTimeout):
                await pending
            assert first.request.synopsis == "bob/1"
            assert any("does not open" in why for why in tb.rejected)

        # someone else's topic in a flood answer: carol is refused that claim
        stolen = await tb.discover("exact", "bob/1", tdn="tdn-1")
        assert stolen
        tc.owned.add(stolen[0])  # carol holds bob's advertisement and answers floods with it
        tc.answer_floods = True
        await tc.close()
        await tc.start()
        # wait until the parent expires: its child goes with it
        await asyncio.sleep(max(0.0, root.expires - time.time()) + 0.7)
        assert await ta.discover("regex", "plant.*", tdn="tdn-1") == []
        expired = {(await asyncio.wait_for(tree.__anext__(), 5)).member for _ in range(2)}
        assert expired == {root.uuid, child.uuid}
        flood = await ta.flood_discover("exact", "bob/1", ttl=1.0)
        assert [a.uuid for a in flood] == [stolen[0].uuid]  # bob's own answer only
        assert any("does not own" in why for why in ta.rejected)

    for proc in world[2]:
        stop(proc)
    async with (
        Client(overlay.endpoint("b0"), client_id="late") as cl,
        TopicsClient(cl, Signer.generate("late"), trusted, timeout=0.5) as tl,
    ):
        with pytest.raises(TrellisTimeout, match="no TDN answered"):
            await tl.request("locate")


async def test_a_ca_certified_tdn_is_trusted_by_clients_and_brokers_that_hold_only_the_ca(
    tmp_path: Path, run_overlay: Callable[..., LocalOverlay]
) -> None:
    from broker.daemon.topic_guard import secured_class
    from security.ca import create_ca, issue, save_ca, write_issued
    from security.topics import AdvertisementError
    from security.topics_credentials import present_credentials
    from security.topics_delegations import delegate
    from security.topics_identity import load_trusted_tdns

    pki = tmp_path / "pki"
    ca = create_ca("topics CA")
    save_ca(ca, pki)
    certified, uncertified = Signer.generate("tdn-c"), Signer.generate("tdn-u")
    write_issued(issue(ca, "tdn-c", "tdn", key=certified.key), ca, pki, "tdn-c")
    # the broker and the entities trust the CA's certificate, not a list of TDN keys
    overlay = run_overlay(line_tree(["b0"]), topic_trust=str(pki / "ca.crt"))
    authority = load_trusted_tdns(pki / "ca.crt")
    procs = [
        start_tdn_process(
            tmp_path,
            certified,
            overlay.endpoint("b0"),
            pki / "ca.crt",
            certificate=pki / "tdn-c.crt",
        ),
        start_tdn_process(tmp_path, uncertified, overlay.endpoint("b0"), pki / "ca.crt"),
    ]
    try:
        alice, bob = Signer.generate("alice"), Signer.generate("bob")
        async with (
            Client(overlay.endpoint("b0"), client_id="alice") as ca_client,
            TopicsClient(ca_client, alice, authority) as topics,
        ):
            ad = await topics.create_topic("orders", lifetime=60, tdn="tdn-c")
            assert ad.certificate  # the TDN sent its certificate with the advertisement
            with pytest.raises((AdvertisementError, TrellisTimeout)):
                await topics.create_topic("other", lifetime=60, tdn="tdn-u")
            assert any("tdn-u" in why for why in topics.rejected), topics.rejected
        grant = delegate(
            alice, ad, public_key_to_bytes(bob.public_key), "subscribe", now=time.time()
        )
        flt = f"class = '{secured_class(ad.uuid)}'"

        def creds(who: Signer, item: object) -> dict[str, object]:
            return {"credentials": present_credentials(who, who.id, time.time(), [item])}  # type: ignore[list-item]

        async with (
            Client(  # alice published topic requests above: her numbering continues
                overlay.endpoint("b0"),
                client_id="alice",
                hello_options=creds(alice, (ad, None)),
                first_seq=time.time_ns() // 1000,
            ) as pub,
            Client(
                overlay.endpoint("b0"), client_id="bob", hello_options=creds(bob, (ad, grant))
            ) as sub_client,
            sub_client.subscribe(flt) as sub,
        ):
            await pub.advertise(flt)
            await pub.publish({"class": secured_class(ad.uuid)}, b"certified")
            assert (await sub.get(5)).payload == b"certified"
    finally:
        for proc in procs:
            stop(proc)
