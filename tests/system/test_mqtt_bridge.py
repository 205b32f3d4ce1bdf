"""`trellis bridge mqtt` between a real Mosquitto (started here, on a free port) and a real
broker process: both directions with their attributes and payloads, and a Mosquitto
restart mid-stream after which nothing is duplicated and nothing QoS 1 promises is lost."""

from __future__ import annotations

import asyncio
import getpass
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from paho.mqtt.client import MQTTMessage
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker.client import Client, Delivery
from broker.tools.launcher import BrokerProcess

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Mosquitto:
    """One Mosquitto process on a free loopback port, with persistence (sessions and
    queued QoS 1 messages survive a restart), restartable on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {workdir}/\n"
            f"log_dest file {workdir}/mosquitto.log\n"
            "log_type all\n"
            f"user {getpass.getuser()}\n"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert Path(MOSQUITTO).exists(), "mosquitto is missing: run deploy/setup.sh"
        with (self.workdir / "mosquitto.stderr").open("ab") as err:
            self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stderr=err)
        self.starts += 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.workdir / "mosquitto.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"mosquitto did not listen on {self.port} within 10 s")

    def stop(self) -> None:
        """SIGTERM (Mosquitto saves its persistence file), SIGKILL past 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    server = Mosquitto(tmp_path / "mosquitto")
    server.start()
    yield server
    server.stop()


class Bridge:
    """``trellis bridge mqtt`` as a process."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.ready = workdir / "bridge.ready"
        self.log = workdir / "bridge.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "broker",
                    "bridge",
                    "mqtt",
                    *args,
                    "--log-level",
                    "info",
                    "--ready-file",
                    str(self.ready),
                ],
                stdout=subprocess.PIPE,
                stderr=log,
            )

    def wait_ready(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "bridge not ready:\n" + self.log.read_text()
            time.sleep(0.05)

    def stop(self) -> tuple[int, dict[str, object]]:
        """SIGTERM; the exit code and the counters it prints."""
        self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = self.process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate(timeout=10)
            raise AssertionError("bridge ignored SIGTERM:\n" + self.log.read_text()) from None
        lines = out.decode().strip().splitlines()
        return self.process.returncode, json.loads(lines[-1]) if lines else {}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate(timeout=10)


@dataclass
class Received:
    topic: str
    payload: bytes
    trellis_id: str
    dup: bool
    """Mosquitto's own redelivery to this subscriber (QoS 1: its PUBACK was lost)."""


@dataclass
class MqttSubscriber:
    """A persistent-session MQTT v5 subscriber that reconnects by itself and records the
    DUP flag of what it receives (aiomqtt's messages drop it)."""

    port: int
    topic: str
    got: list[Received] = field(default_factory=list)
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)

    def fresh(self) -> list[Received]:
        """What Mosquitto delivered for the first time: what the bridge published."""
        return [r for r in self.got if not r.dup]

    async def run(self) -> None:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 600
        got = self.got

        class Recording(aiomqtt.Client):
            def _on_message(self, client: Any, userdata: Any, message: MQTTMessage) -> None:
                user = getattr(message.properties, "UserProperty", [])
                ids = [value for key, value in user if key == "trellis-id"]
                got.append(
                    Received(message.topic, message.payload, ids[0] if ids else "", message.dup)
                )

        while True:
            client = Recording(
                "127.0.0.1",
                self.port,
                identifier="test-sub",
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=False,
                properties=props,
                timeout=5,
            )
            try:
                async with client:
                    await client.subscribe(self.topic, qos=1)
                    self.subscribed.set()
                    async for _ in client.messages:  # never yields: recorded above
                        pass
            except aiomqtt.MqttError:
                await asyncio.sleep(0.1)


async def mqtt_publish(
    port: int, messages: list[tuple[str, bytes, bool]], patience: float = 10
) -> None:
    """Publish at QoS 1 (waiting for each PUBACK), connecting again until Mosquitto answers."""
    deadline = time.monotonic() + patience
    while True:
        try:
            async with aiomqtt.Client(
                "127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5, timeout=5
            ) as client:
                for topic, payload, retain in messages:
                    await client.publish(topic, payload, qos=1, retain=retain)
                return
        except aiomqtt.MqttError:
            assert time.monotonic() < deadline, "Mosquitto did not come back"
            await asyncio.sleep(0.1)


