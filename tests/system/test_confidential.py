"""Confidential publications across virtual nodes: per-hop re-splitting of key shares,
robust reconstruction at subscribers, Byzantine minorities, collusion."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest

import broker.client
import security.pass_keys
import security.publication
from analytics.schema import read_records
from broker.client import Client
from broker.daemon.shares import SILENCE_DEADLINE
from broker.errors import TrellisTimeout
from broker.tools.local import LocalOverlay, metric_by_label
from broker.wire.protocol import MsgType, Pong
from overlay.tree import broker_names, line_tree
from security.envelope import Signer
from security.pass_shares import root_holdings, split_pass
from security.paths import KeyAssembly
from security.propagation import coalition_key, combine_upward, threshold_for, unpack_record
from security.publication import publication_id
from security.waiting import WAITING_OVERHEAD
from tests.system.test_overlay import metric
from tests.wire import RawPeer

pytestmark = pytest.mark.slow


@pytest.fixture
def run_vns(run_overlay: Callable[..., LocalOverlay]) -> Callable[..., LocalOverlay]:
    """A line of VNs with the given replica counts."""

    def _run(replicas: list[int], overrides: dict[str, Any] | None = None) -> LocalOverlay:
        names = broker_names(len(replicas))
        return run_overlay(
            line_tree(names),
            replicas=dict(zip(names, replicas, strict=True)),
            overrides=overrides,
            heartbeat_interval=1.0,
        )

    return _run


@pytest.fixture
def recorded_keys(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every content key this process's publishers generate, for the collusion checks."""
    keys: list[bytes] = []
    original = security.publication.new_key

    def recording() -> bytes:
        keys.append(original())
        return keys[-1]

    monkeypatch.setattr(security.publication, "new_key", recording)
    return keys


async def confidential_exchange(
    overlay: LocalOverlay,
    count: int,
    wait: float = 10.0,
    audit_wait: float = 5.0,
    share_form: str = "pass",
    prepare: Callable[[Client], None] | None = None,
) -> tuple[list[tuple[int, bytes]], Client]:
    """Publish ``count`` confidential messages at the first VN; what the last VN's
    subscriber decrypted, in order (the subscriber client is returned closed, after up to
    ``audit_wait`` seconds for the shares that trail the deliveries). ``prepare`` is
    called with the subscriber's client before it connects."""
    vns = sorted(overlay.tree.brokers)
    pub = Client(overlay.endpoints(vns[0]), client_id="pub", share_form=share_form)
    sub_client = Client(overlay.endpoints(vns[-1]), client_id="sub", manifest=overlay.manifest)
    if prepare is not None:
        prepare(sub_client)
    async with pub, sub_client, sub_client.subscribe("class = 'secret'") as sub:
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(count):
            await pub.publish(
                {"class": "secret", "i": i}, f"payload {i}".encode(), confidential=True
            )
        got = []
        for _ in range(count):
            try:
                msg = await sub.get(wait)
            except TrellisTimeout:
                break
            assert msg.confidential
            got.append((msg.seq, msg.payload))
        with pytest.raises(TrellisTimeout):
            await sub.get(0.5)
        # Late shares still arrive after delivery (the final audit needs them all); a
        # dropping replica's never come, so the wait is bounded.
        total = math.prod(len(overlay.replicas_of(vn)) for vn in vns)
        deadline = time.monotonic() + audit_wait
        while time.monotonic() < deadline and any(  # noqa: ASYNC110 - polls the client
            sub_client.key_shares("pub", seq) < total for seq, _ in got
        ):
            await asyncio.sleep(0.05)
    return got, sub_client


def expected(count: int) -> list[tuple[int, bytes]]:
    return [(i + 1, f"payload {i}".encode()) for i in range(count)]


SHARE_FORMS = pytest.mark.parametrize("share_form", ["record", "pass"])


@SHARE_FORMS
async def test_subscriber_decrypts_every_publication_once_in_order(run_vns, share_form) -> None:
    overlay = run_vns([3, 3, 3])
    got, sub_client = await confidential_exchange(overlay, 20, share_form=share_form)
    assert got == expected(20)
    # SPEC §3: a subscriber h VN hops away receives prod(r) shares of each key.
    assert {sub_client.key_shares("pub", seq) for seq, _ in got} == {27}


