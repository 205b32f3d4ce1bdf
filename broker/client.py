"""The Trellis client SDK.

Example::

    async with Client(["127.0.0.1:7700"], client_id="ticker") as c:
        await c.advertise("class = 'stock'")
        await c.publish({"class": "stock", "symbol": "ACME", "price": 99.5}, b"hello")

    async with Client("127.0.0.1:7700") as c, c.subscribe("class = 'stock' and price < 100") as sub:
        async for msg in sub:
            print(msg.publisher, msg.seq, msg.attrs, msg.payload)

The client reconnects with jittered exponential backoff and re-sends its advertisements and
subscriptions; ``connected()``/``disconnected()`` are awaitable. Each subscription has a
bounded queue: overflow drops messages, counts them in ``dropped``, and the next read
raises ``SlowConsumerError`` once (iteration may continue after catching it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any, Self, cast

from broker.errors import (
    ERRORS_BY_CODE,
    ConnectionLost,
    PayloadTooLarge,
    ProtocolError,
    SlowConsumerError,
    TrellisError,
    TrellisTimeout,
)
from broker.filters import Filter, Value, parse_filter
from broker.protocol import (
    DEFAULT_MAX_FRAME,
    PROTOCOL_VERSION,
    Ack,
    Advertise,
    Deliver,
    Error,
    FrameDecoder,
    Hello,
    Message,
    Notice,
    Ping,
    Pong,
    Publish,
    Role,
    Subscribe,
    Unadvertise,
    Unsubscribe,
    Welcome,
    encode,
    validate_attrs,
)

__all__ = ["Client", "Delivery", "Status", "Subscription", "parse_endpoint"]

log = logging.getLogger("trellis.client")

_FRAME_OVERHEAD = 64
_CORK_LIMIT = 64 * 1024


class Status(Enum):
    """Where the client's connection stands."""

    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(slots=True)
