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
import json
import logging
import random
import secrets
import socket
import ssl
import uuid
from collections import Counter, OrderedDict, defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Self, cast

import msgpack

from broker.errors import (
    ERRORS_BY_CODE,
    ConnectionLost,
    InvalidRequest,
    ProtocolError,
    SlowConsumerError,
    TLSError,
    TrellisError,
    TrellisTimeout,
)
from broker.language.filters import Filter, Value
from broker.language.grammar import parse_filter
from broker.wire.protocol import (
    DEFAULT_MAX_FRAME,
    MARK_NOTICE,
    MARKS_OPTION,
    MAX_ATTR_NAME,
    MAX_ID_LENGTH,
    MAX_ROUND_ID,
    MAX_STRING_VALUE,
    MAX_VN_SIZE,
    PROTOCOL_VERSION,
    REPLICAS_OPTION,
    RESUMED_OPTION,
    Ack,
    Advertise,
    Deliver,
    Error,
    FrameDecoder,
    Hello,
    Leaves,
    Message,
    Notice,
    Pass,
    Ping,
    Pong,
    Publish,
    Role,
    Share,
    Shares,
    Subscribe,
    Unadvertise,
    Unsubscribe,
    Welcome,
    copy_weight,
    encode,
    encode_filter,
    forward_growth,
    key_growth,
    unforwardable,
    unroutable,
    validate_attrs,
)
from broker.wire.resend import RecentFrames
from overlay.manifest import Manifest
from security.agreement import (
    COPY_BUDGET,
    COPY_OVERHEAD,
    Blame,
    CopyBudget,
    LogRate,
    MarkRequests,
    ReplicatedStream,
    forget_idle_streams,
    worth_logging,
)
from security.envelope import Signer
from security.pass_keys import PassKeys
from security.pass_shares import Held, PassStatement, root_holdings, split_bytes, split_pass
from security.paths import KeyAssembly, RecordAllowance
from security.propagation import (
    ChainVerifier,
    LinkCertsIn,
    PropagationError,
    ShareRecord,
    pack_record,
    reconstruct,
    unpack_record,
)
from security.publication import EpochKey, SecBlock, Unsigned, publication_id, sign_pass
from security.tls import client_context, describe_tls_error

__all__ = ["Client", "Delivery", "Status", "Subscription", "parse_endpoint"]

log = logging.getLogger("trellis.client")

_FRAME_OVERHEAD = 64
_ATTR_ROOM = 4 * (MAX_ATTR_NAME + MAX_STRING_VALUE) + 16
"""An attribute's encoded bytes, at most (name and string value in UTF-8)."""
_SEC_ROOM = 4096
"""Bytes a confidential publication's frame keeps for its security block (about 200 by
the pass; up to 3.3 KiB for the record form's first of an epoch at 64 replicas)."""
_KEY_MEMORY = 4096
_MEMBERSHIP_SAID = 4
"""Membership announcements of one replica that count at once (its latest)."""
_CORK_LIMIT = 64 * 1024
RECENT_PUBLICATION_BYTES = 2 * 1024 * 1024
"""Bytes of the newest publications (``ack=False``) a client keeps per replica endpoint, to
send again when its session there resumes after a lost connection: they may have died in
the socket buffers. The broker routes each (publisher, seq) once, so the ones that did
arrive are dropped there."""
DELIVERED_MEMORY = 4
"""Publishers a subscription remembers the last delivered seq of, in units of the client's
``max_publishers`` (the streams it keeps agreement state for)."""

LAGGING_LINK_BYTES = 8 * 1024 * 1024
"""Bytes of unwritten frames past which a publication without acknowledgement skips the link
of a replica that stopped reading (its link not writable while a majority of the others take
it, see ``Client._writable_links``): that replica misses it, as a silent one would, instead of
the client buffering for it without bound for as long as that broker does not read."""
# NOTICE kind (both ways) and WELCOME option of a live membership change at the client's
# edge VN (broker.daemon.membership)
_MEMBERSHIP = "membership"
# getaddrinfo's answers that a name does not exist (not a transient resolver failure).
_UNKNOWN_HOST = {
    getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, name)
}


class Status(Enum):
    """Where the client's connection stands."""

    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(slots=True)
class Delivery:
    """One publication delivered to a subscription (``payload`` decrypted when it was
    confidential; ``confidential`` says so)."""

    attrs: dict[str, Value]
    payload: bytes
    publisher: str
    seq: int
    sub_id: str
    sec: SecBlock | None = None

    @property
    def confidential(self) -> bool:
        return self.sec is not None