@pytest.mark.parametrize(
    ("replicas", "share_form"),
    [([3, 1, 3], "record"), ([1, 5], "record"), ([5, 3], "record"), ([1, 5, 3], "pass")],
    ids=str,
)
async def test_share_count_is_the_product_of_replica_counts(run_vns, replicas, share_form) -> None:
    overlay = run_vns(replicas)
    got, sub_client = await confidential_exchange(overlay, 3, share_form=share_form)
    assert got == expected(3)
    assert {sub_client.key_shares("pub", seq) for seq, _ in got} == {math.prod(replicas)}


@pytest.mark.parametrize(
    "modes",
    [
        {"b0.1": "drop", "b1.2": "drop", "b2.0": "drop"},
        {"b0.2": "corrupt", "b1.0": "corrupt", "b2.1": "corrupt"},
        {"b0.0": "equivocate", "b1.1": "equivocate", "b2.2": "equivocate"},
        {"b0.1": "collude", "b1.1": "collude", "b2.1": "collude"},
        {"b0.0": "drop", "b1.2": "equivocate", "b2.1": "corrupt"},
    ],
    ids=["drop", "corrupt", "equivocate", "collude", "mixed"],
)
@SHARE_FORMS
async def test_f_byzantine_replicas_per_vn_cannot_stop_delivery(run_vns, modes, share_form) -> None:
    overrides = {b: {"byzantine": mode} for b, mode in modes.items()}
    overlay = run_vns([3, 3, 3], overrides)
    got, _ = await confidential_exchange(overlay, 10, share_form=share_form)
    assert got == expected(10)


async def test_non_matching_subscriber_gets_no_content_and_no_key_material(run_vns) -> None:
    overlay = run_vns([3, 3])
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b1"), client_id="other", manifest=overlay.manifest) as other,
        Client(overlay.endpoints("b1"), client_id="sub", manifest=overlay.manifest) as sc,
        other.subscribe("class = 'secret' and i > 100") as nothing,
        sc.subscribe("class = 'secret'") as sub,
    ):
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(5):
            await pub.publish({"class": "secret", "i": i}, b"x", confidential=True)
        assert [(await sub.get(10)).seq for _ in range(5)] == [1, 2, 3, 4, 5]
        await asyncio.sleep(0.5)
        with pytest.raises(TrellisTimeout):
            await nothing.get(0.2)
        assert all(other.key_shares("pub", seq) == 0 for seq in range(1, 6))
        assert all(sc.key_shares("pub", seq) == 9 for seq in range(1, 6))


def pooled_records(overlay: LocalOverlay) -> dict[bytes, list[Any]]:
    """Every share the colluding brokers recorded, grouped by publication."""
    pools: dict[bytes, list[Any]] = {}
    for path in overlay.workdir.glob("*.collude.jsonl"):
        for line in path.read_text().splitlines():
            record = unpack_record(bytes.fromhex(json.loads(line)["record"]))
            pools.setdefault(record.pub_id, []).append(record)
    return pools


def pooled_keys(overlay: LocalOverlay, share_form: str) -> dict[bytes, bytes | None]:
    """What the colluding brokers can compute from the shares they recorded, per
    publication (every split of the 3-VN path of three replicas is (2, 3))."""
    if share_form == "record":
        return {pub: coalition_key(records) for pub, records in pooled_records(overlay).items()}
    known: dict[bytes, dict[tuple[int, ...], bytes]] = {}
    for path in overlay.workdir.glob("*.collude.jsonl"):
        for line in path.read_text().splitlines():
            item = json.loads(line)
            pool = known.setdefault(bytes.fromhex(item["pub_id"]), {})
            pool[tuple(item["lineage"])] = bytes.fromhex(item["opening"])
    scheme = (threshold_for(3), 3)
    schemes = dict.fromkeys([(), *((i,) for i in range(3))], scheme)
    schemes.update({(i, j): scheme for i in range(3) for j in range(3)})
    return {pub: combine_upward(pool, schemes) for pub, pool in known.items()}


@SHARE_FORMS
async def test_f_colluders_per_vn_never_learn_a_key(run_vns, recorded_keys, share_form) -> None:
    overlay = run_vns([3, 3, 3], {f"b{v}.1": {"byzantine": "collude"} for v in range(3)})
    got, _ = await confidential_exchange(overlay, 5, share_form=share_form)
    assert got == expected(5)
    pools = pooled_keys(overlay, share_form)
    assert len(pools) == 5, "the colluders saw shares of every publication"
    assert set(pools.values()) == {None}