def reading(i: int) -> bytes:
    return json.dumps({"i": i, "t": 20.0 + i / 4, "ok": i % 2 == 0, "loc": {"room": "k1"}}).encode()


def reading_attrs(i: int) -> dict[str, object]:
    return {
        "class": "sensors",
        "site": "lab",
        "topic": "sensors/lab/temp",
        "topic_0": "sensors",
        "topic_1": "lab",
        "topic_2": "temp",
        "format": "json",
        "i": i,
        "t": 20.0 + i / 4,
        "ok": i % 2 == 0,
        "loc.room": "k1",
    }


async def wait_until(
    condition: object, timeout: float, what: str, detail: object = lambda: ""
) -> None:
    assert callable(condition)
    assert callable(detail)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{detail()}"
        await asyncio.sleep(0.05)


async def test_bridge_carries_both_ways_and_survives_a_mosquitto_restart_without_duplicates(
    tmp_path: Path, mosquitto: Mosquitto, broker: BrokerProcess
) -> None:
    # A retained state published before the bridge starts: its subscription gets it once.
    await mqtt_publish(mosquitto.port, [("sensors/lab/state", b"on", True)])
    bridge: Bridge | None = None
    mqtt_sub = MqttSubscriber(mosquitto.port, "alerts/#")
    sub_task = asyncio.create_task(mqtt_sub.run())
    overlay_got: list[Delivery] = []
    try:
        async with (
            Client(broker.endpoint, client_id="overlay-sub") as sub_client,
            Client(broker.endpoint, client_id="overlay-pub") as pub,
            sub_client.subscribe("class = 'sensors'") as sensors,
        ):
            await pub.advertise("class = 'alerts'")
            # The bridge starts once the overlay subscriber is in place (the retained
            # state reaches the overlay as soon as the bridge subscribes).
            bridge = Bridge(
                tmp_path,
                "--mqtt",
                mosquitto.url,
                "--endpoint",
                broker.endpoint,
                "--map",
                "sensors/{site}/#=class:sensors",
                "--out",
                "class = 'alerts'=alerts/{symbol}",
                "--client-id",
                "bridge-under-test",
                "--max-backoff",
                "0.5",
            )
            await asyncio.to_thread(bridge.wait_ready)
            await asyncio.wait_for(mqtt_sub.subscribed.wait(), 10)

            async def read_overlay() -> None:
                async for msg in sensors:
                    overlay_got.append(msg)

            reader = asyncio.create_task(read_overlay())

            # MQTT -> overlay: JSON, text, binary, and one topic too deep to map.
            deep = "sensors/lab/" + "/".join(["x"] * 148)  # Mosquitto allows 200 levels
            await mqtt_publish(
                mosquitto.port,
                [("sensors/lab/temp", reading(i), False) for i in range(10)]
                + [
                    ("sensors/lab/note", b"hello", False),
                    (deep, b"{}", False),
                    ("sensors/lab/raw", b"\xff\x00\x01", False),
                ],
            )
            # overlay -> MQTT, and one alert with no symbol for its topic.
            for i in range(10):
                symbol = "ACME" if i % 2 else "INIT"
                await pub.publish(
                    {"class": "alerts", "symbol": symbol, "i": i}, f"alert {i}".encode()
                )
            await pub.publish({"class": "alerts", "i": 99}, b"no symbol")
            await wait_until(lambda: len(overlay_got) >= 13, 10, "MQTT -> overlay before restart")
            await wait_until(lambda: len(mqtt_sub.got) >= 10, 10, "overlay -> MQTT before restart")

            by_payload = {m.payload: m for m in overlay_got}
            assert by_payload[b"on"].attrs == {
                "class": "sensors",
                "site": "lab",
                "topic": "sensors/lab/state",
                "topic_0": "sensors",
                "topic_1": "lab",
                "topic_2": "state",
                "format": "text",
            }
            for i in range(10):
                assert by_payload[reading(i)].attrs == reading_attrs(i)
                assert by_payload[reading(i)].publisher == "bridge-under-test"
            assert by_payload[b"hello"].attrs["format"] == "text"
            assert by_payload[b"\xff\x00\x01"].attrs["format"] == "binary"
            assert [m.payload for m in overlay_got if m.attrs.get("topic") == deep] == []
            assert sorted((r.topic, r.payload) for r in mqtt_sub.got) == sorted(
                (f"alerts/{'ACME' if i % 2 else 'INIT'}", f"alert {i}".encode()) for i in range(10)
            )
            assert all(r.trellis_id.startswith("overlay-pub#") for r in mqtt_sub.got)

            # Mosquitto restarts while alerts stream from the overlay; sensors publish after.
            async def stream_alerts() -> None:
                for i in range(10, 60):
                    await pub.publish(
                        {"class": "alerts", "symbol": "ACME", "i": i}, f"alert {i}".encode()
                    )
                    await asyncio.sleep(0.02)

            streaming = asyncio.create_task(stream_alerts())
            await asyncio.sleep(0.3)
            await asyncio.to_thread(mosquitto.stop)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(mosquitto.start)
            await mqtt_publish(
                mosquitto.port, [("sensors/lab/temp", reading(i), False) for i in range(10, 30)]
            )
            await streaming
            await wait_until(lambda: len(overlay_got) >= 33, 15, "MQTT -> overlay after restart")
            await wait_until(
                lambda: len(mqtt_sub.fresh()) >= 60,
                15,
                "overlay -> MQTT after restart",
                lambda: f"{mqtt_sub.got}\n{bridge.log.read_text()[-3000:]}",
            )
            await asyncio.sleep(1.0)  # anything duplicated would arrive by now
            reader.cancel()

        inbound = [m.payload for m in overlay_got]
        assert sorted(inbound) == sorted(
            [reading(i) for i in range(30)] + [b"on", b"hello", b"\xff\x00\x01"]
        ), "MQTT -> overlay lost or duplicated"
        assert [m.attrs["i"] for m in overlay_got if m.attrs.get("topic_2") == "temp"] == list(
            range(30)
        )
        # Each alert published once by the bridge; Mosquitto may redeliver (DUP) to the
        # subscriber what it had not acknowledged when Mosquitto stopped: that is QoS 1
        # between those two, and the copy carries the same trellis-id.
        outbound = [r.payload for r in mqtt_sub.fresh()]
        assert {r.trellis_id for r in mqtt_sub.got} == {r.trellis_id for r in mqtt_sub.fresh()}
        counts = Counter(outbound)
        assert sorted(outbound) == sorted(f"alert {i}".encode() for i in range(60)), (
            f"overlay -> MQTT lost or duplicated: {[p for p, n in counts.items() if n > 1]} "
            f"twice, {[i for i in range(60) if f'alert {i}'.encode() not in counts]} lost; "
            f"{mqtt_sub.got}\n{bridge.log.read_text()}"
        )
        assert bridge is not None
        code, stats = bridge.stop()
        assert code == 0, bridge.log.read_text()
        assert stats["unmappable"] == 2, stats
        assert stats["mqtt_connections"] == 2, stats
        assert mosquitto.starts == 2
        log = bridge.log.read_text()
        assert "cannot map MQTT message on 'sensors/lab/x/" in log
        assert "has no attribute 'symbol'" in log
    finally:
        sub_task.cancel()
        await asyncio.gather(sub_task, return_exceptions=True)
        if bridge is not None:
            bridge.kill()


