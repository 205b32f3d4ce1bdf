"""A coordinator's control connection to a member that dies during a round.

Found by the multi-host scenario ``reconf-kill`` (``tests/hosts``): a member killed between
two steps reset its control connection; on uvloop (the broker's loop) writing the next step
raised ``RuntimeError``, which escaped the round's error handling, so the coordinator never
sent ``unlock``/``abort`` to the others and they stayed locked (and frozen) until their
leases expired.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from broker.daemon.reconfig_agent import ControlChannel
from broker.wire.protocol import HEADER_SIZE, PROTOCOL_VERSION, Welcome, encode
from reconfig.live import Step
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