@SHARE_FORMS
async def test_f_plus_1_colluders_in_one_vn_do_learn_the_keys(
    run_vns, recorded_keys, share_form
) -> None:
    """The control for the test above: a colluding majority in one VN breaks it."""
    overrides = {b: {"byzantine": "collude"} for b in ("b1.0", "b1.1")}
    overlay = run_vns([3, 3, 3], overrides)
    await confidential_exchange(overlay, 3, wait=2.0, share_form=share_form)
    learned = set(pooled_keys(overlay, share_form).values())
    assert learned == set(recorded_keys)


@SHARE_FORMS
async def test_key_epoch_sends_shares_once_per_epoch(run_vns, share_form) -> None:
    overlay = run_vns([3, 3, 3])
    async with (
        Client(
            overlay.endpoints("b0"), client_id="pub", key_refresh=10, share_form=share_form
        ) as pub,
        Client(overlay.endpoints("b2"), client_id="sub", manifest=overlay.manifest) as sc,
        sc.subscribe("class = 'secret'") as sub,
    ):
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(30):
            await pub.publish(
                {"class": "secret", "i": i}, f"payload {i}".encode(), confidential=True
            )
        got = [(m.seq, m.payload) for m in [await sub.get(10) for _ in range(30)]]
        await asyncio.sleep(0.5)
        shares = {seq: sc.key_shares("pub", seq) for seq in range(1, 31)}
    assert got == expected(30)
    # Three epochs (seqs 1, 11, 21): 3 x 27 shares instead of 30 x 27, 90% less.
    assert {seq: n for seq, n in shares.items() if n} == {1: 27, 11: 27, 21: 27}


@SHARE_FORMS
async def test_subscriber_joining_mid_epoch_decrypts_the_rest_of_it(run_vns, share_form) -> None:
    overlay = run_vns([3, 3])
    async with (
        Client(
            overlay.endpoints("b0"), client_id="pub", key_refresh=100, share_form=share_form
        ) as pub,
        Client(overlay.endpoints("b1"), client_id="early", manifest=overlay.manifest) as ec,
        ec.subscribe("class = 'secret'") as early,
    ):
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(5):
            await pub.publish(
                {"class": "secret", "i": i}, f"payload {i}".encode(), confidential=True
            )
        assert [(await early.get(10)).seq for _ in range(5)] == [1, 2, 3, 4, 5]
        async with (
            Client(overlay.endpoints("b1"), client_id="late", manifest=overlay.manifest) as lc,
            lc.subscribe("class = 'secret'") as late,
        ):
            await asyncio.to_thread(overlay.wait_quiet)
            for i in range(5, 10):
                await pub.publish(
                    {"class": "secret", "i": i}, f"payload {i}".encode(), confidential=True
                )
            got = [(m.seq, m.payload) for m in [await late.get(10) for _ in range(5)]]
    assert got == expected(10)[5:]


@SHARE_FORMS
async def test_bad_shares_are_blamed_on_their_producer_in_metrics(run_vns, share_form) -> None:
    overrides = {"b0.2": {"byzantine": "corrupt"}, "b1.0": {"byzantine": "equivocate"}}
    overlay = run_vns([3, 3, 3], overrides)
    # Every share arrives here (nobody drops), so waiting for them all costs nothing unless
    # the machine is loaded; the attribution needs the equivocator's last shares.
    got, sub_client = await confidential_exchange(
        overlay, 4, audit_wait=30.0, share_form=share_form
    )
    assert got == expected(4)
    # Equivocation shows only when both versions meet: at the subscriber.
    assert sub_client.share_culprits() == {"b1.0"}

    def blamed(broker_id: str) -> dict[str, int]:
        return metric_by_label(overlay.metrics(broker_id), "trellis_share_blame_total", "culprit")

    next_hop = [await asyncio.to_thread(blamed, b) for b in ("b1.1", "b1.2")]
    assert all(b.keys() == {"b0.2"} and b["b0.2"] >= 4 for b in next_hop)
    after_equivocator = [await asyncio.to_thread(blamed, b) for b in ("b2.0", "b2.1", "b2.2")]
    assert all(set(b) <= {"b1.0"} for b in after_equivocator), "no honest broker is blamed"


