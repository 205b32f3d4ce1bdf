"""Broker benchmark: Trellis against Mosquitto, amqtt and nats-server (SPEC §10).

Usage::

    .venv/bin/python bench/bench_broker.py            # 3 repeats, prints medians and ratios
    .venv/bin/python bench/bench_broker.py --quick    # 1 repeat
    .venv/bin/python bench/bench_broker.py --systems trellis,mosquitto,nats --repeat 3
    .venv/bin/python bench/bench_broker.py --write    # also append the medians to RESULTS-broker.md
    .venv/bin/python bench/bench_broker.py --systems trellis --tls compare   # the cost of TLS
    .venv/bin/python bench/bench_broker.py --systems trellis --secured compare   # credentials

For every system (trellis, mosquitto, amqtt, nats) and scenario (1→1, 1→10; 100-byte payloads)
a run starts a fresh broker process, starts the subscriber processes and one publisher process
with each system's best client (Mosquitto and amqtt: the ``mosquitto_sub``/``mosquitto_pub`` C
clients at QoS 0; Trellis: its Python SDK on uvloop; nats-server: nats-py on uvloop; the two
Python clients in separate processes started from this file), waits until every subscriber has
received a probe publication (so all subscriptions are live and the publisher is connected),
then publishes N messages and measures:

* end-to-end rate: deliveries at all subscribers / (last delivery at the slowest subscriber -
  the moment the publisher was released);
* broker CPU per delivery: the broker process's utime+stime (``/proc/<pid>/stat``) over the
  run, divided by the deliveries;
* losses: expected deliveries minus actual ones;
* client CPU per message (publisher) and per delivery (all subscribers together), the same way.

Which client for nats-server: Debian packages the server (``nats-server``) and the C library
(``libnats``), but no NATS command-line client (no ``nats``/``nats bench``, whose Go source
alone is packaged), so the choice is nats-py or a C program of our own against libnats.
nats-py is NATS's own official Python client, and it puts nats-server in the same position as
Trellis: a client of the same class (asyncio on uvloop, one process per client, publishing
without acknowledgements into a buffer that is flushed in large writes, ``flush()`` at the end
as Trellis's ``drain()``), so the end-to-end rates compare the brokers and not C against
Python. The figure SPEC §10 sets against nats-server is the broker's CPU per delivery, read from
/proc, which the client's speed barely moves as long as the broker is fed batches of the same
shape; and nats-py keeps the run free of a compiler step. A C client would raise nats's
msg/s (as the C clients do for Mosquitto), so read the Trellis/nats msg/s ratio as
"same-class clients", not as nats's ceiling.

With ``--tls compare`` every Trellis run is followed by the same run over TLS ("trellis+tls":
the broker's listener TLS-only, each client presenting a client certificate, all from a CA
made for the run with ``security.ca``; Ed25519 keys, TLS 1.3), and a table gives the change.
With ``--secured compare`` every Trellis run is followed by the same run on a secured topic
("trellis+secured", issue 17): the broker has ``topic_trust``, the publisher is the topic's
owner and each subscriber holds the owner's delegation, presented in HELLO; publications carry
``class = 'Secured/<uuid>'``. The broker checks credentials at HELLO, ADVERTISE and SUBSCRIBE,
not per publication, so the table shows what the publish path pays for being secured.

Every wait is bounded; every process a run starts is killed by PID when the run ends. Set
``BENCH_KEEP=1`` to keep each run's broker log and client outputs for inspection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Protocol

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from peers import cpu_seconds, peer_version, start_amqtt, start_mosquitto, start_nats  # noqa: E402

PAYLOAD_SIZE = 100
PROBE = b"probe"
TOPIC = "bench"
SYSTEMS = ("trellis", "mosquitto", "amqtt", "nats")
PEERS = ("mosquitto", "amqtt", "nats")
# Systems whose clients are this file's own Python processes (they report "ready"/"done").
PY_CLIENTS = ("trellis", "nats")
SCENARIOS = {"1→1": 1, "1→10": 10}

# Publications per run, chosen so one run takes about 1-5 s on 2 shared cores and the
# broker's CPU over a run spans at least MIN_TICKS clock ticks (CPU time is read in 10 ms
# ticks: on the faster machine of 2026-11-23, Trellis used only 7-10 ticks at 20k/6k
# publications, nats-server 2-3 at 50k/10k). The metrics are per delivery or per second, so
# different N per system stays a fair comparison.
COUNTS: dict[tuple[str, int], int] = {
    ("trellis", 1): 100_000,
    ("trellis", 10): 50_000,
    ("mosquitto", 1): 50_000,
    ("mosquitto", 10): 10_000,
    ("amqtt", 1): 5_000,
    ("amqtt", 10): 800,
    ("nats", 1): 1_500_000,
    ("nats", 10): 200_000,
}
# Fewer broker CPU ticks than this in a run: its CPU figure is flagged (±1 tick is ±5%).
# Mosquitto 1→1 stays near 25: above ~60k QoS 0 publications its queue drops messages.
MIN_TICKS = 20

READY_TIMEOUT = 30.0  # subscribers connected and subscribed
IDLE_TIMEOUT = 3.0  # no delivery progress for this long: the rest is lost
RUN_TIMEOUT = 60.0  # hard cap on one measurement
PROBE_INTERVAL = 0.1
POLL = 0.01
CLK_TCK = os.sysconf("SC_CLK_TCK")
KEEP = bool(os.environ.get("BENCH_KEEP"))  # keep broker logs and client outputs

# SPEC §10: Trellis/peer ratio goals, (broker CPU per delivery at most, msg/s at least);
# None where the SPEC sets no goal against that peer.
GOALS: dict[str, tuple[float | None, float | None]] = {
    "mosquitto": (1.0, 0.5),
    "amqtt": (0.1, 10.0),
    "nats": (3.0, None),
}


# ---------------------------------------------------------------------------------------
# Trellis client roles (run in their own processes: ``bench_broker.py _trellis_sub ...``)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _client_tls() -> dict[str, str]:
    """The SDK's TLS arguments in a client process: from ``BENCH_TLS`` (a directory with
    ca.crt, client.crt, client.key), none when it is unset."""
    directory = os.environ.get("BENCH_TLS")
    if not directory:
        return {}
    return {
        "ca": f"{directory}/ca.crt",
        "cert": f"{directory}/client.crt",
        "key": f"{directory}/client.key",
    }


def _secured_client(role: str) -> tuple[str, dict[str, object]]:
    """The class to publish and subscribe under and the HELLO options of ``role`` (owner or
    reader) on a secured topic, from ``BENCH_SECURED``; ``("bench", {})`` when it is unset."""
    directory = os.environ.get("BENCH_SECURED")
    if not directory:
        return "bench", {}
    import msgpack

    from security.envelope import Signer, private_key_from_bytes
    from security.topics import TopicAdvertisement
    from security.topics_credentials import present_credentials
    from security.topics_delegations import Delegation

    data = msgpack.unpackb(Path(directory, "secured.msgpack").read_bytes(), raw=False)
    mine = data[role]
    signer = Signer(role, private_key_from_bytes(mine["key"]))
    ad = TopicAdvertisement.from_wire(data["advertisement"])
    grant = None if mine["grant"] is None else Delegation.from_wire(mine["grant"])
    credentials = present_credentials(
        signer, f"bench-{role}-{os.getpid()}", time.time(), [(ad, grant)]
    )
    return data["class"], {"credentials": credentials}


def _say(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


async def _trellis_sub(endpoint: str, count: int) -> None:
    """Count `count` data deliveries; say "ready" on the first probe and "done" at the end.

    Stays connected until stdin closes, so the broker sees no disconnect during a run.
    """
    from broker.client import Client
    from broker.errors import SlowConsumerError

    stdin = await _stdin_reader()
    loop = asyncio.get_running_loop()
    got = 0
    last = 0.0
    ready = False
    klass, hello = _secured_client("reader")
    client = Client(
        endpoint,
        client_id=f"bench-reader-{os.getpid()}" if hello else f"bench-sub-{os.getpid()}",
        queue_size=count + 10_000,
        hello_options=hello,
        **_client_tls(),  # type: ignore[arg-type]
    )
    async with client, client.subscribe(f"class = '{klass}'") as sub:

        async def consume() -> None:
            nonlocal got, last, ready
            while True:
                try:
                    async for msg in sub:
                        if len(msg.payload) == PAYLOAD_SIZE:
                            got += 1
                            last = time.time()
                            if got >= count:
                                return
                        elif not ready:
                            ready = True
                            _say("ready")
                except SlowConsumerError:
                    continue
                return

        consumer = asyncio.create_task(consume())
        seen, quiet_since = -1, loop.time()
        while not consumer.done():
            await asyncio.wait([consumer], timeout=0.1)
            now = loop.time()
            if got != seen:
                seen, quiet_since = got, now
            elif now - quiet_since > (IDLE_TIMEOUT if got else RUN_TIMEOUT):
                consumer.cancel()
                break
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        _say("done", got, f"{last:.6f}", sub.dropped)
        await stdin.read()


async def _trellis_pub(endpoint: str, count: int, size: int) -> None:
    """Publish one probe per "probe" line and `count` messages on "go"; exit on EOF."""
    from broker.client import Client

    stdin = await _stdin_reader()
    klass, hello = _secured_client("owner")
    attrs = {"class": klass}
    payload = b"x" * size
    client = Client(
        endpoint,
        client_id=f"bench-owner-{os.getpid()}" if hello else f"bench-pub-{os.getpid()}",
        hello_options=hello,
        **_client_tls(),  # type: ignore[arg-type]
    )
    async with client:
        await client.advertise(f"class = '{klass}'")
        while line := await stdin.readline():
            command = line.strip()
            if command == b"probe":
                await client.publish(attrs, PROBE, ack=False)
            elif command == b"go":
                publish = client.publish
                for _ in range(count):
                    await publish(attrs, payload, ack=False)
                await client.drain(timeout=RUN_TIMEOUT)
                _say("sent")


async def _nats_sub(endpoint: str, count: int) -> None:
    """`_trellis_sub` with nats-py: the same reports, slow-consumer drops as "dropped"."""
    import nats
    from nats.errors import SlowConsumerError

    stdin = await _stdin_reader()
    loop = asyncio.get_running_loop()
    got = dropped = 0
    last = 0.0
    ready = False
    finished = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        nonlocal dropped
        if isinstance(exc, SlowConsumerError):
            dropped += 1

    async def on_msg(msg: nats.aio.msg.Msg) -> None:
        nonlocal got, last, ready
        if len(msg.data) == PAYLOAD_SIZE:
            got += 1
            last = time.time()
            if got >= count:
                finished.set()
        elif not ready:
            ready = True
            _say("ready")

    nc = await nats.connect(
        f"nats://{endpoint}",
        name=f"bench-sub-{os.getpid()}",
        allow_reconnect=False,
        error_cb=on_error,
    )
    try:
        await nc.subscribe(
            TOPIC, cb=on_msg, pending_msgs_limit=count + 10_000, pending_bytes_limit=0
        )
        await nc.flush()
        seen, quiet_since = -1, loop.time()
        while not finished.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), 0.1)
            now = loop.time()
            if got != seen:
                seen, quiet_since = got, now
            elif now - quiet_since > (IDLE_TIMEOUT if got else RUN_TIMEOUT):
                break
        _say("done", got, f"{last:.6f}", dropped)
        await stdin.read()
    finally:
        await nc.close()


async def _nats_pub(endpoint: str, count: int, size: int) -> None:
    """`_trellis_pub` with nats-py: publish (no acks), then ``flush()`` (a PING/PONG round)."""
    import nats

    stdin = await _stdin_reader()
    payload = b"x" * size
    nc = await nats.connect(
        f"nats://{endpoint}", name=f"bench-pub-{os.getpid()}", allow_reconnect=False
    )
    try:
        while line := await stdin.readline():
            command = line.strip()
            if command == b"probe":
                await nc.publish(TOPIC, PROBE)
                await nc.flush(timeout=int(RUN_TIMEOUT))
            elif command == b"go":
                publish = nc.publish
                for _ in range(count):
                    await publish(TOPIC, payload)
                await nc.flush(timeout=int(RUN_TIMEOUT))
                _say("sent")
    finally:
        await nc.close()


CLIENT_ROLES = {
    "_trellis_sub": _trellis_sub,
    "_trellis_pub": _trellis_pub,
    "_nats_sub": _nats_sub,
    "_nats_pub": _nats_pub,
}


def _client_main(argv: Sequence[str]) -> None:
    role, endpoint, *rest = argv
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        runner.run(CLIENT_ROLES[role](endpoint, *(int(x) for x in rest)))


# ---------------------------------------------------------------------------------------
# Harness side: subscribers, publishers, brokers


def _spawn(
    cmd: list[str], out: Path, *, stdin: int | None = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        return subprocess.Popen(
            cmd, stdin=stdin, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def _cpu(proc: subprocess.Popen[bytes]) -> float:
    try:
        return cpu_seconds(proc.pid)
    except (OSError, ValueError):
        return float("nan")


class Subscriber(Protocol):
    process: subprocess.Popen[bytes]
    ready: bool
    finished: bool
    count: int
    last: float
    dropped: int

    def poll(self) -> None: ...


@dataclass
class MqttSubscriber:
    """``mosquitto_sub`` printing '<unix time ns> <payload length>' per message."""

    process: subprocess.Popen[bytes]
    out: Path
    expected: int
    ready: bool = False
    finished: bool = False
    count: int = 0
    last: float = 0.0
    dropped: int = 0
    _offset: int = 0
    _partial: bytes = b""

    @classmethod
    def start(cls, port: int, index: int, expected: int, workdir: Path) -> MqttSubscriber:
        out = workdir / f"sub-{index}.out"
        cmd = [
            "mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", TOPIC, "-q", "0",
            "-i", f"bench-sub-{index}-{os.getpid()}", "-F", "%U %l",
        ]  # fmt: skip
        return cls(_spawn(cmd, out), out, expected)

    def poll(self) -> None:
        with self.out.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        if not chunk:
            if self.process.poll() is not None:
                self.finished = True
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            stamp, _, length = line.partition(b" ")
            if length == b"%d" % PAYLOAD_SIZE:
                self.count += 1
                self.last = float(stamp)
            elif length == b"%d" % len(PROBE):
                self.ready = True
        if self.count >= self.expected:
            self.finished = True


@dataclass
class TrellisSubscriber:
    """A ``_trellis_sub`` process, reporting "ready" and "done <n> <last> <dropped>"."""

    ROLE: ClassVar[str] = "_trellis_sub"
    process: subprocess.Popen[bytes]
    out: Path
    ready: bool = False
    finished: bool = False
    count: int = 0
    last: float = 0.0
    dropped: int = 0

    @classmethod
    def start(cls, endpoint: str, index: int, expected: int, workdir: Path) -> TrellisSubscriber:
        out = workdir / f"sub-{index}.out"
        script = str(Path(__file__).resolve())
        cmd = [sys.executable, script, cls.ROLE, endpoint, str(expected)]
        return cls(_spawn(cmd, out, stdin=subprocess.PIPE), out)

    def poll(self) -> None:
        text = self.out.read_text(errors="replace")
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["ready"]:
                self.ready = True
            elif words[:1] == ["done"] and len(words) == 4:
                self.count, self.last, self.dropped = int(words[1]), float(words[2]), int(words[3])
                self.finished = True
        if not self.finished and self.process.poll() is not None:
            self.finished = True  # crashed: counts stay 0; its output file says why


class NatsSubscriber(TrellisSubscriber):
    """A ``_nats_sub`` process (nats-py), with the same reports."""

    ROLE: ClassVar[str] = "_nats_sub"


class Publisher(Protocol):
    process: subprocess.Popen[bytes]

    def probe(self) -> None: ...
    def go(self) -> None: ...
    def sent(self) -> bool: ...


@dataclass
class MqttPublisher:
    """``mosquitto_pub -l``: one QoS 0 publication per stdin line."""

    process: subprocess.Popen[bytes]
    count: int
    writer: threading.Thread | None = None
    done_writing: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, port: int, count: int, workdir: Path) -> MqttPublisher:
        cmd = [
            "mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", TOPIC, "-q", "0", "-l",
            "-i", f"bench-pub-{os.getpid()}",
        ]  # fmt: skip
        return cls(_spawn(cmd, workdir / "pub.out", stdin=subprocess.PIPE), count)

    def probe(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(PROBE + b"\n")
        self.process.stdin.flush()

    def go(self) -> None:
        data = (b"x" * PAYLOAD_SIZE + b"\n") * self.count

        def write() -> None:
            with contextlib.suppress(OSError, ValueError):
                assert self.process.stdin is not None
                self.process.stdin.write(data)
                self.process.stdin.flush()
            self.done_writing.set()

        self.writer = threading.Thread(target=write, daemon=True)
        self.writer.start()

    def sent(self) -> bool:
        return self.done_writing.is_set()


@dataclass
class TrellisPublisher:
    """A ``_trellis_pub`` process driven by "probe"/"go" lines on its stdin."""

    ROLE: ClassVar[str] = "_trellis_pub"
    process: subprocess.Popen[bytes]
    out: Path

    @classmethod
    def start(cls, endpoint: str, count: int, workdir: Path) -> TrellisPublisher:
        out = workdir / "pub.out"
        cmd = [
            sys.executable, str(Path(__file__).resolve()), cls.ROLE, endpoint, str(count),
            str(PAYLOAD_SIZE),
        ]  # fmt: skip
        return cls(_spawn(cmd, out, stdin=subprocess.PIPE), out)

    def probe(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"probe\n")
        self.process.stdin.flush()

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.flush()

    def sent(self) -> bool:
        return "sent" in self.out.read_text(errors="replace").split()


class NatsPublisher(TrellisPublisher):
    """A ``_nats_pub`` process (nats-py) driven like ``_trellis_pub``."""

    ROLE: ClassVar[str] = "_nats_pub"


class Broker(Protocol):
    pid: int
    endpoint: str
    port: int

    def stop(self, timeout: float = ...) -> int: ...


def start_system(system: str, workdir: Path) -> Broker:
    if system == "mosquitto":
        return start_mosquitto(workdir)
    if system == "amqtt":
        return start_amqtt(workdir)
    if system == "nats":
        return start_nats(workdir)
    from broker.tools.launcher import start_broker

    return start_broker(workdir, "bench")


# ---------------------------------------------------------------------------------------
# One measurement


@dataclass
class Result:
    system: str
    scenario: str
    subscribers: int
    count: int  # publications
    deliveries: int
    seconds: float
    broker_cpu: float
    pub_cpu: float
    sub_cpu: float
    dropped: int
    note: str = ""

    @property
    def expected(self) -> int:
        return self.count * self.subscribers

    @property
    def lost(self) -> int:
        return self.expected - self.deliveries

    @property
    def rate(self) -> float:
        return self.deliveries / self.seconds if self.seconds > 0 else 0.0

    @property
    def broker_us(self) -> float:
        return 1e6 * self.broker_cpu / self.deliveries if self.deliveries else float("nan")

    @property
    def pub_us(self) -> float:
        return 1e6 * self.pub_cpu / self.count

    @property
    def sub_us(self) -> float:
        return 1e6 * self.sub_cpu / self.deliveries if self.deliveries else float("nan")


def measure(system: str, scenario: str, n_subs: int, count: int, scratch: Path) -> Result:
    """Start a fresh broker and clients, run one measurement, stop everything."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=scratch))
    broker = start_system(system, workdir)
    subs: list[Subscriber] = []
    pub: Publisher | None = None
    try:
        for i in range(n_subs):
            if system == "trellis":
                subs.append(TrellisSubscriber.start(broker.endpoint, i, count, workdir))
            elif system == "nats":
                subs.append(NatsSubscriber.start(broker.endpoint, i, count, workdir))
            else:
                subs.append(MqttSubscriber.start(broker.port, i, count, workdir))
        if system == "trellis":
            pub = TrellisPublisher.start(broker.endpoint, count, workdir)
        elif system == "nats":
            pub = NatsPublisher.start(broker.endpoint, count, workdir)
        else:
            pub = MqttPublisher.start(broker.port, count, workdir)

        # Readiness: probe until every subscriber has received one.
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            for sub in subs:
                sub.poll()
            if all(s.ready for s in subs):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sum(s.ready for s in subs)}/{n_subs} subscribers ready")
            if pub.process.poll() is not None:
                raise RuntimeError(f"publisher exited early, see {workdir}/pub.out")
            pub.probe()
            time.sleep(PROBE_INTERVAL)
        time.sleep(0.2)  # let probes still in flight land before the CPU baseline
        for sub in subs:
            sub.poll()

        cpu0 = cpu_seconds(broker.pid)
        pub0 = _cpu(pub.process)
        subs0 = [_cpu(s.process) for s in subs]
        t0 = time.time()
        pub.go()

        # Completion: every subscriber finished, or no progress for IDLE_TIMEOUT.
        hard = time.monotonic() + RUN_TIMEOUT
        progress, quiet_since = -1, time.monotonic()
        note = ""
        while True:
            for sub in subs:
                if not sub.finished:
                    sub.poll()
            if all(s.finished for s in subs):
                break
            now = time.monotonic()
            total = sum(s.count for s in subs)
            if total != progress:
                progress, quiet_since = total, now
            elif system not in PY_CLIENTS and now - quiet_since > IDLE_TIMEOUT:
                note = "idle timeout"
                break
            if now > hard:
                note = "run timeout"
                break
            time.sleep(POLL)
        cpu1 = cpu_seconds(broker.pid)
        pub1 = _cpu(pub.process)
        subs1 = [_cpu(s.process) for s in subs]
        if not pub.sent():
            note = (note + "; " if note else "") + "publisher unfinished"
        ticks = round((cpu1 - cpu0) * CLK_TCK)
        if ticks < MIN_TICKS:
            note = (note + "; " if note else "") + f"broker CPU under {MIN_TICKS} ticks"

        deliveries = sum(s.count for s in subs)
        last = max((s.last for s in subs if s.count), default=t0)
        return Result(
            system=system,
            scenario=scenario,
            subscribers=n_subs,
            count=count,
            deliveries=deliveries,
            seconds=last - t0,
            broker_cpu=cpu1 - cpu0,
            pub_cpu=pub1 - pub0,
            sub_cpu=sum(b - a for a, b in zip(subs0, subs1, strict=True)),
            dropped=sum(s.dropped for s in subs),
            note=note,
        )
    finally:
        procs = [s.process for s in subs] + ([pub.process] if pub is not None else [])
        for proc in procs:
            if proc.stdin is not None:  # our clients and mosquitto_pub exit on EOF
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            elif proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 3.0
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
        broker.stop()
        if not KEEP:
            shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Reporting


