"""Overload generators on raw sockets, shared by ``tests/broker/test_overload.py`` and
``bench/bench_overload.py``: a subscriber that stops reading, a publisher that writes as
fast as the socket takes, storms of subscriptions or advertisements sent in one burst, and
a broker's memory sampled while they run.

They speak the wire protocol directly (``broker/wire/protocol.py``) so that the load is
what a misbehaving peer can do, not what the SDK's own flow control allows.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.language.grammar import parse_filter
from broker.wire.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Advertise,
    Error,
    FrameDecoder,
    Hello,
    Message,
    Ping,
    Pong,
    Publish,
    Reconf,
    Role,
    Subscribe,
    Welcome,
    encode,
)
from tests.fuzz_wire import Witness
from tests.hosts.scenarios import rss_kib


def hello(
    host: str,
    port: int,
    client_id: str,
    role: Role = Role.CLIENT,
    tls: ssl.SSLContext | None = None,
) -> socket.socket:
    """A connection past HELLO/WELCOME (over TLS with ``tls``)."""
    sock = socket.create_connection((host, port), timeout=10.0)
    if tls is not None:
        sock = tls.wrap_socket(sock, server_hostname=host)
    sock.sendall(encode(Hello(PROTOCOL_VERSION, role, client_id, {})))
    decoder = FrameDecoder(2**26)
    while True:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"{client_id}: closed before WELCOME")
        if any(isinstance(m, Welcome) for m in decoder.feed(data)):
            return sock


class Unread:
    """A client that sends requests and never reads a reply: one PUBLISH again and again,
    each answered with an ERROR several times its size (a repeated seq). Or, with
    ``control``, a broker's control connection asking ``neighbours`` again and again; or,
    with ``link``, a neighbour broker's link sending PINGs."""

    def __init__(
        self, host: str, port: int, client_id: str, control: bool = False, link: bool = False
    ) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(2.0)
        self.sock.connect((host, port))
        if control:
            hello = Hello(PROTOCOL_VERSION, Role.BROKER, client_id, {"control": True})
            self.request = encode(Reconf("neighbours", {}))
        elif link:
            hello = Hello(PROTOCOL_VERSION, Role.BROKER, client_id, {})
            self.request = encode(Ping(1))
        else:
            hello = Hello(PROTOCOL_VERSION, Role.CLIENT, client_id, {})
            self.request = encode(Publish(1, 1, {"class": "unread"}, b""))
        self.sock.sendall(encode(hello))

    def flood(self, requests: int) -> int:
        """Send up to ``requests`` requests, until the broker stops reading them (a send
        blocked for 2 s); how many were sent, about."""
        chunk = self.request * 1000
        sent = 0
        with contextlib.suppress(OSError):  # (socket.timeout: the broker reads no more)
            while sent < requests:
                self.sock.sendall(chunk)
                sent += 1000
        return sent

    def close(self) -> None:
        self.sock.close()


