"""``trellis bridge mqtt``: MQTT topics into overlay publications and overlay subscriptions
back to MQTT topics, through an MQTT broker (aiomqtt) and the SDK.

The mapping itself is sans-I/O, in :mod:`broker.tools.mqtt_mapping`. What this module adds
is delivery across failures on either side:

- **MQTT -> overlay, at least once, no duplicates from redelivery.** The bridge holds a
  persistent MQTT v5 session (``clean_start`` off, ``session_expiry``) and subscribes at
  QoS 1 with *no local* (it never hears its own publications) and *retain handling 1*
  (a re-subscription does not replay retained messages). It acknowledges (PUBACK) a
  message only after the overlay acknowledged the publication it became, in arrival
  order, so a message is never lost by a bridge, overlay-broker or MQTT-broker failure
  while the MQTT broker keeps the session (Mosquitto: ``persistence true``). A message
  the MQTT broker redelivers (DUP) whose packet id, topic and payload are among the last
  ``window`` bridged is acknowledged and dropped, as is a retained message equal to the
  last one bridged for its topic (a session the broker lost makes the re-subscription
  replay it).
- **Overlay -> MQTT, at least once.** Deliveries wait in the SDK subscription's bounded
  queue while the MQTT broker is away and are published at QoS 1, one PUBACK at a time
  per ``--out`` rule, with the MQTT v5 user property ``trellis-id = publisher#seq``. Only
  a publication whose PUBACK was lost with the connection is sent again, so a duplicate
  needs a failure at that instant; subscribers can drop it by ``trellis-id``.
- Both sides reconnect with jittered exponential backoff up to ``max_backoff``; the SDK
  restores the advertisements and subscriptions. A message that cannot be mapped is
  counted (``unmappable``), logged and skipped; nothing stops the bridge but a signal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import random
import signal
import time
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from broker.errors import (
    ConnectionLost,
    InvalidRequest,
    SlowConsumerError,
    TrellisError,
    TrellisTimeout,
)

if TYPE_CHECKING:
    import aiomqtt
    import paho.mqtt.client as paho

    from broker.client import Client, Delivery, Subscription
    from broker.tools.mqtt_mapping import InboundRule, OutboundRule

log = logging.getLogger("trellis.bridge")

__all__ = ["BridgeConfig", "BridgeStats", "MqttBridge", "add_bridge_parser", "parse_mqtt_url"]

_CONFIG_KEYS = {
    "mqtt",
    "endpoint",
    "map",
    "out",
    "client_id",
    "qos",
    "max_backoff",
    "queue_size",
    "session_expiry",
    "window",
    "ca",
    "cert",
    "key",
}


def parse_mqtt_url(url: str) -> tuple[str, int]:
    """``mqtt://HOST:PORT`` (port 1883 by default) as (host, port).

    Raises:
        InvalidRequest: another scheme, no host, or a bad port.
    """
    parts = urlsplit(url)
    if parts.scheme != "mqtt" or not parts.hostname:
        raise InvalidRequest(f"--mqtt {url!r} must be mqtt://HOST[:PORT] (mqtts is not supported)")
    try:
        port = parts.port or 1883
    except ValueError:
        raise InvalidRequest(f"--mqtt {url!r}: the port must be a number 1-65535") from None
    return parts.hostname, port


@dataclass
class BridgeConfig:
    """Everything one bridge needs; :meth:`from_args` builds it from the command line and
    an optional TOML file (its ``[bridge.mqtt]`` table, same names; flags override it)."""

    mqtt_host: str
    mqtt_port: int
    endpoints: list[str]
    inbound: list[InboundRule]
    outbound: list[OutboundRule]
    client_id: str
    qos: int = 1
    max_backoff: float = 5.0
    queue_size: int = 10_000
    session_expiry: int = 3600
    window: int = 4096
    ready_file: Path | None = None
    # TLS toward the overlay (see README, TLS): the CA, and a client certificate and key.
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BridgeConfig:
        """The configuration the command line (and its ``--config``) asks for.

        Raises:
            InvalidRequest: a missing or malformed setting, naming it (and the file).
        """
        from broker.tools.mqtt_mapping import parse_map, parse_out

        table: dict[str, Any] = {}
        where = "command line"
        if args.config:
            where = args.config
            try:
                data = tomllib.loads(Path(args.config).read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as exc:
                raise InvalidRequest(f"{args.config}: {exc}") from None
            table = data.get("bridge", {}).get("mqtt", {})
            if not isinstance(table, dict):
                raise InvalidRequest(f"{args.config}: [bridge.mqtt] must be a table")
            unknown = sorted(set(table) - _CONFIG_KEYS)
            if unknown:
                raise InvalidRequest(f"{args.config}: unknown key {unknown[0]!r} in [bridge.mqtt]")

        def pick(name: str, default: Any = None) -> Any:
            value = getattr(args, name, None)
            return value if value not in (None, []) else table.get(name, default)

        url = pick("mqtt")
        endpoint = pick("endpoint")
        if not url or not endpoint:
            raise InvalidRequest(
                f"--mqtt and --endpoint are required (on the command line or in [bridge.mqtt] "
                f"of --config); missing in {where}"
            )
        maps = list(pick("map", []))
        outs = list(pick("out", []))
        if not maps and not outs:
            raise InvalidRequest("nothing to bridge: give at least one --map or --out")
        host, port = parse_mqtt_url(str(url))
        endpoints = [e.strip() for e in str(endpoint).split(",") if e.strip()]
        ca, cert, key = pick("ca"), pick("cert"), pick("key")
        if (cert is None) != (key is None):
            raise InvalidRequest(f"cert and key go together, a certificate and its key ({where})")
        if cert is not None and ca is None:
            raise InvalidRequest(f"cert needs ca too: the CA of the brokers' certs ({where})")
        qos = int(pick("qos", 1))
        if qos not in (0, 1):
            raise InvalidRequest(f"qos must be 0 or 1, got {qos} ({where})")
        return cls(
            mqtt_host=host,
            mqtt_port=port,
            endpoints=endpoints,
            inbound=[parse_map(text) for text in maps],
            outbound=[parse_out(text) for text in outs],
            client_id=str(pick("client_id") or f"bridge-{random.getrandbits(40):010x}"),
            qos=qos,
            max_backoff=float(pick("max_backoff", 5.0)),
            queue_size=int(pick("queue_size", 10_000)),
            session_expiry=int(pick("session_expiry", 3600)),
            window=int(pick("window", 4096)),
            ready_file=Path(args.ready_file) if args.ready_file else None,
            ca=None if ca is None else str(ca),
            cert=None if cert is None else str(cert),
            key=None if key is None else str(key),
        )


@dataclass
class BridgeStats:
    """What the bridge did; printed as one JSON line when it stops."""

    mqtt_received: int = 0
    to_overlay: int = 0
    from_overlay: int = 0
    to_mqtt: int = 0
    unmappable: int = 0
    duplicates: int = 0
    dropped: int = 0
    mqtt_connections: int = 0
    mqtt_resent: int = 0
    overlay_retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str, message: str, *args: object) -> None:
        """Count and log one message the bridge skipped."""
        self.unmappable += kind == "unmappable"
        self.errors[kind] = self.errors.get(kind, 0) + 1
        log.error(message, *args)


@dataclass
class _Incoming:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    mid: int
    generation: int


def _backoff(attempt: int, cap: float) -> float:
    return random.uniform(0.5, 1.0) * min(cap, 0.1 * 2.0 ** min(attempt, 16))


class MqttBridge:
    """One bridge between an MQTT broker and a Trellis virtual node.

    Args:
        config: the settings.
        stop: set it to stop the bridge gracefully.
    """

    def __init__(self, config: BridgeConfig, stop: asyncio.Event) -> None:
        # Imported here: ``trellis`` builds this command's parser for every command.
        from broker.tools.mqtt_mapping import Redeliveries

        self.config = config
        self.stop = stop
        self.stats = BridgeStats()
        self._incoming: asyncio.Queue[_Incoming] = asyncio.Queue(config.queue_size)
        self._mqtt: _MqttLink | None = None
        # Every connection by generation, from its creation until it is gone: messages
        # can arrive before it is ready for publishing (queued on the session, retained).
        self._links: dict[int, _MqttLink] = {}
        self._generation = 0
        self._changed = asyncio.Condition()
        self._copies = Redeliveries(config.window)
        self._closing = False

    async def run(self) -> BridgeStats:
        """Bridge until :attr:`stop` is set; returns the counters."""
        from broker.client import Client

        overlay = Client(
            self.config.endpoints,
            client_id=self.config.client_id,
            max_backoff=self.config.max_backoff,
            queue_size=self.config.queue_size,
            # Continue above any earlier run under this id: brokers and subscribers drop
            # a (publisher, seq) they have seen.
            first_seq=time.time_ns() // 1000,
            ca=self.config.ca,
            cert=self.config.cert,
            key=self.config.key,
        )
        if not await self._connect_overlay(overlay):
            return self.stats
        try:
            async with contextlib.AsyncExitStack() as stack:
                subs: list[Subscription] = []
                for adv in dict.fromkeys(str(r.advertisement()) for r in self.config.inbound):

                    async def advertise(adv: str = adv) -> None:
                        await overlay.advertise(adv)

                    if not await self._retrying(advertise):
                        return self.stats
                for rule in self.config.outbound:

                    async def subscribe(rule: OutboundRule = rule) -> None:
                        subs.append(await stack.enter_async_context(overlay.subscribe(rule.filter)))

                    if not await self._retrying(subscribe):
                        return self.stats
                mqtt_task = asyncio.create_task(self._mqtt_loop(), name="bridge-mqtt")
                workers = [
                    asyncio.create_task(self._inbound_loop(overlay), name="bridge-in"),
                    *(
                        asyncio.create_task(self._outbound_loop(rule, sub), name="bridge-out")
                        for rule, sub in zip(self.config.outbound, subs, strict=True)
                    ),
                ]
                ready = asyncio.create_task(self._write_ready())
                await self.stop.wait()
                ready.cancel()
                # Take no more MQTT messages (the MQTT broker keeps them on the session),
                # finish and acknowledge those taken, then disconnect.
                self._closing = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._incoming.join(), 5.0)
                for task in [*workers, mqtt_task]:
                    task.cancel()
                await asyncio.gather(*workers, mqtt_task, return_exceptions=True)
        finally:
            await overlay.close()
        return self.stats

    async def _connect_overlay(self, overlay: Client) -> bool:
        for attempt in itertools.count():
            try:
                await overlay.connect()
                return True
            except (ConnectionLost, TrellisTimeout) as exc:
                pause = _backoff(attempt, self.config.max_backoff)
                log.warning("overlay not reachable (%s); retrying in %.1f s", exc, pause)
            if await self._stopped_within(pause):
                return False
        return False  # pragma: no cover - the loop above only returns

    async def _retrying(self, request: Callable[[], Awaitable[object]]) -> bool:
        """Repeat an overlay request until it is acknowledged (True) or the bridge stops."""
        for attempt in itertools.count():
            try:
                await request()
                return True
            except (ConnectionLost, TrellisTimeout) as exc:
                pause = _backoff(attempt, self.config.max_backoff)
                log.warning("overlay request failed (%s); retrying in %.1f s", exc, pause)
            if await self._stopped_within(pause):
                return False
        return False  # pragma: no cover - the loop above only returns

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _write_ready(self) -> None:
        if self.config.ready_file is None:
            return
        async with self._changed:
            await self._changed.wait_for(lambda: self._mqtt is not None)
        self.config.ready_file.write_text(f"client_id={self.config.client_id}\n")

    # -- MQTT connection ------------------------------------------------------------------

    async def _mqtt_loop(self) -> None:
        """Keep one MQTT connection open, a fresh client each time (the session lives on
        the MQTT broker), with bounded backoff between attempts."""
        import aiomqtt

        attempt = 0
        while True:
            self._generation += 1
            link = _make_link(self, self._generation)
            self._links[link.generation] = link
            try:
                async with link:
                    await link.setup()
                    self.stats.mqtt_connections += 1
                    if attempt:
                        log.info("reconnected to MQTT %s:%d", link.host, link.port)
                    attempt = 0
                    async with self._changed:
                        self._mqtt = link
                        self._changed.notify_all()
                    await link.closed()
            except aiomqtt.MqttError as exc:
                log.warning("MQTT %s:%d: %s", self.config.mqtt_host, self.config.mqtt_port, exc)
            finally:
                link.gone.set()
                del self._links[link.generation]
                async with self._changed:
                    self._mqtt = None
                    self._changed.notify_all()
            attempt += 1
            await asyncio.sleep(_backoff(attempt, self.config.max_backoff))

    async def _current_link(self) -> _MqttLink:
        async with self._changed:
            await self._changed.wait_for(lambda: self._mqtt is not None)
            assert self._mqtt is not None
            return self._mqtt

    async def _replaced(self, link: _MqttLink) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._mqtt is not link)

    def offer(self, msg: paho.MQTTMessage, generation: int) -> None:
        """Called by the MQTT client for each message (on the event loop)."""
        if self._closing:
            return  # unacknowledged: the MQTT broker keeps it for the next session
        self.stats.mqtt_received += 1
        item = _Incoming(
            msg.topic,
            bytes(msg.payload),
            msg.qos,
            bool(msg.retain),
            bool(msg.dup),
            msg.mid,
            generation,
        )
        try:
            self._incoming.put_nowait(item)
        except asyncio.QueueFull:
            # Not acknowledged: the MQTT broker keeps it on the session and sends it again.
            self.stats.dropped += 1
            log.warning(
                "incoming queue full (%d); %r left to the MQTT broker",
                self.config.queue_size,
                item.topic,
            )

    def _ack(self, item: _Incoming) -> None:
        """PUBACK on the connection the message came on; once that one is gone, the MQTT
        broker resends the message (DUP) on the next, where it is a recognised copy."""
        link = self._links.get(item.generation)
        if item.qos and link is not None:
            link.ack(item.mid, item.qos)

    # -- MQTT -> overlay ------------------------------------------------------------------

    async def _inbound_loop(self, overlay: Client) -> None:
        while True:
            item = await self._incoming.get()
            try:
                await self._bridge_in(overlay, item)
            except Exception:  # a bug must not stop the bridge: count it, go on
                self.stats.errors["internal"] = self.stats.errors.get("internal", 0) + 1
                log.exception("MQTT message on %r failed", item.topic)
                self._ack(item)
            finally:
                self._incoming.task_done()

    async def _bridge_in(self, overlay: Client, item: _Incoming) -> None:
        from broker.tools.mqtt_mapping import Unmappable, inbound_attrs

        if self._copies.is_copy(
            item.topic,
            item.payload,
            mid=item.mid,
            qos=item.qos,
            retain=item.retain,
            dup=item.dup,
        ):
            self.stats.duplicates += 1
            log.info("dropped a redelivered copy of %r (mid %d)", item.topic, item.mid)
        else:
            try:
                attrs = inbound_attrs(self.config.inbound, item.topic, item.payload)
            except Unmappable as exc:
                self.stats.error("unmappable", "cannot map MQTT message on %r: %s", item.topic, exc)
            else:
                if await self._publish(overlay, item, attrs):
                    self.stats.to_overlay += 1
                self._copies.bridged(item.topic, item.payload, mid=item.mid, qos=item.qos)
        self._ack(item)

    async def _publish(self, overlay: Client, item: _Incoming, attrs: dict[str, Any]) -> bool:
        """Publish until the overlay acknowledges; False when it refused the publication."""
        for attempt in itertools.count():
            try:
                await overlay.publish(attrs, item.payload)
                return True
            except InvalidRequest as exc:  # too large, bad attributes: not retryable
                self.stats.error("unmappable", "cannot map MQTT message on %r: %s", item.topic, exc)
                return False
            except (ConnectionLost, TrellisTimeout) as exc:
                self.stats.overlay_retries += 1
                pause = _backoff(attempt, self.config.max_backoff)
                log.warning(
                    "overlay publish of %r failed (%s); retry in %.1f s", item.topic, exc, pause
                )
                await asyncio.sleep(pause)
            except TrellisError as exc:  # the broker refused it (e.g. not authorised)
                self.stats.error(
                    "refused", "overlay refused MQTT message on %r: %s", item.topic, exc
                )
                return False
        return False  # pragma: no cover

    # -- overlay -> MQTT ------------------------------------------------------------------

    async def _outbound_loop(self, rule: OutboundRule, sub: Subscription) -> None:
        from broker.tools.mqtt_mapping import Unmappable, outbound_topic

        reported = 0
        while True:
            try:
                msg = await sub.get()
            except SlowConsumerError as exc:
                self.stats.dropped += exc.dropped - reported
                reported = exc.dropped
                self.stats.error("dropped", "%s (MQTT side too slow or away)", exc)
                continue
            except StopAsyncIteration:
                return
            if msg.publisher == self.config.client_id:
                continue  # our own publication from MQTT: never echo it back
            self.stats.from_overlay += 1
            try:
                topic = outbound_topic(rule, msg.attrs)
                await self._send(topic, msg)
            except Unmappable as exc:
                self.stats.error(
                    "unmappable", "cannot map %s#%d to MQTT: %s", msg.publisher, msg.seq, exc
                )
                continue
            except Exception:  # a bug must not stop the bridge: count it, go on
                self.stats.errors["internal"] = self.stats.errors.get("internal", 0) + 1
                log.exception("%s#%d to MQTT failed", msg.publisher, msg.seq)
                continue
            self.stats.to_mqtt += 1

    async def _send(self, topic: str, msg: Delivery) -> None:
        """Publish on the current MQTT connection; only a publication that connection lost
        before its PUBACK is sent again, on the next one."""
        import aiomqtt

        while True:
            link = await self._current_link()
            publish = asyncio.ensure_future(link.publish(topic, msg, self.config.qos))
            gone = asyncio.ensure_future(link.gone.wait())
            try:
                # aiomqtt waits for a PUBACK until its timeout even when the connection
                # is gone: the connection's end decides first.
                done, _ = await asyncio.wait({publish, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not publish.done():
                    publish.cancel()
                    await asyncio.gather(publish, return_exceptions=True)
            problem: object = "connection lost before its PUBACK"
            if publish in done:
                try:
                    publish.result()
                    return
                except ValueError as exc:  # paho: topic or payload unusable
                    self.stats.error("unmappable", "cannot publish %r to MQTT: %s", topic, exc)
                    return
                except aiomqtt.MqttError as exc:
                    problem = exc
                    if not link.gone.is_set():
                        # No PUBACK in time on a connection that looks open: replace it
                        # rather than trust it (the new one resends).
                        log.warning("MQTT publish on %r: %s; reconnecting", topic, exc)
                        link.aborted.set()
            self.stats.mqtt_resent += 1
            log.info("MQTT publish on %r: %s; resending on the next connection", topic, problem)
            await self._replaced(link)


class _MqttLink:
    """What the bridge needs of one MQTT connection (an aiomqtt client underneath)."""

    def __init__(self, client: aiomqtt.Client, bridge: MqttBridge, generation: int) -> None:
        self.client = client
        self.bridge = bridge
        self.generation = generation
        self.host = bridge.config.mqtt_host
        self.port = bridge.config.mqtt_port
        self.gone = asyncio.Event()
        """Set once the connection is over."""
        self.aborted = asyncio.Event()
        """Set to close a connection that stopped answering."""

    async def __aenter__(self) -> _MqttLink:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(None, None, None)

    async def setup(self) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        options = SubscribeOptions(
            qos=self.bridge.config.qos, noLocal=True, retainAsPublished=False, retainHandling=1
        )
        for topic in dict.fromkeys(rule.subscription for rule in self.bridge.config.inbound):
            await self.client.subscribe(topic, options=options, timeout=10)

    async def closed(self) -> None:
        """Return when the connection is gone (raising aiomqtt.MqttError) or the bridge
        gave up on it (:attr:`aborted`)."""

        async def watch() -> None:
            async for _ in self.client.messages:  # never yields: messages go to the bridge
                pass

        watching = asyncio.ensure_future(watch())
        aborted = asyncio.ensure_future(self.aborted.wait())
        try:
            await asyncio.wait({watching, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watching, aborted):
                task.cancel()
            await asyncio.gather(watching, aborted, return_exceptions=True)
        if watching.done() and not watching.cancelled():
            watching.result()

    def ack(self, mid: int, qos: int) -> None:
        self.client._client.ack(mid, qos)

    async def publish(self, topic: str, msg: Delivery, qos: int) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = [("trellis-id", f"{msg.publisher}#{msg.seq}")]
        await self.client.publish(topic, msg.payload, qos=qos, properties=props)


def _make_link(bridge: MqttBridge, generation: int) -> _MqttLink:
    import aiomqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    class Client(aiomqtt.Client):
        """aiomqtt with manual acknowledgements, handing each message (DUP flag included,
        which aiomqtt's messages drop) to the bridge."""

        def _on_message(
            self, client: paho.Client, userdata: Any, message: paho.MQTTMessage
        ) -> None:
            bridge.offer(message, generation)

    connect = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    connect.SessionExpiryInterval = bridge.config.session_expiry
    # Never more unacknowledged messages in flight to the bridge than its queue holds.
    connect.ReceiveMaximum = max(1, min(bridge.config.queue_size, 65_535))
    client = Client(
        bridge.config.mqtt_host,
        bridge.config.mqtt_port,
        identifier=bridge.config.client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=False,
        properties=connect,
        keepalive=10,
        timeout=10,
        logger=logging.getLogger("trellis.bridge.mqtt"),
    )
    client._client.manual_ack_set(True)
    return _MqttLink(client, bridge, generation)


# -- command line ---------------------------------------------------------------------------


def add_bridge_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``trellis bridge mqtt ...``."""
    bridge = subparsers.add_parser("bridge", help="bridge the overlay to another system (MQTT)")
    kinds = bridge.add_subparsers(
        dest="bridge_kind", required=True, metavar="KIND", help="the system to bridge: mqtt"
    )
    p = kinds.add_parser("mqtt", help="MQTT topics <-> overlay publications (see README)")
    p.add_argument("--config", help="TOML file with a [bridge.mqtt] table (default: none)")
    p.add_argument("--mqtt", help="the MQTT broker, mqtt://HOST[:PORT] (port 1883 by default)")
    p.add_argument("--endpoint", help="the overlay VN, HOST:PORT (comma-separated for several)")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="PATTERN=ATTRS",
        help="MQTT -> overlay, e.g. 'sensors/{site}/#=class:sensors' (repeatable)",
    )
    p.add_argument(
        "--out",
        action="append",
        default=[],
        metavar="FILTER=TEMPLATE",
        help="overlay -> MQTT, e.g. \"class = 'alerts'=alerts/{symbol}\" (repeatable)",
    )
    p.add_argument("--client-id", help="MQTT client id and overlay publisher (default: random)")
    p.add_argument("--qos", type=int, choices=[0, 1], help="MQTT QoS both ways (default: 1)")
    p.add_argument("--max-backoff", type=float, help="largest reconnect pause, s (default: 5)")
    p.add_argument("--queue-size", type=int, help="bound of each queue, messages (default: 10000)")
    p.add_argument("--session-expiry", type=int, help="MQTT session expiry, s (default: 3600)")
    p.add_argument(
        "--window", type=int, help="recent messages remembered to drop redeliveries (default: 4096)"
    )
    p.add_argument("--ready-file", help="written once both sides are up (default: none)")
    from broker.tools.tls_args import add_tls_arguments

    add_tls_arguments(p)
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="warning",
        help="(default: %(default)s)",
    )
    p.set_defaults(func=cmd_bridge)


def cmd_bridge(args: argparse.Namespace) -> int:
    """Run the bridge until SIGTERM or SIGINT; print its counters as one JSON line."""
    from broker.tools.launcher import run_async

    config = BridgeConfig.from_args(args)
    # ``trellis`` set up the log format (stderr); this command chooses the level.
    logging.getLogger().setLevel(getattr(logging, args.log_level.upper()))
    stats = run_async(_serve(config))
    print(json.dumps(asdict(stats), sort_keys=True), flush=True)
    return 0


async def _serve(config: BridgeConfig) -> BridgeStats:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if stop.is_set() and main is not None:
            main.cancel()  # a second signal: stop now
        log.info("signal %d: stopping", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    bridge = MqttBridge(config, stop)
    try:
        return await bridge.run()
    except asyncio.CancelledError:
        return bridge.stats
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
