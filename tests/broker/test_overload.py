"""Overload: a broker link that cannot keep up holds the publishers back; it does not make
the broker drop them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable

import pytest

from broker.client import Client
from broker.errors import TrellisError
from broker.language.grammar import parse_filter
from broker.tools.launcher import BrokerProcess
from broker.wire.protocol import PROTOCOL_VERSION, Hello, Ping, Role, Subscribe, encode


class StalledNeighbour:
    """A neighbour broker that subscribes, then never reads another byte, but keeps sending
    PINGs: its link is congested, not silent."""

    def __init__(self, host: str, port: int, neighbour_id: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, port))
        self.sock.sendall(
            encode(Hello(PROTOCOL_VERSION, Role.BROKER, neighbour_id, {}))
            + encode(Subscribe(0, f"{neighbour_id}/c/s", parse_filter("class = 'flood'")))
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._ping, daemon=True)
        self.thread.start()

    def _ping(self) -> None:
        token = 0
        while not self.stop.wait(0.1):
            token += 1
            with contextlib.suppress(OSError):
                self.sock.sendall(encode(Ping(token)))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.mark.slow
async def test_a_publisher_held_back_by_a_congested_link_is_not_closed_as_silent(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    broker = run_broker(
        "zz-overload",
        neighbours=[{"id": "n-stalled", "endpoint": "127.0.0.1:9", "vn": "n-stalled"}],
        heartbeat_interval=0.5,
        send_buffer_limit=64 * 1024,
        routing_wave_timeout=0.5,
    )
    stalled = StalledNeighbour(broker.host, broker.port, "n-stalled")
    try:
        async with Client(broker.endpoint, client_id="flooder", request_timeout=1.0) as pub:
            await pub.advertise("class = 'flood'")
            loop = asyncio.get_running_loop()
            until = loop.time() + 5.0  # ten heartbeat intervals of back-pressure
            while loop.time() < until:
                with contextlib.suppress(TrellisError):
                    await pub.publish({"class": "flood"}, b"x" * 4096, ack=False)
            stalled.close()  # the link goes: the broker reads the publisher again
            await pub.flush(timeout=10.0)
        log = broker.log_path.read_text(errors="replace")
        silent = [line for line in log.splitlines() if "heartbeat timeout" in line]
        assert not [line for line in silent if "flooder" in line], silent
    finally:
        stalled.close()