@dataclass
class Summary:
    system: str
    scenario: str
    count: int
    runs: int
    rate: float
    rate_range: tuple[float, float]
    broker_us: float
    broker_range: tuple[float, float]
    pub_us: float
    sub_us: float
    lost: int
    expected: int
    dropped: int
    notes: list[str]


def summarise(results: list[Result]) -> dict[tuple[str, str], Summary]:
    out: dict[tuple[str, str], Summary] = {}
    keys = sorted({(r.system, r.scenario) for r in results}, key=lambda k: (k[1], k[0]))
    for key in keys:
        rs = [r for r in results if (r.system, r.scenario) == key]
        out[key] = Summary(
            system=key[0],
            scenario=key[1],
            count=rs[0].count,
            runs=len(rs),
            rate=statistics.median(r.rate for r in rs),
            rate_range=(min(r.rate for r in rs), max(r.rate for r in rs)),
            broker_us=statistics.median(r.broker_us for r in rs),
            broker_range=(min(r.broker_us for r in rs), max(r.broker_us for r in rs)),
            pub_us=statistics.median(r.pub_us for r in rs),
            sub_us=statistics.median(r.sub_us for r in rs),
            lost=sum(r.lost for r in rs),
            expected=sum(r.expected for r in rs),
            dropped=sum(r.dropped for r in rs),
            notes=[r.note for r in rs if r.note],
        )
    return out