async def test_a_subscriber_handed_every_leaf_at_once_still_names_an_equivocator(
    run_vns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the leaves of all three replicas of its VN come together, a subscriber's first
    pass over them is also its check (it is not rebuilt): what that pass found wrong must
    still send it to the audit that names the equivocator. The leaves are held here until
    the links go quiet, then handed over at once; no audit is drawn by sample, so the
    equivocator is named only if the first pass's findings reach the check."""
    overlay = run_vns([3, 3, 3], {"b1.0": {"byzantine": "equivocate"}})
    held: list[tuple[Any, Any]] = []
    reused = 0
    whole = security.pass_keys._whole

    class NeverDrawn:
        @staticmethod
        def randrange(n: int) -> int:
            return n - 1

    monkeypatch.setattr(security.pass_keys, "_draw", NeverDrawn())

    def counting(state: Any, claim: Any, view: Any) -> Any:
        nonlocal reused
        found = whole(state, claim, view)
        reused += found is not None
        return found

    monkeypatch.setattr(security.pass_keys, "_whole", counting)
    releasing: list[asyncio.Task[None]] = []

    def prepare(client: Client) -> None:
        take = client._leaves_arrived

        def hold(link: Any, msg: Any) -> None:
            held.append((link, msg))

        async def release() -> None:
            seen = 0
            while True:
                await asyncio.sleep(1.0)
                if held and len(held) == seen:
                    for link, msg in held:
                        take(link, msg)
                    held.clear()
                    client._recover_arrived()
                seen = len(held)

        client._leaves_arrived = hold  # type: ignore[method-assign]
        releasing.append(asyncio.create_task(release()))

    try:
        got, sub_client = await confidential_exchange(overlay, 4, audit_wait=30.0, prepare=prepare)
    finally:
        for task in releasing:
            task.cancel()
    assert got == expected(4)
    assert reused == len(got), "an epoch's leaves did not come all at once"
    assert sub_client.share_culprits() == {"b1.0"}


@SHARE_FORMS
async def test_two_byzantine_of_five_replicas_per_vn_cannot_stop_delivery(
    run_vns, share_form
) -> None:
    """r = 5 tolerates f = 2 per VN, here in mixed modes on a 3-5-5 path."""
    modes = {
        "b0.1": "equivocate",
        "b1.0": "drop",
        "b1.3": "corrupt",
        "b2.2": "equivocate",
        "b2.4": "collude",
    }
    overlay = run_vns([3, 5, 5], {b: {"byzantine": mode} for b, mode in modes.items()})
    got, sub_client = await confidential_exchange(overlay, 8, share_form=share_form)
    assert got == expected(8)
    assert sub_client.share_culprits() <= set(modes)


async def test_a_garbled_or_misaddressed_pass_is_blamed_on_its_sender_who_stays_served(
    run_vns,
) -> None:
    """Key shares by the pass from a client: a statement that does not parse, or one that
    is not the sender's own, is blamed on the sender (an honest sender sends only its own
    statements, validly formed); its connection stays open and a real exchange goes on."""
    overlay = run_vns([3, 3])
    endpoint = overlay.endpoints("b0")[0]
    peer = await RawPeer.connect(endpoint)
    await peer.hello("mallory")
    await peer.send(MsgType.PASS, [[b"junk", b"sig"]], b"\x93\x01", b"s" * 64, b"blob")
    other = Signer.generate("somebody-else")
    statement, blobs = split_pass(
        other, "b0", 1, 3, root_holdings([(publication_id("mallory", 1), bytes(32))])
    )
    await peer.send(MsgType.PASS, [], statement.raw, statement.signature, blobs[0])
    await peer.send(MsgType.PING, 5)
    assert await peer.receive() == Pong(5)

    def blamed() -> dict[str, int]:
        return metric_by_label(overlay.metrics("b0.0"), "trellis_share_blame_total", "culprit")

    assert await asyncio.to_thread(blamed) == {"mallory": 2}
    got, _ = await confidential_exchange(overlay, 3, share_form="pass")
    assert got == expected(3)
    await peer.close()


async def test_a_client_sending_root_shares_again_and_again_fills_only_its_own_allowance(
    run_vns,
) -> None:
    """A client's root splits wait at its edge replica for their PUBLISH. A client that
    sends one PASS again and again for publications it never sends is charged for what
    waits: past ``max_waiting_share_bytes`` its further shares are dropped and counted
    (before, every copy was kept and the broker's memory grew with the flood); its
    connection stays open and another publisher's confidential publications still get
    their keys through that replica."""
    budget = 64 * 1024
    overlay = run_vns([3, 3], {"b0.0": {"max_waiting_share_bytes": budget}})
    peer = await RawPeer.connect(overlay.endpoints("b0")[0])
    await peer.hello("mallory")
    mallory = Signer.generate("mallory")
    roots = [(publication_id("mallory", seq), bytes(32)) for seq in range(1, 101)]
    statement, blobs = split_pass(mallory, "b0", 1, 3, root_holdings(roots))
    frames = 50
    for _ in range(frames):
        await peer.send(MsgType.PASS, [], statement.raw, statement.signature, blobs[0])
    await peer.send(MsgType.PING, 5)
    assert await peer.receive(timeout=30) == Pong(5)

    def dropped() -> float:
        return metric(overlay.metrics("b0.0"), "trellis_shares_over_budget_total")

    # every share waiting is charged at least WAITING_OVERHEAD: at most budget / that kept
    assert await asyncio.to_thread(dropped) >= frames * len(roots) - budget // WAITING_OVERHEAD
    got, _ = await confidential_exchange(overlay, 3)
    assert got == expected(3)
    await peer.send(MsgType.PING, 6)
    assert await peer.receive() == Pong(6)
    await peer.close()


@SHARE_FORMS
async def test_a_long_key_epoch_keeps_its_key_while_many_short_ones_come_and_go(
    run_vns, monkeypatch, share_form
) -> None:
    """A subscriber keeps a bounded number of epochs; a publisher's current epoch is kept
    past the bound (its shares travel once), however many other epochs pass meanwhile."""
    monkeypatch.setattr(broker.client, "_KEY_MEMORY", 8)
    overlay = run_vns([3, 3])
    async with (
        Client(
            overlay.endpoints("b0"), client_id="long", key_refresh=100, share_form=share_form
        ) as long_pub,
        Client(overlay.endpoints("b0"), client_id="short", share_form=share_form) as short_pub,
        Client(
            overlay.endpoints("b1"), client_id="sub", manifest=overlay.manifest, key_patience=2.0
        ) as sc,
        sc.subscribe("class = 'secret'") as sub,
    ):
        await long_pub.advertise("class = 'secret'")
        await short_pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        order = ["long"] * 2 + ["short"] * 20 + ["long"] * 3
        for n, who in enumerate(order):
            pub = long_pub if who == "long" else short_pub
            await pub.publish({"class": "secret", "n": n}, f"{who} {n}".encode(), confidential=True)
            await sub.get(10)  # each one in turn, so the short epochs come and go between
        assert sub.keys_missing == 0


def share_verdicts(overlay: LocalOverlay, broker_id: str) -> list[dict[str, Any]]:
    """The share verdicts in a broker's traffic log so far."""
    root = overlay.workdir / "traffic" / broker_id
    return [r for r in read_records(root) if r.get("k") == "share"]


@SHARE_FORMS
async def test_a_silent_upstream_replica_is_blamed_once_its_deadline_passed(
    run_vns, share_form
) -> None:
    overlay = run_vns([3, 3], {"b0.1": {"byzantine": "drop"}})
    got, _ = await confidential_exchange(overlay, 3, share_form=share_form)
    assert got == expected(3)

    def blamed(broker_id: str) -> dict[str, int]:
        return metric_by_label(overlay.metrics(broker_id), "trellis_share_blame_total", "culprit")

    downstream = ("b1.0", "b1.1", "b1.2")
    deadline = time.monotonic() + SILENCE_DEADLINE + 15
    counts: list[dict[str, int]] = []
    while time.monotonic() < deadline:
        counts = [await asyncio.to_thread(blamed, b) for b in downstream]
        if all(c.get("b0.1", 0) >= 3 for c in counts):
            break
        await asyncio.sleep(0.3)
    # One blame per key epoch, on the silent replica only.
    assert counts == [{"b0.1": 3}] * 3
    silent_lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(silent_lines) < 3:
        silent_lines = [v for v in share_verdicts(overlay, "b1.0") if v["cul"] == "b0.1"]
        await asyncio.sleep(0.3)
    assert len(silent_lines) == 3
    assert all("silent" in v["why"] and v.get("from") is None for v in silent_lines)


def lose_key_shares(client: Client, epoch: int) -> None:
    """The key shares of ``epoch`` are lost on the way to ``client`` (as a slow consumer's
    are, dropped with its deliveries): every one that arrives lands in an assembly nobody
    reads."""
    assemblies = client._assembly
    client._assembly = lambda publisher, seq: (  # type: ignore[method-assign]
        KeyAssembly(publisher, seq) if seq == epoch else assemblies(publisher, seq)
    )


async def test_a_publication_whose_key_never_arrives_holds_back_the_later_ones_only_briefly(
    run_vns,
) -> None:
    overlay = run_vns([3, 3])
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(
            overlay.endpoints("b1"), client_id="sub", manifest=overlay.manifest, key_patience=1.0
        ) as sc,
        sc.subscribe("class = 'secret'") as sub,
    ):
        lose_key_shares(sc, 2)
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(4):  # seqs 1 to 4: 1, 2 and 4 confidential, 3 plain
            await pub.publish(
                {"class": "secret", "i": i}, f"payload {i}".encode(), confidential=i != 2
            )
        got = [(m.seq, m.payload) for m in [await sub.get(10) for _ in range(3)]]
        with pytest.raises(TrellisTimeout):
            await sub.get(0.5)
    assert got == [(1, b"payload 0"), (3, b"payload 2"), (4, b"payload 3")]
    assert sub.keys_missing == 1


