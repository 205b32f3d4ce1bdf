"""How the SDK answers a live reconfiguration's request for a mark (``NOTICE mark``): one mark,
written to every replica of its edge VN at one point of its stream, once ``f + 1`` replicas
asked, so that the honest replicas all switch routing tables at the same publication.

Three fake replicas on real sockets record what the client writes to each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from broker.client import Client
from broker.wire.protocol import (
    MARK_NOTICE,
    MARKS_OPTION,
    PROTOCOL_VERSION,
    FrameDecoder,
    Hello,
    Message,
    Notice,
    Ping,
    Pong,
    Publish,
    Welcome,
    encode,
)
from tests.support import until


@dataclass
class FakeReplica:
    """A replica of a three-replica edge VN that records the client's frames."""

    replica: int
    received: list[Message] = field(default_factory=list)
    writer: asyncio.StreamWriter | None = None
    pongs: set[int] = field(default_factory=set)
    server: asyncio.Server | None = None

    async def start(self) -> int:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writer = writer
            decoder = FrameDecoder()
            while data := await reader.read(65536):
                for msg in decoder.feed(data):
                    self.received.append(msg)
                    if isinstance(msg, Hello):
                        options = {"vn": "b0", "vn_size": 3, "replica": self.replica}
                        writer.write(
                            encode(Welcome(PROTOCOL_VERSION, f"b0.{self.replica}", options))
                        )
                    elif isinstance(msg, Pong):
                        self.pongs.add(msg.token)
            writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def ask_mark(self, round_id: str, token: int) -> None:
        """Ask for a mark, then wait until the client has read the request (its answer to
        the ping sent right behind it comes back)."""
        assert self.writer is not None
        self.writer.write(encode(Notice(MARK_NOTICE, {"round": round_id})) + encode(Ping(token)))
        await until(lambda: token in self.pongs, 5.0)

    def stream(self) -> list[tuple[str, object]]:
        """What the client wrote after HELLO: publications by seq, marks by round."""
        out: list[tuple[str, object]] = []
        for msg in self.received:
            if isinstance(msg, Publish):
                out.append(("publish", msg.seq))
            elif isinstance(msg, Notice) and msg.kind == MARK_NOTICE:
                out.append(("mark", msg.data.get("round")))
        return out


@pytest.fixture
async def replicas() -> AsyncIterator[list[FakeReplica]]:
    fakes = [FakeReplica(i) for i in range(3)]
    for fake in fakes:
        await fake.start()
    yield fakes
    for fake in fakes:
        assert fake.server is not None
        fake.server.close()


def endpoints(fakes: list[FakeReplica]) -> list[str]:
    ports = [f.server.sockets[0].getsockname()[1] for f in fakes if f.server is not None]
    return [f"127.0.0.1:{p}" for p in ports]


async def test_the_client_says_in_hello_that_it_answers_marks(
    replicas: list[FakeReplica],
) -> None:
    async with Client(endpoints(replicas), client_id="pub"):
        await until(lambda: all(f.received for f in replicas), 5.0)
    hello = replicas[0].received[0]
    assert isinstance(hello, Hello)
    assert hello.options.get(MARKS_OPTION) is True


async def test_one_mark_goes_to_every_replica_at_one_point_once_f_plus_one_asked(
    replicas: list[FakeReplica],
) -> None:
    async with Client(endpoints(replicas), client_id="pub") as client:
        for _ in range(2):
            await client.publish({"class": "q"}, b"x", ack=False)
        # one (possibly Byzantine) replica alone, even asking twice, places no mark
        await replicas[0].ask_mark("r1", 1)
        await client.publish({"class": "q"}, b"x", ack=False)
        await replicas[0].ask_mark("r1", 2)
        await client.publish({"class": "q"}, b"x", ack=False)
        # a second replica: f + 1 = 2 asked
        await replicas[2].ask_mark("r1", 3)
        await client.publish({"class": "q"}, b"x", ack=False)
        # the third asks too: the round is marked already
        await replicas[1].ask_mark("r1", 4)
        await client.publish({"class": "q"}, b"x", ack=False)
        await until(lambda: all(len(f.stream()) == 7 for f in replicas), 5.0)
    expected = [("publish", 1), ("publish", 2), ("publish", 3), ("publish", 4), ("mark", "r1")]
    for fake in replicas:
        assert fake.stream() == [*expected, ("publish", 5), ("publish", 6)]


async def test_confidential_publications_queued_in_the_pass_go_before_the_mark(
    replicas: list[FakeReplica],
) -> None:
    async with Client(endpoints(replicas), client_id="pub") as client:
        await replicas[1].ask_mark("r7", 1)
        # queued to be signed at the end of this pass; the request completes the quorum
        # before the pass ends
        await client.publish({"class": "q"}, b"secret", ack=False, confidential=True)
        client._mark_asked(0, {"round": "r7"})
        await until(lambda: all(len(f.stream()) == 2 for f in replicas), 5.0)
    for fake in replicas:
        assert fake.stream() == [("publish", 1), ("mark", "r7")]


@pytest.mark.parametrize("bad", [{}, {"round": 3}, {"round": None}])
async def test_a_request_without_a_round_name_is_ignored(
    replicas: list[FakeReplica], bad: dict[str, object]
) -> None:
    async with Client(endpoints(replicas), client_id="pub") as client:
        for replica in range(3):
            client._mark_asked(replica, bad)
        await client.publish({"class": "q"}, b"x", ack=False)
        await until(lambda: all(len(f.stream()) == 1 for f in replicas), 5.0)
    for fake in replicas:
        assert fake.stream() == [("publish", 1)]


async def test_a_mark_asked_for_a_round_named_longer_than_any_round_is_not_kept(
    replicas: list[FakeReplica],
) -> None:
    """Mark requests are kept per round until f + 1 replicas asked: a round's name is a
    broker id and a serial, so one of megabytes is not a round (each was kept)."""
    long_name = "r" * 100_000
    async with Client(endpoints(replicas), client_id="pub") as client:
        await replicas[0].ask_mark(long_name, 1)
        await replicas[1].ask_mark(long_name, 2)
        await client.publish({"class": "q"}, b"x", ack=False)
        await until(lambda: all(len(f.stream()) == 1 for f in replicas), 5.0)
        assert long_name not in client._mark_requests._asks
    for fake in replicas:
        assert fake.stream() == [("publish", 1)]