def _fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"  # noqa: PLR0124 (NaN check)


def _span(median: float, bounds: tuple[float, float], digits: int) -> str:
    low, high = bounds
    if low == high:
        return _fmt(median, digits)
    return f"{_fmt(median, digits)} ({_fmt(low, digits)}–{_fmt(high, digits)})"


def tables(summary: dict[tuple[str, str], Summary]) -> str:
    lines = [
        "| system | scenario | publications × subscribers | runs "
        "| delivered msg/s, median (min–max) | broker CPU µs/delivery, median (min–max) "
        "| publisher CPU µs/msg | subscriber CPU µs/delivery | lost / expected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary.values():
        lost = f"{s.lost} / {s.expected}" + (
            f" (SDK-reported drops {s.dropped})" if s.dropped else ""
        )
        if s.notes:
            lost += " — " + ", ".join(sorted(set(s.notes)))
        # A CPU delta under one clock tick reads as 0: say so instead.
        tick_us = 1e6 / CLK_TCK / s.count
        pub = _fmt(s.pub_us) if s.pub_us > 0 else f"< {tick_us:.1f} (under 1 tick)"
        lines.append(
            f"| {s.system} | {s.scenario} | {s.count:,} × {SCENARIOS[s.scenario]} | {s.runs} "
            f"| {_span(s.rate, s.rate_range, 0)} | {_span(s.broker_us, s.broker_range, 2)} "
            f"| {pub} | {_fmt(s.sub_us)} | {lost} |"
        )
    lines += [
        "",
        "| scenario | Trellis vs | CPU/delivery ratio | goal | msg/s ratio | goal |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        mine = summary.get(("trellis", scenario))
        for peer in PEERS:
            other = summary.get((peer, scenario))
            if mine is None or other is None:
                continue
            cpu_ratio = mine.broker_us / other.broker_us
            rate_ratio = mine.rate / other.rate if other.rate else float("nan")
            cpu_goal, rate_goal = GOALS[peer]
            lines.append(
                f"| {scenario} | {peer} | {cpu_ratio:.2f}× | {_goal('≤', cpu_goal, cpu_ratio)} "
                f"| {rate_ratio:.2f}× | {_goal('≥', rate_goal, rate_ratio)} |"
            )
    lines += logging_table(summary)
    lines += comparison_table(summary, TLS, "TLS off", "on")
    lines += comparison_table(summary, SECURED, "open topic", "secured")
    return "\n".join(lines)


def _goal(sign: str, goal: float | None, ratio: float) -> str:
    """'≤ 2× (met)', or '—' where the SPEC sets no goal."""
    if goal is None:
        return "— (no goal)"
    met = ratio <= goal if sign == "≤" else ratio >= goal
    return f"{sign} {goal:g}× ({'met' if met else 'NOT met'})"


def environment() -> list[str]:
    def pkg(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return [
        f"- machine: {os.cpu_count()} shared cores ({model}), Linux {platform.release()}",
        f"- Python {platform.python_version()}; trellis {pkg('trellis')}, uvloop {pkg('uvloop')}, "
        f"msgpack {pkg('msgpack')}; amqtt {pkg('amqtt')}; nats-py {pkg('nats-py')}",
        f"- {peer_version(['mosquitto', '-h'])}; "
        f"clients: {peer_version(['mosquitto_pub', '--help'])}",
        f"- {peer_version([shutil.which('nats-server') or '/usr/sbin/nats-server', '--version'])}",
    ]


def write_results(path: Path, heading: str, block: str) -> None:
    """Append a dated section to `path`, keeping every earlier section and note."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Broker benchmark results\n"
    section = f"## {heading}\n\n<!-- written by bench_broker.py --write -->\n{block}\n"
    path.write_text(text.rstrip("\n") + "\n\n" + section, encoding="utf-8")


def trellis_importable() -> str | None:
    """None when the Trellis daemon and SDK import; otherwise the reason they do not."""
    probe = subprocess.run(
        [sys.executable, "-c", "import broker.client, broker.daemon.server"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    return None if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1]


# The cost of traffic logging (issue 12): Trellis run again with its traffic log on.
LOGGED = "trellis+log"
LOG_GOAL = 0.10  # at most 10% more broker CPU per delivery


# The cost of TLS (issue 16): Trellis run again with TLS on the listener and every client.
TLS = "trellis+tls"


def _runs(
    systems: Sequence[str],
    traffic_log: str,
    scratch: Path,
    tls: str = "off",
    secured: str = "off",
) -> list[tuple[str, Path | None, bool, bool]]:
    """(system, traffic-log directory or None, TLS on, secured topic) in the order to
    measure them: with ``compare``, Trellis off then on back to back, so drifts of a shared
    machine hit both."""
    runs: list[tuple[str, Path | None, bool, bool]] = []
    for system in systems:
        runs.append((system, None, False, False))
        if system == "trellis" and traffic_log == "compare":
            runs.append((system, scratch / "traffic", False, False))
        if system == "trellis" and tls == "compare":
            runs.append((system, None, True, False))
        if system == "trellis" and secured == "compare":
            runs.append((system, None, False, True))
    return runs


# The cost of credential checks (issue 17): Trellis run again on a secured topic.
SECURED = "trellis+secured"


def _make_secured(directory: Path) -> Path:
    """A TDN trust file, a topic advertisement, its owner's key and a reader's key and
    delegation, for the secured runs."""
    import uuid

    import msgpack

    from broker.daemon.topic_guard import secured_class
    from security.envelope import Signer, private_key_to_bytes, public_key_to_bytes
    from security.topics import issue_advertisement, make_request
    from security.topics_delegations import delegate

    directory.mkdir(parents=True, exist_ok=True)
    tdn, owner, reader = (Signer.generate(n) for n in ("tdn-1", "owner", "reader"))
    (directory / "tdns.json").write_text(
        json.dumps({"tdn-1": public_key_to_bytes(tdn.public_key).hex()})
    )
    now = time.time()
    req = make_request(owner, "bench", nonce=os.urandom(16), now=now, lifetime=86400)
    ad = issue_advertisement(
        tdn, req, uuid=str(uuid.uuid4()), now=now, depth=0, expires=now + 86400
    )
    grant = delegate(owner, ad, public_key_to_bytes(reader.public_key), "subscribe", now=now)
    data = {
        "class": secured_class(ad.uuid),
        "advertisement": ad.to_wire(),
        "owner": {"key": private_key_to_bytes(owner.key), "grant": None},
        "reader": {"key": private_key_to_bytes(reader.key), "grant": grant.to_wire()},
    }
    (directory / "secured.msgpack").write_bytes(msgpack.packb(data, use_bin_type=True))
    return directory


def _secured(directory: Path | None) -> contextlib.AbstractContextManager[None]:
    """Brokers started inside guard secured topics; clients use the topic in ``directory``."""
    if directory is None:
        return _environment({})
    return _environment(
        {"TRELLIS_TOPIC_TRUST": str(directory / "tdns.json"), "BENCH_SECURED": str(directory)}
    )


def _make_pki(directory: Path) -> Path:
    """A CA, a broker certificate (loopback names) and a client certificate for the runs."""
    from security.ca import create_ca, issue, write_issued

    ca = create_ca("bench CA")
    write_issued(issue(ca, "bench", "broker"), ca, directory, "bench")
    write_issued(issue(ca, "client", "client"), ca, directory, "client")
    return directory


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for what starts inside (brokers read ``TRELLIS_*``, the
    client processes ``BENCH_*``), and restore them after."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _tls(directory: Path | None) -> contextlib.AbstractContextManager[None]:
    """Brokers and clients started inside speak TLS with the files in ``directory``."""
    if directory is None:
        return _environment({})
    return _environment(
        {
            "TRELLIS_TLS_CA": str(directory / "ca.crt"),
            "TRELLIS_TLS_CERT": str(directory / "bench.crt"),
            "TRELLIS_TLS_KEY": str(directory / "bench.key"),
            "BENCH_TLS": str(directory),
        }
    )


def comparison_table(
    summary: dict[tuple[str, str], Summary], variant: str, off: str, on: str
) -> list[str]:
    """Plain Trellis against its ``variant`` run per scenario (``off`` and ``on`` name the
    two in the header); empty without such runs (``--tls compare``, ``--secured compare``)."""
    lines = []
    for scenario in SCENARIOS:
        base, other = summary.get(("trellis", scenario)), summary.get((variant, scenario))
        if base is None or other is None:
            continue
        cpu = other.broker_us / base.broker_us - 1
        rate = other.rate / base.rate - 1 if base.rate else float("nan")
        pub = other.pub_us / base.pub_us - 1 if base.pub_us > 0 else float("nan")
        lines.append(
            f"| {scenario} | {base.broker_us:.2f} → {other.broker_us:.2f} | {cpu:+.0%} "
            f"| {base.rate:,.0f} → {other.rate:,.0f} | {rate:+.0%} "
            f"| {_fmt(base.pub_us)} → {_fmt(other.pub_us)} | {pub:+.0%} |"
        )
    if not lines:
        return []
    return [
        "",
        f"| scenario | broker CPU µs/delivery, {off} → {on} (medians) | change "
        f"| delivered msg/s {off} → {on} | change | publisher CPU µs/msg {off} → {on} | change |",
        "|---|---|---|---|---|---|---|",
        *lines,
    ]


@contextlib.contextmanager
def _traffic_log(directory: Path | None) -> Iterator[None]:
    """Brokers started inside log their traffic under ``directory`` (None: logging off)."""
    saved = os.environ.get("TRELLIS_TRAFFIC_LOG")
    value = "off" if directory is None else json.dumps({"dir": str(directory)})
    os.environ["TRELLIS_TRAFFIC_LOG"] = value
    try:
        yield
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if saved is None:
            os.environ.pop("TRELLIS_TRAFFIC_LOG", None)
        else:
            os.environ["TRELLIS_TRAFFIC_LOG"] = saved


def logging_table(summary: dict[tuple[str, str], Summary]) -> list[str]:
    """Logging on vs off per scenario (empty without ``--traffic-log compare`` runs)."""
    lines = []
    for scenario in SCENARIOS:
        off, on = summary.get(("trellis", scenario)), summary.get((LOGGED, scenario))
        if off is None or on is None:
            continue
        cpu = on.broker_us / off.broker_us - 1
        rate = on.rate / off.rate - 1 if off.rate else float("nan")
        met = "met" if cpu <= LOG_GOAL else "NOT met"
        lines.append(
            f"| {scenario} | {off.broker_us:.2f} → {on.broker_us:.2f} | {cpu:+.0%} "
            f"| {off.rate:,.0f} → {on.rate:,.0f} | {rate:+.0%} | ≤ +{LOG_GOAL:.0%} CPU ({met}) |"
        )
    if not lines:
        return []
    return [
        "",
        "| scenario | broker CPU µs/delivery, logging off → on (medians) | change "
        "| delivered msg/s off → on | change | goal |",
        "|---|---|---|---|---|---|",
        *lines,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat instead of three")
    parser.add_argument("--repeat", type=int, help="repeats per measurement (default 3)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every N by this")
    parser.add_argument(
        "--write", action="store_true", help="append a dated section to bench/RESULTS-broker.md"
    )
    parser.add_argument("--label", default="", help="heading text for --write")
    parser.add_argument(
        "--traffic-log",
        choices=("off", "compare"),
        default="off",
        help="compare: run Trellis with traffic logging off, then on (as 'trellis+log')",
    )
    parser.add_argument(
        "--tls",
        choices=("off", "compare"),
        default="off",
        help="compare: run Trellis in plaintext, then over TLS (as 'trellis+tls')",
    )
    parser.add_argument(
        "--secured",
        choices=("off", "compare"),
        default="off",
        help="compare: run Trellis on an open topic, then on a secured one ('trellis+secured')",
    )
    args = parser.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 3)
    systems = [s for s in args.systems.split(",") if s]
    scenarios = [s for s in args.scenarios.split(",") if s]
    for name in systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r}")
    for name in scenarios:
        if name not in SCENARIOS:
            parser.error(f"unknown scenario {name!r}")
    if "trellis" in systems and (why := trellis_importable()):
        print(f"skipping trellis: it does not import ({why})", file=sys.stderr)
        systems.remove("trellis")

    command = f"cd {REPO} && .venv/bin/python bench/" + shlex.join(
        [Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]
    )
    started = time.monotonic()
    results: list[Result] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    try:
        # Interleave systems within each repeat so slow drifts of a shared machine hit all.
        for rep in range(repeat):
            for scenario in scenarios:
                n_subs = SCENARIOS[scenario]
                for system, traffic, tls, sec in _runs(
                    systems, args.traffic_log, scratch, args.tls, args.secured
                ):
                    count = max(1, int(COUNTS[system, n_subs] * args.scale))
                    pki = scratch / "pki"
                    if tls and not pki.exists():
                        _make_pki(pki)
                    topic = scratch / "secured"
                    if sec and not topic.exists():
                        _make_secured(topic)
                    try:
                        with (
                            _traffic_log(traffic),
                            _tls(pki if tls else None),
                            _secured(topic if sec else None),
                        ):
                            r = measure(system, scenario, n_subs, count, scratch)
                    except Exception as exc:
                        name = TLS if tls else SECURED if sec else system
                        print(f"[{rep + 1}/{repeat}] {name} {scenario}: FAILED: {exc!r}")
                        continue
                    if traffic is not None:
                        r = replace(r, system=LOGGED)
                    if tls:
                        r = replace(r, system=TLS)
                    if sec:
                        r = replace(r, system=SECURED)
                    results.append(r)
                    print(
                        f"[{rep + 1}/{repeat}] {r.system:11} {scenario:5} {r.deliveries:>7}/"
                        f"{r.expected:<7} in {r.seconds:6.3f} s  {r.rate:>9,.0f} msg/s  "
                        f"broker {r.broker_us:7.2f} µs/dlv  pub {r.pub_us:6.1f} µs/msg  "
                        f"subs {r.sub_us:6.1f} µs/dlv {r.note}",
                        flush=True,
                    )
    finally:
        if KEEP:
            print(f"kept logs and outputs in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - started
    if not results:
        return 1
    summary = summarise(results)
    table = tables(summary)
    print()
    print(table)
    print(f"\n(total {elapsed:.0f} s)")
    if args.write:
        block = "\n".join(
            [
                f"Measured {dt.date.today().isoformat()} with `{command}` "
                f"({repeat} run(s) each, medians; total {elapsed:.0f} s).",
                "",
                *environment(),
                "",
                table,
            ]
        )
        heading = dt.datetime.now().strftime("%Y-%m-%d %H:%M") + (
            f" — {args.label}" if args.label else ""
        )
        write_results(BENCH_DIR / "RESULTS-broker.md", heading, block)
        print(f"wrote {BENCH_DIR / 'RESULTS-broker.md'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in CLIENT_ROLES:
        _client_main(sys.argv[1:])
    else:
        sys.exit(main())