@SHARE_FORMS
async def test_the_publications_waiting_behind_a_key_that_never_arrives_keep_their_keys(
    run_vns, monkeypatch, share_form
) -> None:
    """Seq 2's key never arrives, and while seq 2 holds the stream back for key_patience,
    many more epochs than the subscriber keeps (``_KEY_MEMORY``) arrive with their keys and
    wait behind it: they are handed out once seq 2 is given up, none of them lost with
    their keys (which would give each up in turn and hold the stream back again)."""
    monkeypatch.setattr(broker.client, "_KEY_MEMORY", 8)
    overlay = run_vns([3, 3])
    count = 60
    async with (
        Client(overlay.endpoints("b0"), client_id="pub", share_form=share_form) as pub,
        Client(
            overlay.endpoints("b1"), client_id="sub", manifest=overlay.manifest, key_patience=2.0
        ) as sc,
        sc.subscribe("class = 'secret'") as sub,
    ):
        lose_key_shares(sc, 2)
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(1, count + 1):
            await pub.publish(
                {"class": "secret", "i": i}, f"payload {i}".encode(), confidential=True
            )
        await pub.drain()
        got = []
        with contextlib.suppress(TrellisTimeout):
            while len(got) < count - 1:
                message = await sub.get(10)
                got.append((message.seq, message.payload))
    assert got == [(i, f"payload {i}".encode()) for i in range(1, count + 1) if i != 2]
    assert sub.keys_missing == 1