class Stalled:
    """A client (or a neighbour broker, ``role``) that subscribes, then never reads another
    byte, but keeps sending PINGs: its connection is congested, not silent."""

    def __init__(
        self, host: str, port: int, peer_id: str, flt: str, role: Role = Role.CLIENT
    ) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(10.0)
        self.sock.connect((host, port))
        sub_id = f"{peer_id}/c/s" if role is Role.BROKER else "s"
        self.sock.sendall(
            encode(Hello(PROTOCOL_VERSION, role, peer_id, {}))
            + encode(Subscribe(0, sub_id, parse_filter(flt)))
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

    def read_rest(self, timeout: float = 20.0) -> list[Message]:
        """Stop pinging, then read everything the broker sent until it closes (or
        ``timeout``); the frames, in order."""
        self.stop.set()
        self.thread.join(5)
        decoder = FrameDecoder(2**26)
        frames: list[Message] = []
        deadline = time.monotonic() + timeout
        self.sock.settimeout(1.0)
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            frames.extend(decoder.feed(data))
        return frames

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@dataclass
class StormResult:
    """What a burst of routing requests got back."""

    sent: int = 0
    acked: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0  # from the first request written to the last answer read
    # Answers whose request id was not above the one before: the broker answers one
    # connection's requests in the order they were sent.
    out_of_order: int = 0

    @property
    def answered(self) -> int:
        return self.acked + sum(self.errors.values())


def storm(
    host: str,
    port: int,
    client_id: str,
    count: int,
    kind: str = "sub",
    timeout: float = 120.0,
    keep: bool = False,
    on_burst: Callable[[], None] | None = None,
    tls: ssl.SSLContext | None = None,
) -> tuple[StormResult, socket.socket | None]:
    """Send ``count`` distinct SUBSCRIBEs (``kind = "sub"``) or ADVERTISEs (``"adv"``) in
    one burst on one connection and read every answer; the socket stays open when
    ``keep`` (its state lives as long as the connection). ``on_burst`` is called just
    before the burst is written (after the connection's HELLO). Over TLS (``tls``) the
    burst is written whole before the answers are read (an SSL socket cannot be written and
    read from two threads): keep it within what the socket buffers hold."""
    make = Subscribe if kind == "sub" else Advertise
    frames = b"".join(  # before HELLO: encoding takes a while, and silence is closed
        encode(make(i + 1, f"{kind}{i}", parse_filter(f"class = 'storm' and n = {i}")))
        for i in range(count)
    )
    sock = hello(host, port, client_id, tls=tls)
    result = StormResult(sent=count)
    decoder = FrameDecoder(2**26)
    last_rid = 0
    if on_burst is not None:
        on_burst()
    start = time.monotonic()
    writer = threading.Thread(target=sock.sendall, args=(frames,), daemon=True)
    if tls is None:
        writer.start()
    else:
        sock.sendall(frames)
    deadline = start + timeout
    sock.settimeout(1.0)
    while result.answered < count and time.monotonic() < deadline:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        for msg in decoder.feed(data):
            if isinstance(msg, Ack | Error):
                result.out_of_order += msg.rid <= last_rid
                last_rid = msg.rid
            if isinstance(msg, Ack):
                result.acked += 1
            elif isinstance(msg, Error):
                result.errors[msg.code] += 1
            elif isinstance(msg, Ping) and not writer.is_alive():
                # (while the burst is being written it is the activity the broker sees;
                # a PONG from this thread then would interleave with the burst's bytes)
                sock.sendall(encode(Pong(msg.token)))
    result.seconds = time.monotonic() - start
    if writer.is_alive():
        writer.join(timeout)
    if keep:
        return result, sock
    sock.close()
    return result, None


class Flooder:
    """A publisher that writes PUBLISH frames (no ACK asked) as fast as its socket takes
    them, from a thread, until stopped; TCP flow control is all that holds it back."""

    def __init__(self, host: str, port: int, client_id: str, flt: str, size: int = 4096) -> None:
        self.sock = hello(host, port, client_id)
        self.sock.sendall(encode(Advertise(0, "flood", parse_filter(flt))))
        self.size = size
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._flood, daemon=True)

    def start(self) -> None:
        self.began = time.monotonic()
        self.thread.start()

    def _flood(self) -> None:
        batch = 64
        payload = b"f" * self.size
        while not self.stop.is_set():
            frames = b"".join(
                encode(Publish(0, self.sent + i + 1, {"class": "flood"}, payload))
                for i in range(batch)
            )
            try:
                self.sock.sendall(frames)
            except OSError:
                return
            self.sent += batch

    def finish(self) -> float:
        """Stop; the rate it got out, publications per second."""
        self.stop.set()
        self.thread.join(30)
        rate = self.sent / max(1e-9, time.monotonic() - self.began)
        self.sock.close()
        return rate


class MemoryWatch:
    """Peak RSS of some processes, sampled from a thread every 0.1 s."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.before = {pid: rss_kib(pid) for pid in pids}
        self.peak = dict(self.before)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.wait(0.1):
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], rss_kib(pid))

    def finish(self) -> dict[int, tuple[int, int, int]]:
        """pid -> (before, peak, now) RSS in KiB."""
        self.stop.set()
        self.thread.join(5)
        return {pid: (self.before[pid], self.peak[pid], rss_kib(pid)) for pid in self.pids}


def round_trips(witness: Witness, count: int, seconds: float | None = None) -> list[float]:
    """``count`` publish-to-delivery round trips of ``witness`` (or as many as fit in
    ``seconds``), each in seconds."""
    times = []
    stop = time.monotonic() + seconds if seconds is not None else None
    for _ in range(count):
        if stop is not None and time.monotonic() > stop:
            break
        start = time.perf_counter()
        # No answer within the witness socket's 10 s: a stall, counted as its 10 s.
        with contextlib.suppress(TimeoutError):
            witness.check()
        times.append(time.perf_counter() - start)
    return times


def round_trips_until(witness: Witness, stop: threading.Event) -> list[float]:
    """Round trips of ``witness``, one after another, until ``stop`` is set (each in
    seconds; a stall past the witness socket's 10 s counts as 10 s)."""
    times: list[float] = []
    while not stop.is_set():
        times += round_trips(witness, 1)
    return times


def quantile(times: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``times`` (nearest rank), or NaN when there are none."""
    if not times:
        return float("nan")
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3 if times else float("nan")