async def test_bridge_recovers_from_an_overlay_broker_restart_without_duplicates(
    tmp_path: Path, mosquitto: Mosquitto, run_broker: Callable[..., BrokerProcess]
) -> None:
    first = run_broker("b1")
    bridge = Bridge(
        tmp_path,
        "--mqtt",
        mosquitto.url,
        "--endpoint",
        first.endpoint,
        "--map",
        "sensors/{site}/#=class:sensors",
        "--out",
        "class = 'alerts'=alerts/{symbol}",
        "--client-id",
        "bridge-under-test",
        "--max-backoff",
        "0.5",
    )
    mqtt_sub = MqttSubscriber(mosquitto.port, "alerts/#")
    sub_task = asyncio.create_task(mqtt_sub.run())
    try:
        await asyncio.to_thread(bridge.wait_ready)
        await asyncio.wait_for(mqtt_sub.subscribed.wait(), 10)
        # While the overlay broker is down, MQTT messages wait unacknowledged.
        first.stop()
        held = [("sensors/lab/temp", reading(i), False) for i in range(5)]
        await mqtt_publish(mosquitto.port, held)
        await asyncio.sleep(0.5)
        run_broker("b1", port=first.port)
        async with (
            Client(first.endpoint, client_id="overlay-sub") as sub_client,
            Client(first.endpoint, client_id="overlay-pub") as pub,
            sub_client.subscribe("class = 'sensors'") as sensors,
        ):
            await pub.advertise("class = 'alerts'")
            got: list[Delivery] = []

            async def read_overlay() -> None:
                async for msg in sensors:
                    got.append(msg)

            reader = asyncio.create_task(read_overlay())
            # The bridge restores its advertisement and subscription by itself: probe
            # until both directions carry again, then send what is counted.
            deadline = time.monotonic() + 15
            probe = 0
            while not any(m.payload.startswith(b"probe") for m in got) or not any(
                r.payload.startswith(b"probe") for r in mqtt_sub.got
            ):
                assert time.monotonic() < deadline, (
                    "bridge did not recover:\n" + bridge.log.read_text()
                )
                probe += 1
                await mqtt_publish(
                    mosquitto.port, [("sensors/lab/probe", b"probe %d" % probe, False)]
                )
                await pub.publish({"class": "alerts", "symbol": "PROBE"}, b"probe %d" % probe)
                await asyncio.sleep(0.2)
            await mqtt_publish(
                mosquitto.port, [("sensors/lab/temp", reading(i), False) for i in range(10, 20)]
            )
            for i in range(10):
                await pub.publish({"class": "alerts", "symbol": "ACME"}, b"after %d" % i)
            await wait_until(
                lambda: (
                    sum(m.attrs.get("topic_2") == "temp" and m.attrs["i"] >= 10 for m in got) >= 10
                ),
                10,
                "MQTT -> overlay after the overlay restart",
            )
            await wait_until(
                lambda: sum(r.payload.startswith(b"after") for r in mqtt_sub.fresh()) >= 10,
                10,
                "overlay -> MQTT after the overlay restart",
            )
            await asyncio.sleep(0.5)
            reader.cancel()
        temps = [m.payload for m in got if m.attrs.get("topic_2") == "temp"]
        assert Counter(temps).most_common(1)[0][1] == 1, "MQTT -> overlay duplicated"
        assert [reading(i) for i in range(10, 20)] == [
            p for p in temps if p not in {t[1] for t in held}
        ]
        # The held messages were published to the overlay once the broker was back; a
        # subscriber that restored its subscription before that got them (at most once).
        after = [r.payload for r in mqtt_sub.fresh() if r.payload.startswith(b"after")]
        assert after == [b"after %d" % i for i in range(10)]
        code, stats = bridge.stop()
        assert code == 0, bridge.log.read_text()
        # Every MQTT message (held, probes, counted) became one overlay publication.
        assert stats["mqtt_received"] == stats["to_overlay"] == 5 + probe + 10, stats
        assert stats["unmappable"] == 0, stats
    finally:
        sub_task.cancel()
        await asyncio.gather(sub_task, return_exceptions=True)
        bridge.kill()


