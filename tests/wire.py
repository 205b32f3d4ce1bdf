"""A raw-socket peer for tests that must send what no SDK would."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

import msgpack

from broker.wire.protocol import PROTOCOL_VERSION, FrameDecoder, Message, MsgType


class RawPeer:
    """Speaks frames (or garbage) to a broker over a plain TCP stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(max_frame=64 * 1024 * 1024)
        self.inbox: list[Message] = []

    @classmethod
    async def connect(cls, endpoint: str) -> RawPeer:
        host, port = endpoint.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
        return cls(reader, writer)

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, *fields: Any) -> None:
        body = msgpack.packb(list(fields), use_bin_type=True)
        await self.send_bytes(struct.pack(">I", len(body)) + body)

    async def hello(self, client_id: str = "raw", options: dict[str, Any] | None = None) -> Message:
        await self.send(MsgType.HELLO, PROTOCOL_VERSION, "client", client_id, options or {})
        return await self.receive()

    async def receive(self, timeout: float = 5.0) -> Message:
        """The next message from the broker (EOFError when the broker closed)."""
        while not self.inbox:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise EOFError("broker closed the connection")
            self.inbox.extend(self.decoder.feed(data))
        return self.inbox.pop(0)

    async def closed_by_broker(self, timeout: float = 5.0) -> bool:
        """Read until EOF; True when the broker closed the connection."""
        try:
            while True:
                await self.receive(timeout)
        except EOFError:
            return True
        except (TimeoutError, ConnectionResetError):
            return False

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await self.writer.wait_closed()
