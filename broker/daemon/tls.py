"""TLS on a broker: the listener's handshakes, the links' contexts, and who a peer is.

The listener accepts plain TCP and runs each TLS handshake itself (``loop.start_tls``
under ``tls_handshake_timeout``) before the connection becomes a
:class:`~broker.daemon.dispatch.Connection`: asyncio's ``create_server(ssl=...)`` drops a
failed handshake without a word, and an operator must see which address failed and why.
A failed handshake closes that connection only.

After the handshake, HELLO decides what the certificate must prove: a broker must present
a broker certificate naming the id it claims (and, where the overlay manifest lists an
Ed25519 key for it and the certificate holds one, that key: one identity per broker); a
client must present a client or broker certificate unless ``tls_client_cert`` is
``optional``. A refusal is an ``ERROR`` frame with code ``tls`` naming the cause.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import cast

from broker.daemon.config import BrokerConfig, ConfigError
from broker.errors import TLSError
from overlay.manifest import Manifest
from security.ca import Identity
from security.errors import InvalidRequest
from security.tls import (
    describe_tls_error,
    link_context,
    peer_identity,
    peer_key,
    server_context,
)

log = logging.getLogger("trellis.security")


class BrokerTLS:
    """A broker's TLS settings, loaded once: contexts and the checks on peers."""

    def __init__(self, config: BrokerConfig) -> None:
        assert config.tls_ca is not None
        assert config.tls_cert is not None
        assert config.tls_key is not None
        try:
            self.server = server_context(config.tls_ca, config.tls_cert, config.tls_key)
            self.link = link_context(config.tls_ca, config.tls_cert, config.tls_key)
        except InvalidRequest as exc:
            raise ConfigError(f"invalid TLS settings (tls_ca, tls_cert, tls_key): {exc}") from None
        self.broker_id = config.id
        self.require_client_cert = config.tls_client_cert == "required"
        self.handshake_timeout = config.tls_handshake_timeout
        self.manifest_keys: dict[str, bytes] = {}
        if config.manifest is not None:
            try:
                self.manifest_keys = dict(Manifest.load(config.manifest).keys)
            except (OSError, ValueError) as exc:  # the share path reports it too
                log.warning("TLS: no manifest keys to check brokers' certificates: %s", exc)
        self.handshakes: set[asyncio.Task[None]] = set()

    def check_broker(self, transport: asyncio.BaseTransport, broker_id: str) -> None:
        """Refuse a broker link whose certificate does not prove ``broker_id``.

        Raises:
            TLSError: no certificate, another identity, or not the manifest's key.
        """
        identity = peer_identity(transport.get_extra_info("peercert"))
        if identity is None:
            raise TLSError(
                f"broker '{broker_id}' presented no certificate: broker links need a broker "
                f"certificate from the project CA"
            )
        if identity != Identity("broker", broker_id):
            raise TLSError(
                f"the peer claiming to be broker '{broker_id}' presented the certificate of "
                f"{identity}"
            )
        expected = self.manifest_keys.get(broker_id)
        ssl_object = cast(ssl.SSLObject | None, transport.get_extra_info("ssl_object"))
        if expected is not None and ssl_object is not None:
            key = peer_key(ssl_object.getpeercert(binary_form=True))
            if key is not None and key != expected:
                raise TLSError(
                    f"broker '{broker_id}' presented a certificate for a key that is not its "
                    f"key in the overlay manifest"
                )

    def check_client(self, transport: asyncio.BaseTransport, client_id: str) -> None:
        """Refuse a client without a certificate when certificates are required.

        Raises:
            TLSError: no certificate was presented.
        """
        if self.require_client_cert and not transport.get_extra_info("peercert"):
            raise TLSError(
                f"broker '{self.broker_id}' requires a client certificate from the project CA "
                f"and client '{client_id}' presented none (SDK: cert= and key=; CLI: --cert "
                f"and --key)"
            )

    def client_key(self, transport: asyncio.BaseTransport) -> bytes | None:
        """The Ed25519 key of the client certificate the handshake verified, if any."""
        ssl_object = cast(ssl.SSLObject | None, transport.get_extra_info("ssl_object"))
        return None if ssl_object is None else peer_key(ssl_object.getpeercert(binary_form=True))

    def acceptor(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for the listener: TLS handshake first, then ``make()``."""
        return lambda: _Handshake(self, make)

    def close(self) -> None:
        """Stop handshakes still under way (shutdown)."""
        for task in list(self.handshakes):
            task.cancel()


class _Handshake(asyncio.Protocol):
    """Holds an accepted TCP connection through its server-side TLS handshake, then hands
    the TLS transport to the real protocol.

    Two kinds of early bytes are kept, each passed on in order: the client's first TLS
    records when they arrive before ``start_tls`` took the transport over (uvloop starts
    reading right after ``connection_made``, so pausing there is too late), and decrypted
    bytes that arrive with the end of the handshake, before the hand-over.
    """

    def __init__(self, tls: BrokerTLS, make: Callable[[], asyncio.Protocol]) -> None:
        self.tls = tls
        self.make = make
        self.raw: asyncio.Transport | None = None
        self.started = False
        self.hello: list[bytes] = []
        self.target: asyncio.Protocol | None = None
        self.early: list[bytes] = []
        self.eof = False
        self.lost: tuple[Exception | None] | None = None
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = self.raw = cast(asyncio.Transport, transport)
        peer = raw.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        raw.pause_reading()  # start_tls resumes it
        task = asyncio.get_running_loop().create_task(self._handshake(raw))
        self.tls.handshakes.add(task)
        task.add_done_callback(self.tls.handshakes.discard)

    def _feed_hello(self, raw: asyncio.Transport) -> None:
        """Give the TLS layer the records read before it took the transport over (runs
        before it starts the handshake and before reading resumes)."""
        # Both loops' TLS protocols are buffered protocols (uvloop's without subclassing).
        protocol = cast(asyncio.BufferedProtocol, raw.get_protocol())
        data = b"".join(self.hello)
        self.hello.clear()
        while data:
            view = memoryview(protocol.get_buffer(len(data)))
            size = min(len(view), len(data))
            view[:size] = data[:size]
            protocol.buffer_updated(size)
            data = data[size:]

    async def _handshake(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.hello:
                loop.call_soon(self._feed_hello, raw)
            self.started = True
            transport = await loop.start_tls(
                raw,
                self,
                self.tls.server,
                server_side=True,
                ssl_handshake_timeout=self.tls.handshake_timeout,
            )
        except Exception as exc:  # ssl.SSLError, a reset, a timeout: this connection only
            log.warning(
                "TLS handshake with %s failed: %s; connection closed",
                self.peer,
                describe_tls_error(exc),
            )
            raw.abort()
            return
        except asyncio.CancelledError:
            raw.abort()
            raise
        if transport is None:  # pragma: no cover - start_tls returns None only if closing
            raw.abort()
            return
        target = self.make()
        target.connection_made(transport)
        transport.set_protocol(target)
        self.target = target
        for data in self.early:
            target.data_received(data)
        self.early.clear()
        if self.eof:
            target.eof_received()
        if self.lost is not None:
            target.connection_lost(self.lost[0])

    def data_received(self, data: bytes) -> None:
        if self.target is not None:
            self.target.data_received(data)
        elif self.started:
            self.early.append(data)
        else:
            self.hello.append(data)
            if self.raw is not None:
                self.raw.pause_reading()

    def eof_received(self) -> bool | None:
        if self.target is not None:
            return self.target.eof_received()
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.target is not None:
            self.target.connection_lost(exc)
        else:
            self.lost = (exc,)