class Delivery:
    """One publication delivered to a subscription."""

    attrs: dict[str, Value]
    payload: bytes
    publisher: str
    seq: int
    sub_id: str


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` accepted) into its parts."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint must look like HOST:PORT, got {endpoint!r}")
    return host.strip("[]"), int(port)


def _error_from_wire(err: Error) -> TrellisError:
    cls = ERRORS_BY_CODE.get(err.code, TrellisError)
    return cls(err.message)


class _Link(asyncio.Protocol):
    """One TCP connection to a broker; hands decoded frames to its ``Client``."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.decoder = FrameDecoder(max_frame=64 * 1024 * 1024)
        self.transport: asyncio.Transport | None = None
        self.welcome: asyncio.Future[Welcome] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.fatal: TrellisError | None = None
        self.out: list[bytes] = []
        self.out_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            for msg in self.decoder.feed(data):
                self.client._on_message(self, msg)
        except TrellisError as exc:
            log.warning("broker sent an invalid frame: %s", exc)
            self.fatal = exc
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.can_write.set()
        if not self.welcome.done():
            self.welcome.set_exception(
                self.fatal or ConnectionLost(f"connection closed during handshake ({exc or 'EOF'})")
            )
        if not self.lost.done():
            self.lost.set_result(exc)
        self.client._on_lost(self)

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def send(self, msg: Message) -> None:
        """Queue a frame; frames queued in one loop iteration leave in one write."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLost("not connected to a broker")
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        data = encode(msg)
        self.out.append(data)
        self.out_bytes += len(data)
        if self.out_bytes > _CORK_LIMIT:
            # A producer that never yields must still meet the transport's flow control.
            self.flush()

    def flush(self) -> None:
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()
        self.out_bytes = 0


class Subscription:
    """A live subscription: an async iterator of ``Delivery`` objects.

    Use it as ``async with client.subscribe(...) as sub``; leaving the block unsubscribes.
    """

    def __init__(self, client: Client, flt: Filter, sub_id: str, queue_size: int) -> None:
        self.client = client
        self.filter = flt
        self.id = sub_id
        # None is the end-of-subscription marker that wakes a blocked reader.
        self._queue: asyncio.Queue[Delivery | None] = asyncio.Queue(maxsize=queue_size + 1)
        self._limit = queue_size
        self.dropped = 0
        self._reported_dropped = 0
        self.active = False

    @property
    def pending(self) -> int:
        """Messages received and not yet read."""
        return self._queue.qsize()

    async def __aenter__(self) -> Self:
        await self.client._start_subscription(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unsubscribe()

    async def unsubscribe(self) -> None:
        """Stop the subscription; messages already queued can still be read."""
        if self.active:
            await self.client._stop_subscription(self)

    def _deliver(self, delivery: Delivery) -> None:
        if self._queue.qsize() >= self._limit:
            self.dropped += 1
        else:
            self._queue.put_nowait(delivery)

    def _end(self) -> None:
        if self.active:
            self.active = False
            self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        if self.dropped > self._reported_dropped:
            self._reported_dropped = self.dropped
            raise SlowConsumerError(
                f"subscription {self.id} dropped {self.dropped} messages (queue full)",
                pending=self.pending,
                dropped=self.dropped,
            )
        if not self.active and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def get(self, timeout: float | None = None) -> Delivery:
        """The next delivery, waiting at most ``timeout`` seconds (TrellisTimeout after).

        Raises:
            SlowConsumerError: messages were dropped since the last read (raised once).
            StopAsyncIteration: the subscription has ended and its queue is empty.
        """
        if self._queue.qsize() and self.dropped == self._reported_dropped:
            item = self._queue.get_nowait()
            if item is not None:
                return item
            raise StopAsyncIteration
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except TimeoutError:
            raise TrellisTimeout(f"no delivery on {self.id} within {timeout} s") from None


class Client:
    """An asynchronous connection to a Trellis broker (or to one of several endpoints).

    Args:
        endpoints: ``"host:port"`` or a list of them (tried in turn).
        client_id: this client's identity; publications carry it as ``publisher``.
        connect_timeout: bound on the first connection, retries included.
        request_timeout: bound on every acknowledged request.
        reconnect: reconnect after losing the broker (subscriptions are restored).
        max_backoff: largest pause between reconnection attempts, in seconds.
        queue_size: default bound of each subscription's queue.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        client_id: str | None = None,
        *,
        connect_timeout: float = 5.0,
        request_timeout: float = 10.0,
        reconnect: bool = True,
        max_backoff: float = 5.0,
        queue_size: int = 10_000,
    ) -> None:
        eps = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not eps:
            raise ValueError("at least one endpoint is needed")
        self.endpoints = [parse_endpoint(e) for e in eps]
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.reconnect = reconnect
        self.max_backoff = max_backoff
        self.queue_size = queue_size
        self.max_frame = DEFAULT_MAX_FRAME
        self.broker_id: str | None = None
        self._status = Status.DISCONNECTED
        self._link: _Link | None = None
        self._rids = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._seq = 0
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._advertisements: dict[str, Filter] = {}
        self._subscriptions: dict[str, Subscription] = {}
        self._connected = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._disconnected.set()
        self._supervisor: asyncio.Task[None] | None = None
        self._entered = False

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def status(self) -> Status:
        return self._status

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RuntimeError("Client is not re-entrant: leave the previous 'async with' first")
        self._entered = True
        try:
            await self.connect()
        except BaseException:
            self._entered = False
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.close()
        finally:
            self._entered = False

    async def connect(self) -> None:
        """Connect to the first reachable endpoint, within ``connect_timeout``.

        Raises:
            TrellisTimeout: no endpoint answered in time.
            ProtocolError / NotAuthorized: a broker refused the handshake.
        """
        self._status = Status.CONNECTING
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        attempt = 0
        last: Exception | None = None
        while loop.time() < deadline:
            host, port = self.endpoints[attempt % len(self.endpoints)]
            try:
                await asyncio.wait_for(self._open(host, port), max(0.01, deadline - loop.time()))
                break
            except (OSError, ConnectionLost, TimeoutError) as exc:
                last = exc
                attempt += 1
                await asyncio.sleep(min(self._backoff(attempt), max(0.0, deadline - loop.time())))
        else:
            self._status = Status.DISCONNECTED
            raise TrellisTimeout(
                f"could not connect to {self._endpoints_text()} within {self.connect_timeout:g} s"
                f" (last error: {last})"
            )
        self._supervisor = asyncio.create_task(self._supervise(), name=f"trellis-{self.client_id}")

    async def connected(self) -> None:
        """Wait until the client is connected."""
        await self._connected.wait()

    async def disconnected(self) -> None:
        """Wait until the client is not connected."""
        await self._disconnected.wait()

    async def drain(self, timeout: float | None = None) -> None:
        """Finish in-flight work: wait for outstanding acknowledgements and a broker round trip."""
        timeout = self.request_timeout if timeout is None else timeout
        if self._pending:
            await asyncio.wait_for(
                asyncio.gather(*self._pending.values(), return_exceptions=True), timeout
            )
        if self._status is Status.CONNECTED:
            await self.flush(timeout)

    async def flush(self, timeout: float | None = None) -> None:
        """Round trip to the broker: everything sent before has been processed after it."""
        await self._request(Ping, timeout)

    async def close(self) -> None:
        """Close the connection now; queued deliveries stay readable."""
        self._status = Status.CLOSED
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        link, self._link = self._link, None
        if link is not None and link.transport is not None:
            link.transport.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(link.lost), 1.0)
        self._fail_pending(ConnectionLost("client closed"))
        for sub in self._subscriptions.values():
            sub._end()
        self._connected.clear()
        self._disconnected.set()

    # -- requests -----------------------------------------------------------------------

    async def advertise(self, flt: str | Filter, adv_id: str | None = None) -> str:
        """Announce the publications this client will make; returns the advertisement id.

        Raises:
            FilterSyntaxError: the filter text does not parse.
        """
        parsed = parse_filter(flt) if isinstance(flt, str) else flt
        adv_id = adv_id or f"a{next(self._sub_ids)}"
        await self._request(lambda rid: Advertise(rid, adv_id, parsed))
        self._advertisements[adv_id] = parsed
        return adv_id

    async def unadvertise(self, adv_id: str) -> None:
        """Withdraw an advertisement."""
        self._advertisements.pop(adv_id, None)
        await self._request(lambda rid: Unadvertise(rid, adv_id))

    async def publish(
        self, attrs: Mapping[str, Value], payload: bytes = b"", *, ack: bool = True
    ) -> int:
        """Publish one message; returns its sequence number.

        With ``ack=True`` (default) returns once the broker acknowledged it. With
        ``ack=False`` returns as soon as the connection has room (flow control), which is
        how to stream at full speed; call ``drain()`` or ``flush()`` to know it arrived.

        Raises:
            InvalidRequest: the attributes are not a map of str to str/int/float/bool.
            PayloadTooLarge: the message would exceed the broker's frame limit.
            ConnectionLost: the broker went away before acknowledging.
        """
        attrs = validate_attrs("PUBLISH", dict(attrs))
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        if len(payload) + _FRAME_OVERHEAD > self.max_frame:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes exceeds the broker's frame limit "
                f"of {self.max_frame}",
                size=len(payload),
                limit=self.max_frame,
            )
        self._seq += 1
        seq = self._seq
        if ack:
            await self._request(lambda rid: Publish(rid, seq, attrs, payload))
            return seq
        link = self._link
        if link is None or self._status is not Status.CONNECTED or not link.can_write.is_set():
            link = await self._writable_link()
        link.send(Publish(0, seq, attrs, payload))
        return seq

    def subscribe(self, flt: str | Filter, *, queue_size: int | None = None) -> Subscription:
        """A subscription to use as ``async with client.subscribe("...") as sub``.

        Raises:
            FilterSyntaxError: the filter text does not parse (raised here, before any I/O).
        """
        parsed = parse_filter(flt) if isinstance(flt, str) else flt
        return Subscription(self, parsed, f"s{next(self._sub_ids)}", queue_size or self.queue_size)

    async def _start_subscription(self, sub: Subscription) -> None:
        self._subscriptions[sub.id] = sub
        sub.active = True
        try:
            await self._request(lambda rid: Subscribe(rid, sub.id, sub.filter))
        except BaseException:
            sub.active = False
            self._subscriptions.pop(sub.id, None)
            raise

    async def _stop_subscription(self, sub: Subscription) -> None:
        sub._end()
        self._subscriptions.pop(sub.id, None)
        if self._status is Status.CONNECTED:
            with contextlib.suppress(ConnectionLost):
                await self._request(lambda rid: Unsubscribe(rid, sub.id))

    # -- internals ----------------------------------------------------------------------

    def _endpoints_text(self) -> str:
        return ", ".join(f"{h}:{p}" for h, p in self.endpoints)

    def _backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_backoff, 0.05 * 2**attempt))

    async def _writable_link(self) -> _Link:
        while True:
            link = self._link
            if link is None or self._status is not Status.CONNECTED:
                if self._status is Status.CLOSED or not self.reconnect:
                    raise ConnectionLost("not connected to a broker")
                await asyncio.wait_for(self._connected.wait(), self.request_timeout)
                continue
            if not link.can_write.is_set():
                await asyncio.wait_for(link.can_write.wait(), self.request_timeout)
                continue
            return link

    async def _request(self, make: Any, timeout: float | None = None) -> None:
        link = await self._writable_link()
        rid = next(self._rids)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            link.send(make(rid))
            await asyncio.wait_for(fut, self.request_timeout if timeout is None else timeout)
        except TimeoutError:
            raise TrellisTimeout(
                f"broker did not answer within {self.request_timeout:g} s"
            ) from None
        finally:
            self._pending.pop(rid, None)

    async def _open(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(lambda: _Link(self), host, port)
        link.send(Hello(PROTOCOL_VERSION, Role.CLIENT, self.client_id, {}))
        welcome = await link.welcome
        self.broker_id = welcome.broker_id
        self.max_frame = int(welcome.options.get("max_frame", DEFAULT_MAX_FRAME))
        self._link = link
        self._status = Status.CONNECTED
        self._connected.set()
        self._disconnected.clear()
        log.debug("%s connected to broker %s at %s:%d", self.client_id, self.broker_id, host, port)

    async def _restore(self) -> None:
        """Re-send advertisements and subscriptions after a reconnect."""
        for adv_id, flt in list(self._advertisements.items()):
            await self._request(lambda rid, a=adv_id, f=flt: Advertise(rid, a, f))
        for sub in list(self._subscriptions.values()):
            await self._request(lambda rid, s=sub: Subscribe(rid, s.id, s.filter))

    async def _supervise(self) -> None:
        attempt = 0
        while self._status is not Status.CLOSED:
            link = self._link
            if link is not None:
                await asyncio.shield(link.lost)
            if self._status is Status.CLOSED or not self.reconnect:
                return
            self._status = Status.CONNECTING
            attempt += 1
            await asyncio.sleep(self._backoff(attempt))
            host, port = self.endpoints[attempt % len(self.endpoints)]
            try:
                await asyncio.wait_for(self._open(host, port), self.connect_timeout)
                await self._restore()
                attempt = 0
                log.info("%s reconnected to %s:%d", self.client_id, host, port)
            except (OSError, TrellisError, TimeoutError) as exc:
                log.debug("reconnect to %s:%d failed: %s", host, port, exc)
                self._link = None

    def _on_lost(self, link: _Link) -> None:
        if link is not self._link:
            return
        self._connected.clear()
        self._disconnected.set()
        if self._status is not Status.CLOSED:
            self._status = Status.DISCONNECTED
        reason = link.fatal or ConnectionLost("connection to the broker was lost")
        self._fail_pending(reason)

    def _fail_pending(self, exc: TrellisError) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)

    def _on_message(self, link: _Link, msg: Message) -> None:
        if type(msg) is Deliver:
            subs = self._subscriptions
            for sid in msg.sub_ids:
                sub = subs.get(sid)
                if sub is not None:
                    sub._deliver(Delivery(msg.attrs, msg.payload, msg.publisher, msg.seq, sid))
            return
        match msg:
            case Deliver(sub_ids, publisher, seq, attrs, payload):
                for sid in sub_ids:
                    sub = self._subscriptions.get(sid)
                    if sub is not None:
                        sub._deliver(Delivery(attrs, payload, publisher, seq, sid))
            case Ack(rid):
                fut = self._pending.get(rid)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            case Pong(token):
                fut = self._pending.get(token)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            case Error(rid, code, message):
                exc = _error_from_wire(msg)
                fut = self._pending.get(rid) if rid else None
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
                elif rid == 0:
                    log.warning("broker closed the connection: %s: %s", code, message)
                    link.fatal = exc
            case Welcome():
                if not link.welcome.done():
                    link.welcome.set_result(msg)
            case Ping(token):
                link.send(Pong(token))
            case Notice("dropped", data):
                for sid, count in dict(data.get("subscriptions", {})).items():
                    sub = self._subscriptions.get(sid)
                    if sub is not None:
                        sub.dropped += int(count)
            case Notice("shutdown", _):
                log.info("broker %s is shutting down", self.broker_id)
            case _:
                raise ProtocolError(f"unexpected {type(msg).__name__.upper()} from broker")