async def test_messages_queued_while_the_bridge_was_down_are_bridged_once_after_it_restarts(
    tmp_path: Path, mosquitto: Mosquitto, broker: BrokerProcess
) -> None:
    args = (
        "--mqtt",
        mosquitto.url,
        "--endpoint",
        broker.endpoint,
        "--map",
        "sensors/{site}/#=class:sensors",
        "--client-id",
        "bridge-under-test",
    )
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    bridge = Bridge(tmp_path / "one", *args)
    restarted: Bridge | None = None
    try:
        async with (
            Client(broker.endpoint, client_id="overlay-sub") as sub_client,
            sub_client.subscribe("class = 'sensors'") as sensors,
        ):
            got: list[Delivery] = []

            async def read_overlay() -> None:
                async for msg in sensors:
                    got.append(msg)

            reader = asyncio.create_task(read_overlay())
            await asyncio.to_thread(bridge.wait_ready)
            await mqtt_publish(mosquitto.port, [("sensors/lab/temp", reading(0), False)])
            await wait_until(lambda: len(got) == 1, 10, "the first reading")
            code, _ = bridge.stop()
            assert code == 0
            # More than Mosquitto's in-flight window (20): were any left unacknowledged,
            # the rest would never come.
            await mqtt_publish(
                mosquitto.port, [("sensors/lab/temp", reading(i), False) for i in range(1, 60)]
            )
            restarted = Bridge(tmp_path / "two", *args)
            await asyncio.to_thread(restarted.wait_ready)
            await wait_until(
                lambda: len(got) >= 60,
                15,
                "the readings queued on the session",
                lambda: f"{len(got)}\n{restarted.log.read_text()}" if restarted else "",
            )
            await asyncio.sleep(0.5)
            reader.cancel()
        # Same publisher id after a restart: its numbering continued, so nothing was taken
        # for a replay, and nothing came twice.
        assert [m.attrs["i"] for m in got] == list(range(60))
        seqs = [m.seq for m in got]
        assert seqs == sorted(set(seqs))
        code, stats = restarted.stop()
        assert code == 0
        assert stats["to_overlay"] == 59, stats
    finally:
        bridge.kill()
        if restarted is not None:
            restarted.kill()