def _delivery_bytes(delivery: Delivery) -> int:
    return copy_weight(delivery.payload, delivery.attrs, delivery.sec) + COPY_OVERHEAD


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` accepted) into its parts.

    Raises:
        InvalidRequest: the text is not ``HOST:PORT`` with a port in 1..65535.
    """
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"endpoint must look like HOST:PORT, got {endpoint!r}")
    return host.strip("[]"), int(port)


def _stamp(path: Path) -> tuple[int, int] | None:
    """When and how big ``path`` was last written (None: unreadable)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _load_manifest(path: str | Path) -> Manifest:
    try:
        return Manifest.load(path)
    except TrellisError:
        raise
    except (OSError, ValueError) as exc:  # a missing file, not UTF-8, not JSON
        raise InvalidRequest(f"cannot read the manifest {str(path)!r}: {exc}") from exc


def _parse_membership(
    data: object, vn: str | None
) -> tuple[int, list[tuple[str, str]], Manifest | None]:
    """(version, members with their client endpoints, manifest) of an announcement."""
    if not isinstance(data, Mapping):
        raise TypeError("not a map")
    version = data["version"]
    if type(version) is not int or version < 0:
        raise ValueError(f"version {version!r}")
    if vn is not None and data.get("vn") != vn:
        raise ValueError(f"it is about VN {data.get('vn')!r}, not {vn!r}")
    raw = data["members"]
    if not isinstance(raw, list) or not raw:
        raise ValueError("members must be a non-empty list")
    members: list[tuple[str, str]] = []
    for entry in raw:
        if (
            not isinstance(entry, list | tuple)
            or len(entry) != 2
            or not all(isinstance(x, str) for x in entry)
        ):
            raise ValueError(f"member {entry!r} is not [broker id, HOST:PORT]")
        members.append((entry[0], entry[1]))
    manifest = data.get("manifest")
    return version, members, None if manifest is None else Manifest.from_dict(manifest)


def _parse_resumed(value: object) -> tuple[frozenset[str], frozenset[str]] | None:
    """A WELCOME's ``resumed`` option: the ids the resumed session holds (None: absent).

    Raises:
        ValueError: it is not a map of two lists of strings.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"'{RESUMED_OPTION}' must be a map")
    held: list[frozenset[str]] = []
    for kind in ("advertisements", "subscriptions"):
        ids = value.get(kind, [])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"'{RESUMED_OPTION}.{kind}' must be a list of ids")
        held.append(frozenset(ids))
    return held[0], held[1]


def _error_from_wire(err: Error) -> TrellisError:
    cls = ERRORS_BY_CODE.get(err.code, TrellisError)
    return cls(err.message)


class _Link(asyncio.Protocol):
    """One TCP connection to a broker; hands decoded frames to its ``Client``."""

    def __init__(self, client: Client, index: int) -> None:
        self.client = client
        self.index = index
        self.broker_id = "?"
        self.replica = index
        self.decoder = FrameDecoder(max_frame=64 * 1024 * 1024)
        # certificate ids this connection's SHARES frames carried (one per connection)
        self.certs = LinkCertsIn()
        self.transport: asyncio.Transport | None = None
        self.welcome: asyncio.Future[Welcome] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.fatal: TrellisError | None = None
        self.out: list[bytes] = []
        self.out_bytes = 0
        # Frames in ``out`` that are not publications to keep for a resumed session (see
        # flush: the others are kept once per write, not per publication).
        self.unkept: list[bytes] = []
        # publications this link skipped while its broker lagged (LAGGING_LINK_BYTES)
        self.skipped = 0
        self.lagging = False
        self.heard = False
        # What the broker's session still held when this connection resumed it (its
        # WELCOME said): (advertisement ids, subscription ids); None: a new session.
        self.resumed: tuple[frozenset[str], frozenset[str]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.heard = True
        client = self.client
        client._reading = True
        try:
            for msg in self.decoder.feed(data):
                client._on_message(self, msg)
        except TrellisError as exc:
            log.warning("broker sent an invalid frame: %s", exc)
            self.fatal = exc
            if self.transport is not None:
                self.transport.close()
        finally:
            client._reading = False
            if client._arrived and not client._recover_due:
                # Tried once this loop iteration's reads are all in: the other replicas'
                # leaves of a pass usually come in the same iteration, and one
                # reconstruction over all of them is then also the check.
                client._recover_due = True
                asyncio.get_running_loop().call_soon(client._recover_arrived)

    def connection_lost(self, exc: Exception | None) -> None:
        self.flush()  # keeps what was queued and not written, for a resumed session
        self.can_write.set()
        self.client._links_changed.set()
        if not self.welcome.done():
            self.welcome.set_exception(self.fatal or self._handshake_lost(exc))
        if not self.lost.done():
            self.lost.set_result(exc)
        self.client._on_lost(self)

    def _handshake_lost(self, exc: Exception | None) -> TrellisError:
        host, port = self.client.endpoints[self.index]
        if self.client.tls is not None and not self.heard:
            # TLS 1.3 ends the client's handshake before the broker checks the client's
            # certificate; a broker that refuses it can only close the connection.
            given = "a certificate" if self.client.tls_cert else "no certificate"
            return TLSError(
                f"broker at {host}:{port} refused this client's certificate (it closed the "
                f"connection right after the TLS handshake; {given} was presented; the "
                f"broker's log says which check failed)",
                f"{host}:{port}",
            )
        hint = (
            ""
            if self.heard or self.client.tls
            else "; a broker that speaks TLS only needs ca=, any other closes a connection it "
            "cannot serve (out of file descriptors, say) and its log says why"
        )
        return ConnectionLost(f"connection closed during handshake ({exc or 'EOF'}){hint}")

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()
        if self.lagging:
            self.lagging = False
            log.info(
                "broker %s reads again; it missed %d publications", self.broker_id, self.skipped
            )
        self.client._links_changed.set()

    def send(self, msg: Message) -> None:
        """Queue a frame; frames queued in one loop iteration leave in one write.

        A publication without acknowledgement is also kept for a resumed session (kept even
        when the connection is closing: it is then one that did not arrive)."""
        self.send_raw(encode(msg), type(msg) is Publish and not msg.rid)

    def send_raw(self, data: bytes, keep: bool = True) -> None:
        """Queue an encoded frame; ``keep``: it is a publication to keep for a resumed
        session (a kept one sent again is kept again). A publication for a broker that
        stopped reading, with ``LAGGING_LINK_BYTES`` already waiting for it, is skipped and not
        kept: that replica misses it (a resumed session sends what is kept after what the
        broker read, so its seqs still increase there)."""
        transport = self.transport
        if keep and (
            transport is not None
            and not self.can_write.is_set()
            and self.out_bytes + transport.get_write_buffer_size() >= LAGGING_LINK_BYTES
        ):
            self.skip()
            return
        if transport is None or transport.is_closing():
            if keep:
                self.client._recent_publications[self.index].keep(data)
            raise ConnectionLost("not connected to a broker")
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(data)
        if not keep:
            self.unkept.append(data)
        self.out_bytes += len(data)
        if self.out_bytes > _CORK_LIMIT:
            # A producer that never yields must still meet the transport's flow control.
            self.flush()

    def skip(self) -> None:
        """Count a publication this link's lagging broker misses; warn once per lag."""
        self.skipped += 1
        if not self.lagging:
            self.lagging = True
            log.warning(
                "broker %s stopped reading with %d bytes waiting for it; its publications "
                "are skipped until it reads again (its replicas forward them)",
                self.broker_id,
                LAGGING_LINK_BYTES,
            )

    def close(self, at_once: bool = False) -> None:
        """Close the connection once what is queued is written; ``at_once``: drop what is
        still queued (a broker that stopped reading would otherwise keep the socket open
        after the client is closed)."""
        if self.transport is None:
            return
        if at_once and self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def finish(self) -> None:
        """End the connection as a client that is done: write what is queued, then
        half-close, so the broker reads the end of the stream and closes its side. The
        socket keeps reading meanwhile: closing it with a frame unread (the ACK of the
        replica that answered last, say) sends a reset, which the broker takes for a lost
        connection and parks the session for ``session_linger``. TLS cannot half-close:
        its close sends close_notify at once."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.flush()
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()

    def flush(self) -> None:
        """Write what is queued; the publications among it are kept for a resumed session
        whether or not the connection can still write (then they did not arrive)."""
        out = self.out
        if not out:
            return
        self.out, self.out_bytes = [], 0
        self.client._recent_publications[self.index].keep_written(out, self.unkept)
        self.unkept = []
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"".join(out))


class Subscription:
    """A live subscription: an async iterator of ``Delivery`` objects.

    Use it as ``async with client.subscribe(...) as sub``; leaving the block unsubscribes.
    When the client is connected to the replicas of a virtual node, each publication is
    delivered once, in per-publisher order, byte for byte as published, as soon as ``f + 1``
    replicas sent identical copies (:class:`security.agreement.ReplicatedStream`).
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
        # publisher -> the last seq delivered, for the latest DELIVERED_MEMORY x
        # max_publishers publishers (see _note_delivered)
        self._delivered: OrderedDict[str, int] = OrderedDict()
        # publisher -> agreed copies waiting for their key (and since when), in order
        self._confirmed: dict[str, dict[int, tuple[Delivery, float]]] = {}
        # confidential publications given up because their key never arrived (key_patience)
        self.keys_missing = 0
        self._key_timer: asyncio.TimerHandle | None = None
        # publisher -> the agreement on the copies the replicas delivered, and the bytes of
        # undecided copies per replica over all of them (a replica's lone copies for
        # publishers the others never deliver are never decided: bounded here)
        self._streams: dict[str, ReplicatedStream[int, Delivery]] = {}
        self._budget: CopyBudget[int, Delivery] = CopyBudget(
            max(COPY_BUDGET, 2 * client.max_frame), _delivery_bytes
        )
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def pending(self) -> int:
        """Messages received and not yet read."""
        return self._queue.qsize()

    @property
    def publisher_streams(self) -> int:
        """Publishers whose copy agreement this subscription keeps (``max_publishers``)."""
        return len(self._streams)

    async def __aenter__(self) -> Self:
        await self.client._start_subscription(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unsubscribe()

    async def unsubscribe(self) -> None:
        """Stop the subscription; messages already queued can still be read."""
        if self.active:
            await self.client._stop_subscription(self)

    def _offer(self, replica: int, delivery: Delivery) -> None:
        """A copy from one replica: deliver once ``f + 1`` replicas sent the same content.

        One of those replicas is honest, and an honest replica forwards every matching
        publication in publisher order, so earlier ones are never overtaken; a copy that
        differs from the agreed one is blamed on its replica (:attr:`Client.copy_blames`).
        """
        publisher, seq = delivery.publisher, delivery.seq
        client = self.client
        if client.fault_tolerance == 0 and delivery.sec is None and publisher not in self._streams:
            if seq > self._delivered.get(publisher, 0):
                self._note_delivered(publisher, seq)
                self._deliver(delivery)
            return
        stream = self._streams.get(publisher)
        if stream is None:
            if len(self._streams) >= client.max_publishers:
                forget_idle_streams(self._streams, client.max_publishers)
            stream = self._streams[publisher] = ReplicatedStream(
                client.fault_tolerance, budget=self._budget
            )
            stream.floor = self._delivered.get(publisher, 0)
        attrs = delivery.attrs
        content = (
            delivery.payload,
            delivery.sec,
            tuple(attrs.items()),
            tuple(map(type, attrs.values())),
        )
        now = asyncio.get_running_loop().time()
        self._agreed(publisher, stream, stream.offer(replica, seq, content, delivery, now))
        if stream.waiting and self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(client.copy_patience, self._expire)

    def _agreed(
        self,
        publisher: str,
        stream: ReplicatedStream[int, Delivery],
        released: list[tuple[int, Delivery]],
    ) -> None:
        if stream.blames:
            self.client._blame_copies(stream.blames)
            stream.blames.clear()
        if not released:
            return
        confirmed = self._confirmed.setdefault(publisher, {})
        now = asyncio.get_running_loop().time()
        for seq, delivery in released:
            if delivery.sec is not None and seq not in confirmed:
                self.client._await_key(publisher, delivery.sec.epoch)
            confirmed[seq] = (delivery, now)
        self._note_delivered(publisher, released[-1][0])
        self._flush(publisher)

    def _note_delivered(self, publisher: str, seq: int) -> None:
        """``seq`` is ``publisher``'s last agreed publication. Kept for the latest
        ``DELIVERED_MEMORY`` x ``max_publishers`` publishers: a subscriber outlives many
        short-lived publishers (each a new ``client-<uuid>``), and one int per publisher
        ever heard from was kept for good. A publisher let go whose copies come again is
        agreed on from scratch, as one whose stream was forgotten (``max_publishers``)."""
        delivered = self._delivered
        delivered[publisher] = seq
        delivered.move_to_end(publisher)
        if len(delivered) > DELIVERED_MEMORY * self.client.max_publishers:
            delivered.popitem(last=False)

    def _resize(self, faults: int) -> None:
        """The edge VN has a new replica count: agree on ``faults + 1`` copies from now on."""
        for publisher, stream in list(self._streams.items()):
            self._agreed(publisher, stream, stream.resize(faults))

    def _expire(self) -> None:
        """Give up on publications fewer than f + 1 replicas sent while later ones were
        agreed (the subscription was still reaching some replicas)."""
        self._expiry = None
        now = asyncio.get_running_loop().time()
        waiting = False
        for publisher, stream in self._streams.items():
            if stream.waiting:
                self._agreed(publisher, stream, stream.expire(now, self.client.copy_patience))
                waiting = waiting or bool(stream.waiting)
        if waiting and self.active:
            self._expiry = asyncio.get_running_loop().call_later(
                self.client.copy_patience / 2, self._expire
            )

    def _flush(self, publisher: str) -> None:
        """Deliver confirmed publications in order; a confidential one waits for its key,
        for ``key_patience`` seconds at most: then it is given up (``keys_missing``), so a
        key whose shares were lost on the way (a slow consumer's shares are dropped with
        its deliveries, say) holds back the publisher's later publications no longer."""
        confirmed = self._confirmed.get(publisher)
        if not confirmed:
            return
        for seq in sorted(confirmed):
            delivery, agreed = confirmed[seq]
            if delivery.sec is not None:
                plaintext = self.client._decrypt(delivery)
                if plaintext is None:
                    waited = asyncio.get_running_loop().time() - agreed
                    if waited < self.client.key_patience:
                        self._wait_for_key(self.client.key_patience - waited)
                        return
                    del confirmed[seq]
                    self.client._release_key(publisher, delivery.sec.epoch)
                    self.keys_missing += 1
                    log.warning(
                        "subscription %s: confidential publication %s/%d given up: its key "
                        "did not arrive within %g s",
                        self.id,
                        publisher,
                        seq,
                        self.client.key_patience,
                    )
                    continue
                self.client._release_key(publisher, delivery.sec.epoch)
                delivery = Delivery(
                    delivery.attrs, plaintext, publisher, seq, delivery.sub_id, delivery.sec
                )
            del confirmed[seq]
            self._deliver(delivery)
        del self._confirmed[publisher]

    def _wait_for_key(self, delay: float) -> None:
        if self._key_timer is None and self.active:
            self._key_timer = asyncio.get_running_loop().call_later(delay, self._keys_due)

    def _keys_due(self) -> None:
        """Look again at the publishers whose next publication waits for its key."""
        self._key_timer = None
        for publisher in list(self._confirmed):
            self._flush(publisher)

    def _deliver(self, delivery: Delivery) -> None:
        if self._queue.qsize() >= self._limit:
            self.dropped += 1
        else:
            self._queue.put_nowait(delivery)

    def _end(self) -> None:
        for publisher, confirmed in self._confirmed.items():
            for delivery, _ in confirmed.values():
                if delivery.sec is not None:
                    self.client._release_key(publisher, delivery.sec.epoch)
        self._confirmed.clear()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._key_timer is not None:
            self._key_timer.cancel()
            self._key_timer = None
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


class _Pending:
    """An acknowledged request sent to several replicas: settled by a majority."""

    __slots__ = ("acks", "errors", "future", "needed", "waiting")

    def __init__(self, needed: int, waiting: set[int]) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.needed = needed
        self.waiting = waiting
        self.acks = 0
        self.errors: list[TrellisError] = []

    def answer(self, replica: int, error: TrellisError | None = None) -> None:
        if replica not in self.waiting or self.future.done():
            return
        self.waiting.discard(replica)
        if error is None:
            self.acks += 1
        else:
            self.errors.append(error)
        if self.acks >= self.needed:
            self.future.set_result(None)
        elif self.acks + len(self.waiting) < self.needed:
            real = [e for e in self.errors if not isinstance(e, ConnectionLost)]
            self.future.set_exception((real or self.errors)[0])


class Client:
    """An asynchronous connection to a Trellis virtual node: one broker or its replicas.

    Args:
        endpoints: ``"host:port"``, or the list of replicas of the client's edge virtual
            node; the client keeps a connection to each, publishes and subscribes through
            all of them, and tolerates ``f = (n - 1) // 2`` faulty ones.
        client_id: this client's identity; publications carry it as ``publisher``.
        connect_timeout: bound on the first connection (a majority of replicas), retries
            included.
        request_timeout: bound on every acknowledged request.
        reconnect: reconnect after losing a broker (its subscriptions are restored).
        max_backoff: largest pause between reconnection attempts, in seconds.
        queue_size: default bound of each subscription's queue.
        first_seq: sequence number of the first publication (a publisher that restarts
            under the same ``client_id`` continues its numbering here).
        manifest: the overlay manifest (a ``Manifest`` or its JSON file): which brokers
            may sign which key share; needed to receive confidential publications.
        signer: the Ed25519 identity confidential publications are signed with (a fresh
            one by default).
        key_refresh: confidential publications share one content key for this many
            messages (1, the default, is a fresh key per message); key shares travel only
            with the first publication of each key epoch and to subscribers that join.
        key_refresh_seconds: also start a new key epoch once the current one is this old.
        copy_patience: seconds a publication fewer than ``f + 1`` replicas delivered may
            hold back later ones that ``f + 1`` replicas agreed on (while a new subscription
            reaches every replica) before it is given up.
        key_patience: seconds an agreed confidential publication waits for its key (the
            key shares travel apart from it) before it is given up and counted in the
            subscription's ``keys_missing``: a lost key holds back the publisher's later
            publications no longer than this.
        max_publishers: each subscription keeps the agreement state of at most this many
            publishers (about 1.6 KiB each); past it, that of the publishers idle longest is
            forgotten (only the last sequence delivered from each stays, so nothing is
            delivered twice).
        ca: the project CA's certificate (PEM): connect over TLS and trust brokers whose
            certificate it issued for the host name dialled. Plaintext when None.
        cert: this client's certificate (PEM, ``trellis ca issue --client``), for brokers
            that require one; with ``key``.
        key: the private key of ``cert``.
        hello_options: extra HELLO options, e.g. ``{"credentials": ...}`` from
            ``security.topics_credentials.present_credentials`` for secured topics.
        share_form: how this publisher's key shares travel: ``"pass"`` (the default: by
            the pass, :mod:`security.pass_shares`: one split, statement and frame per
            splitter, next VN and event-loop pass; half the CPU and bytes of the records)
            or ``"record"`` (one record per share with its certificate chain,
            :mod:`security.propagation`). Subscribers take either.

    Raises:
        InvalidRequest: no endpoint, or a TLS file is missing or does not match.
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
        first_seq: int = 1,
        manifest: Manifest | str | Path | None = None,
        signer: Signer | None = None,
        key_refresh: int = 1,
        key_refresh_seconds: float | None = None,
        copy_patience: float = 1.0,
        key_patience: float = 10.0,
        max_publishers: int = 4096,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        hello_options: Mapping[str, object] | None = None,
        share_form: str = "pass",
    ) -> None:
        eps = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not eps:
            raise InvalidRequest("at least one endpoint is needed")
        if ca is None and (cert is not None or key is not None):
            raise InvalidRequest("a client certificate needs the CA too (ca=): TLS trusts it")
        self.tls_cert = cert
        self.tls: ssl.SSLContext | None = None
        if ca is not None:
            self.tls = client_context(
                Path(ca), Path(cert) if cert else None, Path(key) if key else None
            )
        self.endpoints = [parse_endpoint(e) for e in eps]
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.reconnect = reconnect
        self.max_backoff = max_backoff
        self.queue_size = queue_size
        self.max_frame = DEFAULT_MAX_FRAME
        # What a FORWARD of this client's publication adds to its PUBLISH (its id).
        self._forward_room = forward_growth(self.client_id)
        self.broker_id: str | None = None
        self._count_replicas(len(self.endpoints))
        # Several endpoints of a plain broker (WELCOME says vn_size 1) are alternatives:
        # one connection at a time, to whichever answers; otherwise they are replicas.
        self.alternatives = False
        # The edge VN's membership version this client follows (-1: as given), votes for
        # newer ones (version -> announcement -> endpoint indexes that sent it), endpoints
        # of replicas that left, and the replica count key splits grow to once the new
        # replicas are connected.
        self.membership_version = -1
        self._membership_votes: dict[int, dict[str, set[int]]] = {}
        # endpoint index -> the announcements it counts for, oldest first: its latest
        # _MEMBERSHIP_SAID only (a replica announcing version after version must not grow
        # the votes; an honest one may say the next before the last was followed)
        self._membership_said: dict[int, list[tuple[int, str]]] = {}
        self._retired: set[int] = set()
        self._split_target: int | None = None
        self._ids: dict[int, str] = {}  # endpoint index -> broker id (from its WELCOME)
        self._failures: dict[int, tuple[bool, str]] = {}  # index -> (final, reason)
        # Endpoints whose TCP connection is open but whose WELCOME has not come yet.
        self._handshaking: set[int] = set()
        self._hopeless = asyncio.Event()
        self._tls_failures: set[int] = set()
        self._status = Status.DISCONNECTED
        self._links: dict[int, _Link] = {}
        # Links past WELCOME whose restore is under way: they get every routing request
        # (not yet publications), so nothing advertised meanwhile misses them.
        self._joining: dict[int, _Link] = {}
        self._rids = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._seq = first_seq - 1
        self._pending: dict[int, _Pending] = {}
        self._advertisements: dict[str, Filter] = {}
        self._subscriptions: dict[str, Subscription] = {}
        # Withdrawals (Unadvertise, Unsubscribe) waiting for a majority of links before
        # they are sent: they will reach a link being restored, which need not send them.
        self._unsent_withdrawals: Counter[tuple[type, str]] = Counter()
        # Per endpoint: publications sent without acknowledgement, sent again when a
        # session there resumes (see RECENT_PUBLICATION_BYTES).
        self._recent_publications: defaultdict[int, RecentFrames] = defaultdict(
            partial(RecentFrames, RECENT_PUBLICATION_BYTES)
        )
        self._connected = asyncio.Event()
        # Set when a link drains, comes up or goes: what a publisher held back waits for.
        self._links_changed = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._disconnected.set()
        self._supervisors: list[asyncio.Task[None]] = []
        self._supervising: dict[int, asyncio.Task[None]] = {}  # the latest task per endpoint
        self._stopping = False
        self._entered = False
        # A manifest file is read again when it changes: replicas attach and detach live,
        # and the operator writes each new membership version there.
        self._manifest_file: Path | None = None
        self._manifest_stamp: tuple[int, int] | None = None
        if manifest is not None and not isinstance(manifest, Manifest):
            self._manifest_file = Path(manifest)
            self._manifest_stamp = _stamp(self._manifest_file)
            manifest = _load_manifest(manifest)
        self.manifest = manifest
        self.signer = signer or Signer.generate(self.client_id)
        self.vn: str | None = None
        self.vn_size = len(self.endpoints)
        self._assemblies: OrderedDict[tuple[str, int], KeyAssembly] = OrderedDict()
        # epochs agreed deliveries wait on to be handed out (their assemblies, and how many
        # wait): out of _assemblies' bound until the last is out (see _await_key)
        self._awaited: dict[tuple[str, int], tuple[KeyAssembly, int]] = {}
        # each publisher's current epoch, kept when _assemblies lets it go (see _assembly)
        self._current_epochs: OrderedDict[str, KeyAssembly] = OrderedDict()
        # epochs whose shares arrived in this loop iteration's reads (tried after them)
        self._arrived: dict[tuple[str, int], KeyAssembly] = {}
        # whether a read is being handled (its epochs are tried together once the loop
        # iteration's reads are all in: _recover_arrived)
        self._reading = False
        self._recover_due = False  # _recover_arrived is scheduled
        # epochs to audit once this pass's deliveries are out (:meth:`_audit_soon`)
        self._audits: dict[tuple[str, int], KeyAssembly] = {}
        # (publisher, epoch, path) -> shares checked after the key was recovered
        self._late_audits: dict[tuple[str, int, tuple[str, ...]], int] = {}
        # Key shares by the pass this client was handed (any publisher's), and the serial
        # of the root passes it splits.
        self._passes = PassKeys()
        # What record-form shares each relay has this client hold (bounded per relay).
        self._records = RecordAllowance()
        # Epochs whose shares proved each culprit bad, and warnings about what each broker
        # or endpoint sent (for the log's rate only: _warn).
        self._share_blames = LogRate(_KEY_MEMORY)
        self._warned = LogRate()
        if share_form not in ("record", "pass"):
            raise InvalidRequest(f"share_form must be 'record' or 'pass', got {share_form!r}")
        self.share_form = share_form
        self._pass_serial = 0
        if key_refresh < 1:
            raise InvalidRequest("key_refresh must be at least 1 message")
        if first_seq < 1:
            raise InvalidRequest(f"first_seq must be at least 1, got {first_seq}")
        self.key_refresh = key_refresh
        self.key_refresh_seconds = key_refresh_seconds
        self._epoch: EpochKey | None = None
        # confidential publications of this pass (ack=False), signed together at its end
        self._unsigned: list[tuple[int, dict[str, Value], Unsigned]] = []
        # The links they were handed to (one lost before the pass ends still gets them:
        # it keeps them for its session to resume with).
        self._unsigned_links: dict[int, _Link] = {}
        self.copy_patience = copy_patience
        self.key_patience = key_patience
        if max_publishers < 1:
            raise InvalidRequest(f"max_publishers must be at least 1, got {max_publishers}")
        self.max_publishers = max_publishers
        # The publishing session, kept across reconnects: a broker refuses a new session's
        # publication numbered into an earlier session's seqs (a restart without first_seq).
        self.hello_options = {
            "session": secrets.token_hex(8),
            MARKS_OPTION: True,
            **(hello_options or {}),
        }
        # Live reconfiguration rounds' requests for a mark, by replica index.
        self._mark_requests: MarkRequests[str, int] = MarkRequests()
        self.copy_blames: dict[str, int] = {}
        """Brokers proven to have delivered an altered copy (or two versions of one
        publication) to this client, with how many times."""

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def status(self) -> Status:
        return self._status

    @property
    def replica_endpoints(self) -> list[tuple[str, int]]:
        """The edge VN's replicas this client uses: as given (all of the VN's, found from
        the one dialled, when those given reach no majority of it), then as its replicas
        announce live changes (one that joined added, one that left dropped)."""
        return [e for i, e in enumerate(self.endpoints) if i not in self._retired]

    async def __aenter__(self) -> Self:
        if self._entered:
            raise InvalidRequest("Client is not re-entrant: leave the previous 'async with' first")
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
        """Connect, returning once a majority of the replicas is up (within
        ``connect_timeout``); the rest keep being tried in the background.

        The endpoints are tried together. When they are replicas of one virtual node
        (their WELCOME says so), the client keeps a connection to each. When they are
        plain brokers, they are alternatives: the client uses the first that answers and
        fails over to another when it goes.

        Raises:
            ConnectionLost: every endpoint refused the connection or names an unknown
                host (raised as soon as that is known, not after ``connect_timeout``).
            TrellisTimeout: no majority of endpoints answered in time.
        """
        self._status = Status.CONNECTING
        self._stopping = False
        self._failures.clear()
        self._tls_failures.clear()
        self._hopeless.clear()
        self._supervisors = [
            self._supervisor(i) for i in range(len(self.endpoints)) if i not in self._retired
        ]
        waits = [asyncio.ensure_future(e.wait()) for e in (self._connected, self._hopeless)]
        try:
            await asyncio.wait(waits, timeout=self.connect_timeout, return_when="FIRST_COMPLETED")
        finally:
            for wait in waits:
                wait.cancel()
        if self._connected.is_set():
            return
        reasons = "; ".join(
            f"{h}:{p} ({self._failures[i][1]})"
            if i in self._failures
            else f"{h}:{p} (it accepted the connection but sent no WELCOME: is it a Trellis "
            "broker's client port, and is that broker answering?)"
            if i in self._handshaking
            else f"{h}:{p}"
            for i, (h, p) in enumerate(self.endpoints)
        )
        hopeless = self._hopeless.is_set()
        await self._stop_supervisors()
        # Links that did come up (fewer than a majority) end as close() ends them; they
        # stayed open before, one socket per endpoint that answered.
        await self._end_links()
        self._status = Status.DISCONNECTED
        if hopeless and all(i in self._tls_failures for i in range(len(self.endpoints))):
            raise TLSError(f"could not connect to {reasons}")
        if hopeless:
            raise ConnectionLost(f"could not connect to {reasons}")
        raise TrellisTimeout(f"could not connect to {reasons} within {self.connect_timeout:g} s")

    async def connected(self) -> None:
        """Wait until the client is connected (to a majority of replicas)."""
        await self._connected.wait()

    async def disconnected(self) -> None:
        """Wait until the client is not connected."""
        await self._disconnected.wait()

    async def drain(self, timeout: float | None = None) -> None:
        """Finish in-flight work: wait for outstanding acknowledgements and a broker round trip.

        Args:
            timeout: bound on the whole wait, in seconds (default ``request_timeout``).

        Raises:
            TrellisTimeout: the brokers did not answer within ``timeout``.
            ConnectionLost: the brokers went away before answering the round trip.
        """
        timeout = self.request_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._pending:
            # asyncio.wait, not wait_for(gather(...)): a timeout must not cancel the futures
            # that other tasks' requests are still waiting on.
            futures = [p.future for p in self._pending.values()]
            _, late = await asyncio.wait(futures, timeout=timeout)
            if late:
                raise TrellisTimeout(
                    f"{len(late)} requests still unacknowledged after {timeout:g} s"
                )
        if self._status is Status.CONNECTED:
            await self.flush(max(0.0, deadline - loop.time()))

    async def flush(self, timeout: float | None = None) -> None:
        """Round trip to the brokers: everything sent before has been processed after it.

        Args:
            timeout: bound on the round trip, in seconds (default ``request_timeout``).

        Raises:
            TrellisTimeout: the brokers did not answer within ``timeout``.
            ConnectionLost: no majority of brokers is reachable.
        """
        await self._request(Ping, timeout)

    async def close(self) -> None:
        """Close the connections now; queued deliveries stay readable."""
        self._sign_pending()
        self._status = Status.CLOSED
        await self._stop_supervisors()
        await self._end_links()
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(ConnectionLost("client closed"))
        for sub in self._subscriptions.values():
            sub._end()
        self._connected.clear()
        self._disconnected.set()

    async def _end_links(self) -> None:
        """Half-close every link (:meth:`_Link.finish`), then close each within a second."""
        links, self._links = list(self._links.values()), {}
        for link in links:
            link.finish()
        for link in links:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(link.lost), 1.0)
            link.close(at_once=True)  # a broker that did not close its side within the second

    def _supervisor(self, index: int) -> asyncio.Task[None]:
        task = asyncio.create_task(self._supervise(index), name=f"trellis-{self.client_id}-{index}")
        self._supervising[index] = task
        return task

    async def _stop_supervisors(self) -> None:
        self._stopping = True
        tasks, self._supervisors = self._supervisors, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    # -- requests -----------------------------------------------------------------------

    async def advertise(self, flt: str | Filter, adv_id: str | None = None) -> str:
        """Announce the publications this client will make; returns the advertisement id.

        Raises:
            FilterSyntaxError: the filter text does not parse.
            FilterError: no publication could ever match the filter.
            InvalidRequest: ``adv_id`` is empty or longer than 256 characters.
            PayloadTooLarge: the filter is too large for a broker to forward.
        """
        parsed = parse_filter(flt) if isinstance(flt, str) else flt.require_satisfiable()
        adv_id = adv_id or f"a{next(self._sub_ids)}"
        self._check_routable("ADVERTISE", adv_id, parsed)
        self._advertisements[adv_id] = parsed
        try:
            await self._request(lambda rid: Advertise(rid, adv_id, parsed))
        except BaseException:
            self._advertisements.pop(adv_id, None)
            raise
        return adv_id

    async def unadvertise(self, adv_id: str) -> None:
        """Withdraw an advertisement."""
        self._advertisements.pop(adv_id, None)
        await self._request(lambda rid: Unadvertise(rid, adv_id), withdraws=(Unadvertise, adv_id))

    async def publish(
        self,
        attrs: Mapping[str, Value],
        payload: bytes = b"",
        *,
        ack: bool = True,
        confidential: bool = False,
    ) -> int:
        """Publish one message; returns its sequence number.

        With ``confidential=True`` the payload is encrypted under a fresh AES-256-GCM key,
        signed, and the key travels as Shamir shares, one per replica of the edge VN,
        re-split at every hop; brokers never hold enough shares to learn it.

        With ``ack=True`` (default) returns once the broker (a majority of replicas)
        acknowledged it. With ``ack=False`` returns as soon as the connections have room
        (flow control), which is how to stream at full speed; call ``drain()`` or
        ``flush()`` to know it arrived.

        Raises:
            InvalidRequest: the attributes are not a map of str to str/int/float/bool, or
                the payload is not bytes.
            PayloadTooLarge: the message would exceed the broker's frame limit.
            ConnectionLost: the broker went away before acknowledging.
            TrellisTimeout: no acknowledgement (``ack=True``) or no room to write
                (``ack=False``) within ``request_timeout``.
        """
        attrs = validate_attrs("PUBLISH", dict(attrs) if isinstance(attrs, Mapping) else attrs)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidRequest(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        self._check_forwardable(attrs, payload, confidential)
        self._seq += 1
        seq = self._seq
        if confidential:
            await self._publish_confidential(seq, attrs, payload, ack)
            return seq
        if self._unsigned:
            self._sign_pending()  # confidential ones queued before this go first
        if ack:
            await self._request(lambda rid: Publish(rid, seq, attrs, payload))
            return seq
        # A link found closing here (its loss not handled yet) keeps the publication for
        # its session to resume with, and does not stop the others.
        links = self._links
        if len(links) == 1 and not self._joining and self._status is Status.CONNECTED:
            (link,) = links.values()
            if link.can_write.is_set():
                # (not contextlib.suppress: its context manager per publication was 2 % of
                # the publisher's CPU)
                try:  # noqa: SIM105
                    link.send(Publish(0, seq, attrs, payload))
                except ConnectionLost:
                    pass
                return seq
        msg = Publish(0, seq, attrs, payload)
        for link in await self._writable_links():
            with contextlib.suppress(ConnectionLost):
                link.send(msg)
        return seq

    def _check_forwardable(
        self, attrs: dict[str, Value], payload: bytes, confidential: bool
    ) -> None:
        """Refuse a publication whose frame a broker could not forward (the broker refuses
        it too, with the same error; here it is refused before it is numbered). Its
        attributes are measured only when they could matter: the usual publication is far
        below the limit, and this runs for every one."""
        limit = self.max_frame - self._forward_room
        if confidential:
            limit -= _SEC_ROOM
        size = len(payload) + _FRAME_OVERHEAD
        if size + len(attrs) * _ATTR_ROOM > limit:
            size += len(msgpack.packb(attrs))
            if size > limit:
                raise unforwardable(size, limit)

    async def _publish_confidential(
        self, seq: int, attrs: dict[str, Value], payload: bytes, ack: bool
    ) -> None:
        if self._status is not Status.CONNECTED:
            await self._wait_connected()
        assert self.vn is not None
        if not ack:
            # flow control before queueing, as for plain
            for link in await self._writable_links():
                self._unsigned_links.setdefault(link.index, link)
        epoch = self._epoch
        if epoch is None or epoch.expired(self.key_refresh, self.key_refresh_seconds):
            epoch = self._epoch = EpochKey.start(
                self.signer, seq, self.vn, self.vn_size, by_pass=self.share_form == "pass"
            )
        unsigned = epoch.prepare(self.signer, seq, attrs, payload)
        if not ack:
            # Signed with the rest of this pass (one signature, verified once per edge
            # replica) and sent at its end, before anything else this client sends.
            if not self._unsigned:
                asyncio.get_running_loop().call_soon(self._sign_pending)
            self._unsigned.append((seq, attrs, unsigned))
            return
        self._sign_pending()
        (sec,) = sign_pass(self.signer, [unsigned])
        roots = self._root_passes([unsigned])
        if roots:
            self._send_root_passes(roots, await self._request_links())
        await self._request_per_link(
            lambda rid, link: self._confidential_publish(rid, seq, attrs, unsigned, sec, link)
        )

    def _confidential_publish(
        self,
        rid: int,
        seq: int,
        attrs: dict[str, Value],
        unsigned: Unsigned,
        sec: SecBlock,
        link: _Link,
    ) -> Publish:
        """The PUBLISH one replica is sent: with its share when the publication opens its
        key epoch."""
        records = unsigned.epoch.records
        if not unsigned.opens or link.replica >= len(records):
            # (a replica that joined after the epoch was split holds no share of it)
            return Publish(rid, seq, attrs, unsigned.sealed, sec)
        share = pack_record(records[link.replica])
        return Publish(rid, seq, attrs, unsigned.sealed, sec.with_share(share))

    def _sign_pending(self) -> None:
        """Sign the confidential publications queued in this pass and send them, in order."""
        pending, self._unsigned = self._unsigned, []
        handed, self._unsigned_links = self._unsigned_links, {}
        if not pending:
            return
        secs = sign_pass(self.signer, [unsigned for _, _, unsigned in pending])
        links = list({**handed, **self._links, **self._joining}.values())
        roots = self._root_passes([unsigned for _, _, unsigned in pending])
        if roots:
            self._send_root_passes(roots, links)
        for (seq, attrs, unsigned), sec in zip(pending, secs, strict=True):
            for link in links:
                with contextlib.suppress(ConnectionLost):
                    link.send(self._confidential_publish(0, seq, attrs, unsigned, sec, link))

    def _root_passes(self, pending: Sequence[Unsigned]) -> list[tuple[PassStatement, list[bytes]]]:
        """The root splits of the epochs ``pending`` opens by the pass: one statement and
        one blob per edge replica for all of them (per edge VN and replica count)."""
        groups: dict[tuple[str, int], list[tuple[bytes, bytes]]] = {}
        for unsigned in pending:
            epoch = unsigned.epoch
            if unsigned.opens and epoch.by_pass:
                root = (publication_id(self.signer.id, epoch.first_seq), epoch.key)
                groups.setdefault((epoch.vn, epoch.replicas), []).append(root)
        passes = []
        budget = self.max_frame // 2
        for (vn, r), roots in groups.items():
            # A burst of epochs in one pass is split in pieces each edge replica's frame
            # limit admits (one PASS over it would close the link with every key in it).
            piece: list[Held] = []
            size = 0
            for held in root_holdings(roots):
                cost = split_bytes(held, r)
                if piece and size + cost > budget:
                    passes.append(self._root_pass(vn, r, piece))
                    piece, size = [], 0
                piece.append(held)
                size += cost
            passes.append(self._root_pass(vn, r, piece))
        return passes

    def _root_pass(self, vn: str, r: int, held: list[Held]) -> tuple[PassStatement, list[bytes]]:
        self._pass_serial += 1
        return split_pass(self.signer, vn, self._pass_serial, r, held)

    @staticmethod
    def _send_root_passes(
        roots: list[tuple[PassStatement, list[bytes]]], links: Iterable[_Link]
    ) -> None:
        """Each edge replica its blob of the root passes, before the PUBLISHes they key
        (kept, like them, for a resumed session)."""
        for link in links:
            for statement, blobs in roots:
                if link.replica < len(blobs):
                    frame = encode(
                        Pass([], statement.raw, statement.signature, blobs[link.replica])
                    )
                    with contextlib.suppress(ConnectionLost):
                        link.send_raw(frame)

    def _mark_asked(self, replica: int, data: Mapping[str, Any]) -> None:
        """A replica of the edge VN asks for a mark of a reconfiguration round: once
        ``f + 1`` distinct replicas asked (one of them honest, and frozen), write one mark to
        every replica, after everything published so far (queued confidential ones too), so
        that all honest replicas switch tables at the same publication."""
        round_id = data.get("round")
        if (
            type(round_id) is not str
            or len(round_id) > MAX_ROUND_ID
            or not self._mark_requests.ask(round_id, replica, self.fault_tolerance + 1)
        ):
            return  # (a round's name is short: a long one is only kept, never matched)
        self._sign_pending()
        mark = Notice(MARK_NOTICE, {"round": round_id})
        for link in list(self._links.values()):
            with contextlib.suppress(ConnectionLost):
                link.send(mark)

    def subscribe(self, flt: str | Filter, *, queue_size: int | None = None) -> Subscription:
        """A subscription to use as ``async with client.subscribe("...") as sub``.

        Raises:
            FilterSyntaxError: the filter text does not parse (raised here, before any I/O).
            FilterError: no publication could ever match the filter (also raised here).
            PayloadTooLarge: the filter is too large for a broker to forward (also here).
        """
        parsed = parse_filter(flt) if isinstance(flt, str) else flt.require_satisfiable()
        sub_id = f"s{next(self._sub_ids)}"
        self._check_routable("SUBSCRIBE", sub_id, parsed)
        return Subscription(self, parsed, sub_id, queue_size or self.queue_size)

    def _check_routable(self, name: str, key: str, flt: Filter) -> None:
        """Refuse here what a broker would refuse: a key that is not an id, or a filter
        whose frame, forwarded under ``broker/client/key``, would outweigh ``max_frame``
        (refused by the broker too; the client used to send it again at every reconnect).
        Broker ids are counted at their longest (256 characters)."""
        if not key or len(key) > MAX_ID_LENGTH:
            raise InvalidRequest(
                f"{name} key must be a non-empty string of at most {MAX_ID_LENGTH} characters"
            )
        limit = self.max_frame - key_growth("b" * MAX_ID_LENGTH, self.client_id)
        size = len(encode_filter(flt)) + len(key.encode()) + _FRAME_OVERHEAD
        if size > limit:
            raise unroutable(name, size, limit)

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
                await self._request(
                    lambda rid: Unsubscribe(rid, sub.id), withdraws=(Unsubscribe, sub.id)
                )

    # -- internals ----------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_backoff, 0.05 * 2**attempt))

    async def _wait_connected(self) -> None:
        if self._status is Status.CLOSED or (
            not self.reconnect and self._status is not Status.CONNECTED
        ):
            raise ConnectionLost("not connected to a broker")
        try:
            await asyncio.wait_for(self._connected.wait(), self.request_timeout)
        except TimeoutError:
            raise ConnectionLost(
                f"no majority of brokers reachable within {self.request_timeout:g} s"
            ) from None

    async def _writable_links(self) -> list[_Link]:
        """The links a publication goes to, once a majority of the connected ones has room
        to write: whichever they are, so one broker slow to drain (its TCP back-off after a
        partition, say) does not hold a publisher back while the others take its
        publications. Links still joining (their restored state not yet acknowledged) get
        it too, behind that state: a replica reached just after ``connect()`` returned
        would otherwise miss every publication until its join completed, and with it the
        VN would forward them from one replica fewer than it has (one Byzantine replica
        among the others then stops them)."""
        while True:
            if self._status is not Status.CONNECTED:
                await self._wait_connected()
                continue
            links = list(self._links.values())
            if sum(link.can_write.is_set() for link in links) >= self.quorum:
                return [*links, *self._joining.values()]
            self._links_changed.clear()
            try:
                async with asyncio.timeout(self.request_timeout):
                    await self._links_changed.wait()
            except TimeoutError:
                raise TrellisTimeout(
                    f"brokers accepted no more data within {self.request_timeout:g} s"
                ) from None

    async def _request(
        self,
        make: Callable[[int], Message],
        timeout: float | None = None,
        withdraws: tuple[type, str] | None = None,
    ) -> None:
        """Send one request to every link and wait until a majority settled it.

        ``withdraws``: the request withdraws this (kind, id); until it is sent, a link that
        is restored leaves the withdrawal to it (see :meth:`_restore`)."""
        if withdraws is None:
            links = await self._request_links()
        else:
            self._unsent_withdrawals[withdraws] += 1
            try:
                links = await self._request_links()
            finally:
                self._unsent_withdrawals[withdraws] -= 1
                if not self._unsent_withdrawals[withdraws]:
                    del self._unsent_withdrawals[withdraws]
        rid = next(self._rids)
        msg = make(rid)
        await self._settle(rid, [(link, msg) for link in links], self.quorum, timeout)

    async def _request_per_link(
        self, make: Callable[[int, _Link], Message], timeout: float | None = None
    ) -> None:
        """Send each link its own version of one request and wait until it is settled."""
        links = await self._request_links()
        rid = next(self._rids)
        await self._settle(rid, [(link, make(rid, link)) for link in links], self.quorum, timeout)

    async def _request_links(self) -> list[_Link]:
        """The links a routing request goes to: the connected ones and those restoring."""
        if self._status is not Status.CONNECTED:
            await self._wait_connected()
        return [*self._links.values(), *self._joining.values()]

    async def _settle(
        self,
        rid: int,
        requests: Sequence[tuple[_Link, Message]],
        needed: int,
        timeout: float | None,
    ) -> None:
        """Send the requests; return once ``needed`` links acknowledged."""
        timeout = self.request_timeout if timeout is None else timeout
        self._sign_pending()  # publications queued before this request go first
        pending = _Pending(needed, {link.index for link, _ in requests})
        self._pending[rid] = pending
        try:
            for link, msg in requests:
                try:
                    link.send(msg)
                except ConnectionLost as exc:
                    pending.answer(link.index, exc)
            async with asyncio.timeout(timeout):
                await asyncio.shield(pending.future)
        except TrellisError:  # a broker's own answer, TrellisTimeout included
            raise
        except TimeoutError:
            raise TrellisTimeout(f"broker did not answer within {timeout:g} s") from None
        finally:
            self._pending.pop(rid, None)
            if not pending.future.done():
                pending.future.cancel()

    async def _open(self, index: int) -> _Link:
        host, port = self.endpoints[index]
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {"ssl": self.tls, "ssl_handshake_timeout": self.connect_timeout}
        try:
            _, link = await loop.create_connection(lambda: _Link(self, index), host, port, **tls)
        except ssl.SSLError as exc:
            raise TLSError(
                f"TLS with the broker at {host}:{port} failed: {describe_tls_error(exc)}",
                f"{host}:{port}",
            ) from None
        self._handshaking.add(index)
        try:
            link.send(Hello(PROTOCOL_VERSION, Role.CLIENT, self.client_id, self.hello_options))
            welcome = await link.welcome
            options = welcome.options
            replica = int(options.get("replica", index))
            vn_size = int(options.get("vn_size", len(self.endpoints)))
            max_frame = int(options.get("max_frame", DEFAULT_MAX_FRAME))
            if replica < 0 or not 1 <= vn_size <= MAX_VN_SIZE:
                raise ValueError(f"replica {replica} of {vn_size} (at most {MAX_VN_SIZE})")
            if max_frame < 1:
                raise ValueError(f"max_frame {max_frame}")
            link.resumed = _parse_resumed(options.get(RESUMED_OPTION))
        except (TypeError, ValueError) as exc:
            link.close()
            raise ProtocolError(f"invalid WELCOME from {host}:{port}: {exc}") from None
        except BaseException:
            # A connect_timeout during the handshake must not leave the socket open.
            link.close()
            raise
        finally:
            self._handshaking.discard(index)
        if (
            vn_size == 1
            and len(self.endpoints) > 1
            and not self.alternatives
            # A replica that joined the edge VN may welcome before it adopted the version
            # that added it (vn_size 1 then): endpoints learned from an announcement are
            # replicas, never alternatives.
            and self.membership_version < 0
        ):
            log.debug("%s: the endpoints are alternatives (plain brokers)", self.client_id)
            self.alternatives = True
            self.quorum = 1
            self.fault_tolerance = 0
        vn = str(options.get("vn", welcome.broker_id))
        if vn_size > 1 and not self.alternatives and self.vn is not None and vn != self.vn:
            # Replicas of two VNs: each would hold what this client sends alone, fewer than
            # f + 1 of its VN, and forward none of it. Refused, and retried like any failure.
            link.close()
            raise InvalidRequest(
                f"{welcome.broker_id} at {host}:{port} is a replica of VN {vn}, the other "
                f"endpoints of VN {self.vn}: give the replicas of one VN, the client's edge VN"
            )
        link.broker_id = welcome.broker_id
        link.replica = replica
        self._ids[index] = welcome.broker_id
        self.vn = vn
        if self.membership_version < 0 and _MEMBERSHIP not in options:
            # (after a live change the announcement says, once f + 1 replicas agree: until
            # then the count the endpoints given had, which the manifest still allows)
            self.vn_size = vn_size
        self.max_frame = max_frame
        if _MEMBERSHIP in options:
            self._membership_heard(index, options[_MEMBERSHIP], link)
        elif REPLICAS_OPTION in options:
            self._discover_replicas(options[REPLICAS_OPTION], vn_size)
        log.debug(
            "%s connected to broker %s at %s:%d", self.client_id, welcome.broker_id, host, port
        )
        return link

    async def _restore(self, link: _Link) -> None:
        """Re-send advertisements and subscriptions to one (re)connected broker.

        The snapshot, its frames and the link's entry into ``_joining`` happen in one step:
        a request made afterwards goes to this link too, behind the snapshot on the same
        connection, so the broker holds every advertisement before the link carries a
        publication (frames on one connection stay in order).
        """
        requests: list[tuple[int, Message]] = []
        if link.resumed is not None:
            # The session kept what it held while the connection was down: withdraw what
            # this client dropped meanwhile and did not send this link (what it still holds
            # is sent again below; a withdrawal still waiting to be sent will reach it).
            held_advertisements, held_subscriptions = link.resumed
            unsent = self._unsent_withdrawals
            for adv_id in sorted(held_advertisements - self._advertisements.keys()):
                if (Unadvertise, adv_id) not in unsent:
                    rid = next(self._rids)
                    requests.append((rid, Unadvertise(rid, adv_id)))
            for sub_id in sorted(held_subscriptions - self._subscriptions.keys()):
                if (Unsubscribe, sub_id) not in unsent:
                    rid = next(self._rids)
                    requests.append((rid, Unsubscribe(rid, sub_id)))
        for adv_id, flt in self._advertisements.items():
            rid = next(self._rids)
            requests.append((rid, Advertise(rid, adv_id, flt)))
        for sub in self._subscriptions.values():
            rid = next(self._rids)
            requests.append((rid, Subscribe(rid, sub.id, sub.filter)))
        recent = self._recent_publications[link.index].take()
        pendings = []
        try:
            for rid, msg in requests:
                pending = self._pending[rid] = _Pending(1, {link.index})
                pendings.append((rid, pending))
                link.send(msg)
            if link.resumed is not None:
                # Publications sent just before the connection was lost, in order and
                # before any new one (the broker drops those it had routed already).
                for frame in recent:
                    link.send_raw(frame)
            self._joining[link.index] = link
            async with asyncio.timeout(self.request_timeout):
                for _, pending in pendings:
                    await asyncio.shield(pending.future)
        except TimeoutError:
            raise TrellisTimeout(
                f"broker did not confirm the restored state within {self.request_timeout:g} s"
            ) from None
        finally:
            if self._joining.get(link.index) is link:
                del self._joining[link.index]
            for rid, pending in pendings:
                self._pending.pop(rid, None)
                if not pending.future.done():
                    pending.future.cancel()

    def _update_status(self) -> None:
        if self._status is Status.CLOSED:
            return
        if len(self._links) >= self.quorum:
            self._status = Status.CONNECTED
            self._connected.set()
            self._disconnected.clear()
        else:
            self._status = Status.DISCONNECTED
            self._connected.clear()
            self._disconnected.set()

    def _active_alternative(self, index: int) -> _Link | None:
        """With alternatives, the link of another endpoint that is in use, if any."""
        if not self.alternatives:
            return None
        for links in (self._links, self._joining):
            for i, link in links.items():
                if i != index:
                    return link
        return None

    def _connect_failed(self, index: int, exc: BaseException) -> None:
        """Note why an endpoint failed; give up the first connect once none can succeed."""
        if isinstance(exc, ConnectionRefusedError):
            final, reason = True, "connection refused"
        elif isinstance(exc, TLSError):
            final, reason = True, exc.message
        elif isinstance(exc, socket.gaierror) and exc.errno in _UNKNOWN_HOST:
            final, reason = True, "unknown host"
        elif isinstance(exc, TimeoutError):
            final, reason = False, "timed out"
        else:
            final, reason = False, str(exc) or type(exc).__name__
        self._failures[index] = (final, reason)
        if isinstance(exc, TLSError):
            self._tls_failures.add(index)
        else:
            self._tls_failures.discard(index)
        if (
            self._status is Status.CONNECTING
            and not self._links
            and not self._joining
            and len(self._failures) == len(self.endpoints)
            and all(final for final, _ in self._failures.values())
        ):
            self._hopeless.set()

    async def _supervise(self, index: int) -> None:
        """Keep the connection to one endpoint open, restoring state on every reconnect."""
        attempt = 0
        first = True
        while self._status is not Status.CLOSED and not self._stopping:
            if index in self._retired:
                return
            if not first:
                if not self.reconnect:
                    return
                attempt += 1
                await asyncio.sleep(self._backoff(attempt))
            first = False
            active = self._active_alternative(index)
            if active is not None:
                await asyncio.shield(active.lost)  # fail over once the one in use goes
                attempt = 0
                continue
            host, port = self.endpoints[index]
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races with completion, and a supervisor must always stop when told.
                async with asyncio.timeout(self.connect_timeout):
                    link = await self._open(index)
            except (OSError, TrellisError, TimeoutError) as exc:
                log.debug("connect to %s:%d failed: %s", host, port, exc)
                self._connect_failed(index, exc)
                continue
            self._failures.pop(index, None)
            self._tls_failures.discard(index)
            if self._active_alternative(index) is not None:
                link.close()  # another alternative answered first
                continue
            try:
                await self._restore(link)
            except (TrellisError, TimeoutError) as exc:
                log.warning("restoring state at %s:%d failed: %s", host, port, exc)
                link.close()
                continue
            except BaseException:
                # Cancelled (close() or connect() gave up): end it as close() ends the
                # others (a reset would park the session), and close it in a second at most.
                link.finish()
                asyncio.get_running_loop().call_later(1.0, link.close)
                raise
            if link.lost.done():
                continue
            if index in self._retired:
                link.close()
                return
            self._links[index] = link
            self._links_changed.set()
            self.broker_id = link.broker_id
            self._update_status()
            self._grow_split()
            if attempt:
                log.info("%s reconnected to %s:%d", self.client_id, host, port)
            attempt = 0
            await asyncio.shield(link.lost)

    def _on_lost(self, link: _Link) -> None:
        reason = link.fatal or ConnectionLost("connection to the broker was lost")
        for pending in list(self._pending.values()):
            pending.answer(link.index, reason)
        if self._joining.get(link.index) is link:
            del self._joining[link.index]
        if self._links.get(link.index) is link:
            del self._links[link.index]
            self._update_status()

    # -- membership of the edge VN -------------------------------------------------------

    def _membership_heard(self, index: int, data: object, link: _Link | None = None) -> None:
        """One replica's word that the edge VN's membership changed (NOTICE or WELCOME).

        Followed once ``f + 1`` endpoints sent the identical announcement: one of them is an
        honest replica, which says only what the operator made every broker adopt."""
        if self.alternatives:
            return
        try:
            version, members, manifest = _parse_membership(data, self.vn)
        except (TypeError, ValueError, KeyError) as exc:
            self._warn(
                f"endpoint {index}",
                "invalid membership announcement from endpoint %d: %s",
                index,
                exc,
            )
            return
        if version <= self.membership_version:
            # Already followed (a replica that adopted the version after this client
            # connected to it tells it again): say so, or the operator waits for it.
            link = link or self._links.get(index) or self._joining.get(index)
            if link is not None:
                with contextlib.suppress(ConnectionLost):
                    link.send(Notice(_MEMBERSHIP, {"version": self.membership_version}))
            return
        said = json.dumps(data, sort_keys=True, default=repr)
        votes = self._membership_votes
        mine = self._membership_said.setdefault(index, [])
        if (version, said) not in mine:
            mine.append((version, said))
            if len(mine) > _MEMBERSHIP_SAID:
                old_version, old_said = mine.pop(0)
                by_text = votes.get(old_version, {})
                old_voters = by_text.get(old_said)
                if old_voters is not None:
                    old_voters.discard(index)
                    if not old_voters:
                        del by_text[old_said]
                if not by_text:
                    votes.pop(old_version, None)
        voters = votes.setdefault(version, {}).setdefault(said, set())
        voters.add(index)
        if len(voters) >= self.fault_tolerance + 1:
            self._follow_membership(version, members, manifest)

    def _follow_membership(
        self, version: int, members: list[tuple[str, str]], manifest: Manifest | None
    ) -> None:
        """Switch to the edge VN's new members: connect to replicas that joined, leave those
        that left, count ``f' + 1`` copies, and split keys for the new replica count (a
        larger one once the joining replicas are connected)."""
        self.membership_version = version
        self._membership_votes = {v: c for v, c in self._membership_votes.items() if v > version}
        if (
            manifest is not None
            and self.manifest is not None
            and manifest.version > self.manifest.version
        ):
            self.manifest = manifest
        ids = {b for b, _ in members}
        assigned: dict[str, int] = {}
        for member, endpoint in members:
            index = self._endpoint_of(member, endpoint, set(assigned.values()))
            if index is not None:
                assigned[member] = index
        kept = set(assigned.values())
        leaving = [
            i
            for i in range(len(self.endpoints))
            if i not in kept
            and i not in self._retired
            and (
                (i in self._ids and self._ids[i] not in ids)
                or (i not in self._ids and len(assigned) == len(members))
            )
        ]
        size = len(members)
        self._count_replicas(size)
        for sub in list(self._subscriptions.values()):
            sub._resize(self.fault_tolerance)
        ack = Notice(_MEMBERSHIP, {"version": version})
        for link in [*self._links.values(), *self._joining.values()]:
            with contextlib.suppress(ConnectionLost):
                link.send(ack)
        for index in leaving:
            self._retire(index)
        if size < self.vn_size:
            self.vn_size = size
            self._epoch = None  # the next key epoch is split for the members in force
        elif size > self.vn_size:
            self._split_target = size
        self._grow_split()
        self._update_status()
        log.info(
            "%s follows membership version %d of %s: %s",
            self.client_id,
            version,
            self.vn,
            ", ".join(b for b, _ in members),
        )

    def _discover_replicas(self, data: object, vn_size: int) -> None:
        """Connect to the rest of the edge VN when the endpoints given cannot reach a
        majority of it (one replica of three, say): what this client publishes or subscribes
        would be held by fewer than ``f + 1`` replicas and never forwarded beyond the VN.
        The replicas come from the WELCOME of the replica dialled, which the client trusts
        with everything already; ``connect()`` then returns once a majority is up."""
        if (
            self.alternatives
            or self.membership_version >= 0
            or len(self.replica_endpoints) >= vn_size // 2 + 1
        ):
            return
        if not (
            isinstance(data, list)
            and len(data) == vn_size
            and all(
                isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m)
                for m in data
            )
        ):
            log.warning("invalid '%s' in WELCOME: %r", REPLICAS_OPTION, data)
            return
        given = len(self.endpoints)
        taken: set[int] = set()
        for member, endpoint in data:
            index = self._endpoint_of(member, endpoint, taken)
            if index is not None:
                taken.add(index)
        self._count_replicas(vn_size)
        log.info(
            "%s: given %d endpoint(s) of the %d replicas of VN %s: connecting to all of them",
            self.client_id,
            given,
            vn_size,
            self.vn,
        )

    def _count_replicas(self, size: int) -> None:
        """The edge VN has ``size`` replicas: tolerate ``f = (size - 1) // 2`` faulty ones
        and need a majority of them."""
        self.fault_tolerance = (size - 1) // 2
        self.quorum = size // 2 + 1

    def _endpoint_of(self, member: str, endpoint: str, taken: set[int]) -> int | None:
        """The endpoint index of ``member``: known by its WELCOME, else by its address,
        else a new endpoint (its connection starts now); None when it has no address."""
        for index, broker_id in self._ids.items():
            if broker_id == member and index not in self._retired:
                return index
        if not endpoint:
            return None
        try:
            address = parse_endpoint(endpoint)
        except InvalidRequest:
            return None
        for index, known in enumerate(self.endpoints):
            if (
                known == address
                and index not in taken
                and index not in self._retired
                and self._ids.get(index, member) == member
            ):
                return index
        # A replica that left and joins again at the same address (its slot reused) takes its
        # old endpoint back once nothing supervises it any more; otherwise a new one.
        for index in sorted(self._retired):
            task = self._supervising.get(index)
            if self.endpoints[index] == address and (task is None or task.done()):
                self._retired.discard(index)
                self._ids.pop(index, None)
                break
        else:
            self.endpoints.append(address)
            index = len(self.endpoints) - 1
        if self._status is not Status.CLOSED and not self._stopping:
            self._supervisors.append(self._supervisor(index))
        return index

    def _retire(self, index: int) -> None:
        """Stop using the endpoint of a replica that left: nothing more is sent to it."""
        self._retired.add(index)
        for links in (self._links, self._joining):
            link = links.pop(index, None)
            if link is not None:
                link.flush()  # the acknowledgement of the version goes out first
                link.close()

    def _grow_split(self) -> None:
        """Split keys for the larger replica count once every joining replica is connected
        (before that, for the members the client reaches: an earlier count stays valid)."""
        target = self._split_target
        if target is None:
            return
        connected = {link.replica for link in self._links.values()}
        if all(slot in connected for slot in range(self.vn_size, target)):
            self.vn_size = target
            self._split_target = None
            self._epoch = None

    def _assembly(self, publisher: str, seq: int) -> KeyAssembly:
        """The key assembly of an epoch. Past ``_KEY_MEMORY`` epochs the one used longest
        ago goes, except each publisher's current one (:meth:`_current_epoch`): a long
        epoch still in use keeps its key however many short ones come and go meanwhile
        (its shares are not sent again)."""
        key = (publisher, seq)
        assemblies = self._assemblies
        assembly = assemblies.get(key)
        if assembly is not None:
            assemblies.move_to_end(key)
            return assembly
        awaited = self._awaited.get(key)
        if awaited is not None:
            return awaited[0]
        current = self._current_epochs.get(publisher)
        if current is not None and current.seq == seq:
            assembly = assemblies[key] = current
        else:
            assembly = assemblies[key] = KeyAssembly(
                publisher, seq, on_culprits=self._share_culprits_found
            )
        self._bound_assemblies()
        return assembly

    def _bound_assemblies(self) -> None:
        assemblies = self._assemblies
        while len(assemblies) > _KEY_MEMORY:
            _, old = assemblies.popitem(last=False)
            if self._current_epochs.get(old.publisher) is not old:
                self._forget(old)

    def _await_key(self, publisher: str, epoch: int) -> None:
        """An agreed delivery of ``epoch`` waits to be handed out: its assembly is kept
        until it is (:meth:`_release_key`). Deliveries are handed out in order, so behind
        one whose key is late many may wait, each with its key; let go by the bound of
        :meth:`_assembly`, every one would be given up in turn, each holding the stream back
        for ``key_patience`` again. Bounded by the deliveries waiting, which
        ``key_patience`` bounds."""
        key = (publisher, epoch)
        awaited = self._awaited.get(key)
        if awaited is not None:
            self._awaited[key] = (awaited[0], awaited[1] + 1)
            return
        assembly = self._assembly(publisher, epoch)
        self._assemblies.pop(key, None)
        self._awaited[key] = (assembly, 1)

    def _release_key(self, publisher: str, epoch: int) -> None:
        """A delivery of ``epoch`` was handed out or given up (:meth:`_await_key`)."""
        key = (publisher, epoch)
        awaited = self._awaited.pop(key, None)
        if awaited is None:
            return
        assembly, waiting = awaited
        if waiting > 1:
            self._awaited[key] = (assembly, waiting - 1)
            return
        self._assemblies[key] = assembly
        self._bound_assemblies()

    def _known_assemblies(self) -> dict[tuple[str, int], KeyAssembly]:
        """Every epoch's assembly this client keeps."""
        known = dict(self._assemblies)
        known.update((key, assembly) for key, (assembly, _) in self._awaited.items())
        return known

    def _current_epoch(self, assembly: KeyAssembly) -> None:
        """``assembly``'s epoch is its publisher's newest with an agreed copy (``f + 1``
        replicas: shares alone, which one broker can make up, never move this): it is kept
        past the bound of :meth:`_assembly`."""
        current = self._current_epochs.get(assembly.publisher)
        if current is assembly:
            return
        if current is None or assembly.seq > current.seq:
            self._current_epochs[assembly.publisher] = assembly
            self._current_epochs.move_to_end(assembly.publisher)
            if current is not None:
                self._let_go(current)
            if len(self._current_epochs) > _KEY_MEMORY:
                self._let_go(self._current_epochs.popitem(last=False)[1])

    def _let_go(self, assembly: KeyAssembly) -> None:
        """``assembly`` is no longer its publisher's current epoch: if nothing else keeps
        it (the bound of :meth:`_assembly`, a delivery waiting for its key), what the pass
        layer holds for it goes too (its leaves and entries, charged to their relays)."""
        key = (assembly.publisher, assembly.seq)
        if key not in self._assemblies and key not in self._awaited:
            self._forget(assembly)

    def _forget(self, assembly: KeyAssembly) -> None:
        """Nothing keeps ``assembly`` any more: what its shares held (either form) goes."""
        self._passes.forget(assembly.publisher, assembly.seq)
        self._records.release(assembly)

    def _warn(self, source: str, message: str, *args: object) -> None:
        """Log something ``source`` (a broker, an endpoint) sent wrong: its first
        ``LOGGED_BLAMES`` such warnings, then every ``LOGGED_EVERY``-th
        (:func:`worth_logging`): a Byzantine replica's frames must not flood the log."""
        if count := self._warned.note(source):
            log.warning(f"{message} (%d such from %s)", *args, count, source)

    def _share_culprits_found(
        self, assembly: KeyAssembly, culprits: frozenset[str], when: str
    ) -> None:
        """Bad shares of one epoch newly proven on ``culprits``: counted per culprit (in
        epochs), logged while one of them is worth it (:func:`worth_logging`): a Byzantine
        replica's bad shares come every epoch. :meth:`share_culprits` names them all."""
        rate = self._share_blames
        noted = [rate.note(culprit) for culprit in culprits]  # every culprit counted
        if any(noted):
            log.warning(
                "publication %s/%d: bad shares from %s%s (epochs blamed so far: %s)",
                assembly.publisher,
                assembly.seq,
                ", ".join(sorted(culprits)),
                when,
                ", ".join(f"{c} {rate.counts[c]}" for c in sorted(culprits)),
            )

    def _blame_copies(self, blames: list[Blame[int]]) -> None:
        for blame in blames:
            link = self._links.get(blame.source)
            broker = link.broker_id if link is not None else f"replica #{blame.source}"
            blamed = self.copy_blames[broker] = self.copy_blames.get(broker, 0) + 1
            if worth_logging(blamed):  # (all counted; a Byzantine replica must not flood)
                log.warning(
                    "publication seq %d from broker %s: %s (%d blamed on it so far)",
                    blame.seq,
                    broker,
                    blame.why,
                    blamed,
                )

    def _shares_arrived(self, link: _Link, msg: Shares) -> None:
        """A SHARES frame: the key shares one replica relayed in one pass."""
        for publisher, seq, record in link.certs.unpack(msg.base, msg.certs, msg.entries):
            if isinstance(record, PropagationError):
                self._warn(
                    link.broker_id, "malformed key share from broker %s: %s", link.broker_id, record
                )
                continue
            self._take_record(link, publisher, seq, record)

    def _take_record(self, link: _Link, publisher: str, seq: int, record: ShareRecord) -> None:
        """Hold a record-form share within its relay's allowance (:class:`RecordAllowance`)."""
        assembly = self._assembly(publisher, seq)
        relay = link.broker_id or f"replica #{link.index}"
        if self._records.take(assembly, relay, record):
            self._arrived[publisher, seq] = assembly

    def _leaves_arrived(self, link: _Link, msg: Leaves) -> None:
        """A LEAVES frame: key shares by the pass one replica handed over."""
        sender = link.broker_id or f"replica #{link.index}"
        passes = self._passes
        for publisher, seq in passes.add(sender, msg.statements, msg.batches):
            assembly = self._assembly(publisher, seq)
            assembly.passes = passes
            self._arrived[publisher, seq] = assembly

    def _share_arrived(self, link: _Link, msg: Share) -> None:
        try:
            record = unpack_record(msg.record)
        except PropagationError as exc:
            self._warn(
                link.broker_id, "malformed key share from broker %s: %s", link.broker_id, exc
            )
            return
        self._take_record(link, msg.publisher, msg.seq, record)

    def _recover_arrived(self) -> None:
        """Try the epochs whose shares came in this loop iteration's reads, once each (a
        read carries many shares of one epoch: a reconstruction pass per share would redo
        the work)."""
        arrived, self._arrived = self._arrived, {}
        self._recover_due = False
        self._refresh_manifest()
        if self.manifest is None or self.vn is None:
            return
        # Shares by the pass: the epochs of a pass together, one combine per level.
        by_pass = [a for a in arrived.values() if a.passes is not None and a.key is None]
        self._passes.recover_many(by_pass, self.manifest, self.vn, audit=False)
        keyed = {a.publisher: None for a in by_pass if a.key is not None}
        for assembly in arrived.values():
            if assembly.passes is None:
                had_key = assembly.key is not None
                assembly.recover(self.manifest, self.vn, audit=False)
                if assembly.key is not None and not had_key:
                    keyed[assembly.publisher] = None
            self._audit_soon(assembly)
        # (each subscription hands out what the new keys open, once per publisher)
        for publisher in keyed:
            for sub in list(self._subscriptions.values()):
                sub._flush(publisher)

    def _audit_soon(self, assembly: KeyAssembly) -> None:
        """Audit ``assembly`` (every seal, blame) in a later loop iteration: deliveries its
        key opened are handed out first, the signature checks come after them."""
        if assembly.key is None:
            return  # no key yet: recover() ran the verified pass itself
        if not self._audits:
            asyncio.get_running_loop().call_soon(self._run_audits)
        self._audits[assembly.publisher, assembly.seq] = assembly

    def _run_audits(self) -> None:
        audits, self._audits = self._audits, {}
        manifest, vn = self.manifest, self.vn
        if manifest is None or vn is None:
            return
        self._passes.recover_many(
            [a for a in audits.values() if a.passes is not None], manifest, vn, audit=True
        )
        for assembly in audits.values():
            if assembly.passes is None:
                assembly.recover(manifest, vn)

    def _refresh_manifest(self) -> None:
        """Load the manifest file again if it changed (a new membership version): shares
        split for replicas that just attached verify only against it."""
        path = self._manifest_file
        if path is None:
            return
        stamp = _stamp(path)
        if stamp == self._manifest_stamp or stamp is None:
            return
        try:
            manifest = _load_manifest(path)
        except TrellisError as exc:
            log.warning("keeping the manifest in force: %s", exc)
            return
        self._manifest_stamp = stamp
        if self.manifest is None or manifest.version > self.manifest.version:
            self.manifest = manifest

    def _decrypt(self, delivery: Delivery) -> bytes | None:
        """The plaintext of an agreed confidential copy, once its epoch key is recovered."""
        self._refresh_manifest()
        if self.manifest is None or self.vn is None:
            log.warning(
                "confidential publication %s/%d: no manifest to verify its key shares",
                delivery.publisher,
                delivery.seq,
            )
            return None
        assert delivery.sec is not None
        assembly = self._assembly(delivery.publisher, delivery.sec.epoch)
        self._current_epoch(assembly)
        if assembly.sec is None:
            assembly.sec = delivery.sec
        if assembly.passes is not None and assembly.key is None and self._reading:
            # Shares by the pass: tried with the rest of this loop iteration's reads, after
            # them (one reconstruction for the epochs of a pass), which flushes what it opens.
            self._arrived[delivery.publisher, delivery.sec.epoch] = assembly
            return None
        assembly.recover(self.manifest, self.vn, audit=False)
        self._audit_soon(assembly)
        return assembly.open(delivery.seq, delivery.attrs, delivery.payload)

    def share_culprits(self) -> set[str]:
        """Brokers proven to have sent bad key shares to this client (robust reconstruction
        attributes every bad share it sees).

        Shares that arrived after an epoch's key was recovered are checked here: an
        assembly audits them itself only once every expected share is in, which never
        happens when an upstream replica's shares were rejected on the way (a corrupting
        replica), and an equivocation shows only when both versions are looked at together.
        """
        assemblies = self._known_assemblies()
        for (publisher, seq), assembly in assemblies.items():
            if assembly.key is None:
                continue  # still reconstructing: every new share is looked at anyway
            if assembly.passes is not None:
                self._passes.audit_late(assembly)
                continue
            for claim, path in assembly.paths.items():
                mark = (publisher, seq, claim)
                if path.audited or self._late_audits.get(mark) == len(path.shares):
                    continue
                self._late_audits[mark] = len(path.shares)
                path.verifier = path.verifier or ChainVerifier(path.view)
                try:
                    result = reconstruct(
                        path.shares,
                        path.view,
                        publication_id(publisher, seq),
                        verifier=path.verifier,
                    )
                except PropagationError:
                    continue
                assembly.report(result.culprits, " (seen after its key)")
        self._late_audits = {m: n for m, n in self._late_audits.items() if m[:2] in assemblies}
        return {c for assembly in assemblies.values() for c in assembly.culprits}

    def key_shares(self, publisher: str, epoch: int) -> int:
        """How many shares of a key epoch (named by its first seq) this client received."""
        key = (publisher, epoch)
        awaited = self._awaited.get(key)
        assembly = self._assemblies.get(key) if awaited is None else awaited[0]
        if assembly is not None and assembly.passes is not None:
            return self._passes.leaves(publisher, epoch)
        return len(assembly.shares) if assembly else 0

    def _on_message(self, link: _Link, msg: Message) -> None:
        if type(msg) is Deliver:
            subs = self._subscriptions
            for sid in msg.sub_ids:
                sub = subs.get(sid)
                if sub is not None:
                    sub._offer(
                        link.index,
                        Delivery(msg.attrs, msg.payload, msg.publisher, msg.seq, sid, msg.sec),
                    )
            return
        if type(msg) is Shares:
            self._shares_arrived(link, msg)
            return
        if type(msg) is Share:
            self._share_arrived(link, msg)
            return
        if type(msg) is Leaves:
            self._leaves_arrived(link, msg)
            return
        match msg:
            case Ack(rid) | Pong(rid):
                pending = self._pending.get(rid)
                if pending is not None:
                    pending.answer(link.index)
            case Error(rid, code, message):
                exc = _error_from_wire(msg)
                pending = self._pending.get(rid) if rid else None
                if pending is not None:
                    pending.answer(link.index, exc)
                elif rid == 0:
                    # A refused request without an ACK (PUBLISH with ack=False) leaves the
                    # connection open; a protocol error closes it, and is then the reason.
                    self._warn(
                        link.broker_id, "broker %s refused: %s: %s", link.broker_id, code, message
                    )
                    link.fatal = exc
            case Welcome():
                # Named at once: a resumed session's frames can follow in the same read,
                # before the handshake's waiter runs, and key shares count by their sender.
                link.broker_id = msg.broker_id
                if not link.welcome.done():
                    link.welcome.set_result(msg)
            case Ping(token):
                # Not while the link's writes wait: a broker that PINGs and never reads
                # had a PONG queued for each, and what is queued shows this client alive.
                if link.can_write.is_set():
                    link.send(Pong(token))
            case Notice("dropped", data):
                for sid, count in dict(data.get("subscriptions", {})).items():
                    sub = self._subscriptions.get(sid)
                    if sub is not None:
                        sub.dropped += int(count)
            case Notice("shutdown", _):
                log.info("broker %s is shutting down", self.broker_id)
            case Notice("membership", data):
                self._membership_heard(link.index, data, link)
            case Notice(kind, data) if kind == MARK_NOTICE:
                self._mark_asked(link.index, data)
            case _:
                raise ProtocolError(f"unexpected {type(msg).__name__.upper()} from broker")