async def test_a_burst_split_in_one_pass_is_sent_in_frames_its_receivers_accept(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """A relay that reads a burst of confidential publications in one event-loop pass
    splits all their shares at once; their PASS frame used to be one, whatever it weighed,
    and one over the next broker's ``max_frame`` closed the link with every share in it
    (a subscriber lost 2,000 keys in a row, 2026-11-29). With a small frame limit, a burst
    without acks reaches the subscriber whole, and no broker refused a frame."""
    names = broker_names(3)
    overlay = run_overlay(
        line_tree(names),
        replicas={"b0": 3, "b1": 3, "b2": 1},
        heartbeat_interval=1.0,
        max_frame=8192,
    )
    count = 400
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b2"), client_id="sub", manifest=overlay.manifest) as sub_client,
        sub_client.subscribe("class = 'secret'") as sub,
    ):
        await pub.advertise("class = 'secret'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(count):
            await pub.publish(
                {"class": "secret", "i": i}, f"payload {i}".encode(), confidential=True, ack=False
            )
        await pub.drain()
        got = []
        for _ in range(count):
            try:
                msg = await sub.get(15)
            except TrellisTimeout:
                break
            got.append((msg.seq, msg.payload))
    assert got == expected(count)
    for name in overlay.brokers:
        log = (overlay.workdir / f"{name}.log").read_text(encoding="utf-8")
        assert "too_large" not in log, name