async def test_bridge_reaches_a_tls_only_overlay_with_a_client_certificate(
    tmp_path: Path, mosquitto: Mosquitto, run_broker: Callable[..., BrokerProcess]
) -> None:
    from security.ca import create_ca, issue, save_ca, write_issued

    pki = tmp_path / "pki"
    ca = create_ca("bridge test CA")
    save_ca(ca, pki)
    for name, role in (("b1", "broker"), ("bridge", "client"), ("reader", "client")):
        write_issued(issue(ca, name, role), ca, pki, name)  # type: ignore[arg-type]
    broker = run_broker(
        "b1", tls_ca=str(pki / "ca.crt"), tls_cert=str(pki / "b1.crt"), tls_key=str(pki / "b1.key")
    )
    tls = {"ca": pki / "ca.crt", "cert": pki / "reader.crt", "key": pki / "reader.key"}
    async with (
        Client(broker.endpoint, client_id="reader", **tls) as reader,  # type: ignore[arg-type]
        reader.subscribe("class = 'sensors'") as sensors,
    ):
        bridge = Bridge(
            tmp_path,
            *("--mqtt", mosquitto.url, "--endpoint", broker.endpoint),
            *("--map", "sensors/{site}/#=class:sensors", "--client-id", "bridge"),
            *("--ca", str(pki / "ca.crt"), "--cert", str(pki / "bridge.crt")),
            *("--key", str(pki / "bridge.key")),
        )
        try:
            await asyncio.to_thread(bridge.wait_ready)
            await mqtt_publish(
                mosquitto.port, [("sensors/lab/temp", reading(i), False) for i in range(3)]
            )
            got = [await sensors.get(10) for _ in range(3)]
            assert [m.payload for m in got] == [reading(i) for i in range(3)]
            assert [m.attrs for m in got] == [reading_attrs(i) for i in range(3)]
        finally:
            code, stats = await asyncio.to_thread(bridge.stop)
    assert code == 0, bridge.log.read_text()
    assert stats["to_overlay"] == 3, stats
