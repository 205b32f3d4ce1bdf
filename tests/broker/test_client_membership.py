"""How the SDK follows its edge VN's membership changes (``NOTICE membership``): only what
``f + 1`` of its replicas announced identically, so a Byzantine minority cannot move it.

No broker is needed: the announcements are handed to the client as its links would, and the
endpoints involved are never dialled (the client is not connected)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from broker.client import Client
from broker.wire.protocol import PROTOCOL_VERSION, FrameDecoder, Hello, Welcome, encode
from tests.support import until

REPLICAS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


def announcement(members: list[str], version: int = 3, vn: str = "b0") -> dict[str, Any]:
    return {
        "version": version,
        "vn": vn,
        "members": [[m, f"127.0.0.1:{i + 1}"] for i, m in enumerate(members)],
    }


@pytest.fixture
async def client():
    c = Client(REPLICAS, client_id="follower")
    c._stopping = True  # never dial: a new member's endpoint is recorded, not connected
    yield c
    await c.close()


async def test_one_replica_alone_cannot_change_the_membership(client: Client) -> None:
    liar = announcement(["b0.0"])  # "the VN is me alone now"
    client._membership_heard(0, liar)
    client._membership_heard(0, liar)  # the same replica again does not count twice
    assert (client.membership_version, client.quorum, len(client.endpoints)) == (-1, 2, 3)


async def test_f_plus_one_identical_announcements_are_followed(client: Client) -> None:
    grown = announcement(["b0.0", "b0.1", "b0.2", "b0.3"])
    client._membership_heard(0, grown)
    client._membership_heard(2, grown)
    assert client.membership_version == 3
    assert client.endpoints[3] == ("127.0.0.1", 4)
    assert (client.fault_tolerance, client.quorum) == (1, 3)
    # keys are split for four once the new replica is connected, not before
    assert (client.vn_size, client._split_target) == (3, 4)
    # an older or repeated version changes nothing
    client._membership_heard(1, announcement(["b0.0"], version=2))
    assert client.quorum == 3


async def test_announcements_that_differ_do_not_add_up(client: Client) -> None:
    client._membership_heard(0, announcement(["b0.0", "b0.1"]))
    client._membership_heard(1, announcement(["b0.0", "b0.1", "b0.2", "b0.9"]))
    assert client.membership_version == -1


async def test_only_each_replicas_latest_announcements_count(client: Client) -> None:
    """A replica announcing version after version (until 2026-11-29 every one was kept
    until some version was followed, so a Byzantine replica grew them without bound)
    counts for its latest few only; an honest one that said the next version before the
    client followed the last still counts for both, and the others move the client."""
    for version in range(10, 1010):
        client._membership_heard(0, {**announcement(["b0.0"], version), "pad": "x" * 100})
    assert sum(len(by_text) for by_text in client._membership_votes.values()) == 4
    grown = announcement(["b0.0", "b0.1", "b0.2", "b0.3"], version=5)
    shrunk = announcement(["b0.0", "b0.1", "b0.2"], version=6)
    client._membership_heard(1, grown)
    client._membership_heard(1, shrunk)
    client._membership_heard(2, grown)
    assert client.membership_version == 5
    client._membership_heard(2, shrunk)
    assert client.membership_version == 6


async def test_a_shrink_stops_using_the_replica_that_left_and_splits_for_fewer(
    client: Client,
) -> None:
    client._ids.update({0: "b0.0", 1: "b0.1", 2: "b0.2"})
    shrunk = announcement(["b0.0", "b0.1"])
    client._membership_heard(0, shrunk)
    client._membership_heard(1, shrunk)
    assert client._retired == {2}
    assert (client.vn_size, client.quorum, client.fault_tolerance) == (2, 2, 0)


@pytest.mark.parametrize(
    "bad",
    [
        "not a map",
        {"version": "3", "vn": "b0", "members": [["b0.0", "127.0.0.1:1"]]},
        {"version": 3, "vn": "b0", "members": []},
        {"version": 3, "vn": "b0", "members": [["b0.0"]]},
        {"version": 3, "vn": "b0"},
        {"version": 3, "vn": "b0", "members": [["b0.0", "127.0.0.1:1"]], "manifest": {"x": 1}},
    ],
)
async def test_a_malformed_announcement_is_ignored_with_a_warning(
    client: Client, bad: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="trellis"):
        for index in range(3):
            client._membership_heard(index, bad)
    assert client.membership_version == -1
    assert "invalid membership announcement" in caplog.text


async def test_an_announcement_about_another_vn_is_ignored(client: Client) -> None:
    client.vn = "b1"
    for index in range(3):
        client._membership_heard(index, announcement(["b0.0", "b0.1"]))
    assert client.membership_version == -1


async def test_a_replica_that_returns_at_its_old_address_gets_its_old_endpoint_back(
    client: Client,
) -> None:
    client._ids.update({0: "b0.0", 1: "b0.1", 2: "b0.2"})
    for version, members in ((3, ["b0.0", "b0.1"]), (5, ["b0.0", "b0.1", "b0.2"])):
        client._membership_heard(0, announcement(members, version))
        client._membership_heard(1, announcement(members, version))
    assert client.membership_version == 5
    assert (len(client.endpoints), client._retired) == (3, set())


async def test_a_joining_replica_that_welcomes_as_a_plain_broker_is_used_as_a_replica() -> None:
    """A replica that joined the edge VN may answer WELCOME before it adopted the version
    that added it (``vn_size`` 1, as a plain broker). The client, which learned it from an
    announcement, must keep it as a replica, not take the endpoints for alternatives of a
    plain broker (it then never used the new replica: publish found no majority)."""

    async def fake_broker(name: str, replica: int) -> asyncio.Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            decoder = FrameDecoder()
            while data := await reader.read(65536):
                for msg in decoder.feed(data):
                    if isinstance(msg, Hello):
                        options = {"vn": "b0", "vn_size": 1, "replica": replica}
                        writer.write(encode(Welcome(PROTOCOL_VERSION, name, options)))
            writer.close()

        return await asyncio.start_server(serve, "127.0.0.1", 0)

    first, joining = await fake_broker("b0", 0), await fake_broker("b0.1", 1)
    ports = [s.sockets[0].getsockname()[1] for s in (first, joining)]
    try:
        async with Client([f"127.0.0.1:{ports[0]}"], client_id="edge") as client:
            client._membership_heard(
                0,
                {
                    "version": 2,
                    "vn": "b0",
                    "members": [["b0", f"127.0.0.1:{ports[0]}"], ["b0.1", f"127.0.0.1:{ports[1]}"]],
                },
            )
            await until(lambda: len(client._links) == 2, 5.0)
            assert not client.alternatives
            assert (client.quorum, client.replica_endpoints) == (2, client.endpoints)
    finally:
        for server in (first, joining):
            server.close()
