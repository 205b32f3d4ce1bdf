"""A coordinator's control connection to a member that dies during a round, or sends
more than it may.

Found by the multi-host scenario ``reconf-kill`` (``tests/hosts``): a member killed between
two steps reset its control connection; on uvloop (the broker's loop) writing the next step
raised ``RuntimeError``, which escaped the round's error handling, so the coordinator never
sent ``unlock``/``abort`` to the others and they stayed locked (and frozen) until their
leases expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from broker.daemon.reconfig_agent import CONTROL_INBOX, ControlChannel
from broker.errors import PayloadTooLarge
from broker.wire.protocol import HEADER_SIZE, PROTOCOL_VERSION, Notice, Welcome, encode
from reconfig.live import Step
from security.errors import ProtocolError
from tests.support import until

uvloop = pytest.importorskip("uvloop")


def test_a_step_sent_to_a_member_that_reset_its_connection_raises_a_connection_error() -> None:
    async def run() -> None:
        async def member(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            header = await reader.readexactly(HEADER_SIZE)
            await reader.readexactly(int.from_bytes(header, "big"))  # the HELLO
            writer.write(encode(Welcome(PROTOCOL_VERSION, "m.0", {})))
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()  # with linger 0: a reset, as a killed process's kernel sends

        server = await asyncio.start_server(member, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = ControlChannel("c.0", "m.0", f"127.0.0.1:{port}")
        try:
            await channel.open(5.0)
            assert channel.reader is not None
            assert channel.writer is not None
            # The channel reads for its whole life (heartbeats): it sees the reset.
            await until(channel.writer.is_closing)
            with pytest.raises(ConnectionError):
                await channel.call(Step("unlock", "c.0#1"), 2.0)
        finally:
            await channel.close()
            server.close()
            await server.wait_closed()

    uvloop.run(run())


def _serve_member(then: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> Any:
    """A member that welcomes the control connection, then runs ``then`` on it."""

    async def member(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        header = await reader.readexactly(HEADER_SIZE)
        await reader.readexactly(int.from_bytes(header, "big"))  # the HELLO
        writer.write(encode(Welcome(PROTOCOL_VERSION, "m.0", {})))
        try:
            await then(writer)
            with contextlib.suppress(ConnectionError):
                await reader.read()  # until the channel closes its side
        finally:
            writer.close()

    return member


def test_a_member_announcing_a_frame_over_the_limit_ends_the_channel_at_once() -> None:
    """A Byzantine or broken member that announces a 2 GiB reply does not make its
    coordinator buffer (or wait for) it: the request fails with ``too_large`` at once."""

    async def huge(writer: asyncio.StreamWriter) -> None:
        writer.write((2**31).to_bytes(HEADER_SIZE, "big") + b"\x00" * 4096)
        await writer.drain()

    async def run() -> None:
        server = await asyncio.start_server(_serve_member(huge), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = ControlChannel("c.0", "m.0", f"127.0.0.1:{port}", max_frame=64 * 1024)
        try:
            await channel.open(5.0)
            with pytest.raises(PayloadTooLarge, match="over the limit of 65536 bytes"):
                await channel.request("neighbours", {}, 5.0)
            assert channel.writer is not None
            assert channel.writer.is_closing()
        finally:
            await channel.close()
            server.close()
            await server.wait_closed()

    uvloop.run(run())


def test_a_member_flooding_frames_nobody_asked_for_ends_the_channel() -> None:
    """Frames besides heartbeats wait for a request to read them, at most CONTROL_INBOX:
    a member that sends more is flooding, and the channel ends instead of queueing them."""

    async def flood(writer: asyncio.StreamWriter) -> None:
        for i in range(CONTROL_INBOX * 4):
            writer.write(encode(Notice("unasked", {"n": i})))
        await writer.drain()

    async def run() -> None:
        server = await asyncio.start_server(_serve_member(flood), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = ControlChannel("c.0", "m.0", f"127.0.0.1:{port}")
        try:
            await channel.open(5.0)
            assert channel.writer is not None
            await until(channel.writer.is_closing)
            with pytest.raises(ProtocolError, match="frames nobody asked for"):
                await channel.request("neighbours", {}, 2.0)
        finally:
            await channel.close()
            server.close()
            await server.wait_closed()

    uvloop.run(run())
