"""Helpers shared by tests: the SDK, and the `trellis` command run as a user would."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.client import Client, Delivery, Subscription
from broker.errors import TrellisTimeout
from broker.tools.local import LocalOverlay


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Wait, blocking, for a condition on processes or files (tests that are not async)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s {what}".strip()
        time.sleep(0.02)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition on state that offers no event to await (a broker's, a client's)."""
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - polling state from outside its owner
            await asyncio.sleep(0.01)


async def drain(sub: Subscription, idle: float = 0.5) -> list[Delivery]:
    """Everything a subscription receives until it has been idle for ``idle`` seconds."""
    got: list[Delivery] = []
    while True:
        try:
            got.append(await asyncio.wait_for(sub.__anext__(), idle))
        except TimeoutError:
            return got


def trellis(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``trellis ARGS`` (as ``python -m broker``) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Exchange:
    """What one publisher sent and one subscriber received, compared exactly."""

    sent: list[tuple[int, bytes]]
    received: list[tuple[int, bytes]]
    blamed: dict[str, int]
    """Edge replicas the subscriber caught delivering a bad copy (``Client.copy_blames``)."""

    @property
    def altered(self) -> int:
        """Deliveries whose payload is not what was published under their seq."""
        genuine = dict(self.sent)
        return sum(1 for seq, payload in self.received if genuine.get(seq) != payload)

    @property
    def lost(self) -> int:
        return len({seq for seq, _ in self.sent} - {seq for seq, _ in self.received})

    @property
    def duplicated(self) -> int:
        return len(self.received) - len({seq for seq, _ in self.received})

    @property
    def reordered(self) -> int:
        seqs = [seq for seq, _ in self.received]
        return sum(1 for a, b in itertools.pairwise(seqs) if b <= a)

    def faults(self) -> dict[str, int]:
        return {
            "altered": self.altered,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "reordered": self.reordered,
        }


async def exact_exchange(
    overlay: LocalOverlay,
    publisher_id: str,
    count: int,
    *,
    plain_every: int = 1,
    rate: float = 50.0,
    wait: float = 10.0,
    share_form: str = "pass",
) -> Exchange:
    """``publisher_id`` at the first VN publishes ``count`` distinct payloads at ``rate``/s
    (every ``plain_every``-th plain, the rest confidential; 0: all confidential); a
    subscriber on every replica of the last VN collects what it is delivered until it has
    everything or ``wait`` seconds pass without a delivery, then half a second more.
    ``share_form``: how the publisher's key shares travel (``Client(share_form=...)``)."""
    vns = sorted(overlay.tree.brokers)
    pub = Client(
        overlay.endpoints(vns[0]),
        client_id=publisher_id,
        share_form=share_form,
        **overlay.client_tls(),
    )
    sub_client = Client(
        overlay.endpoints(vns[-1]), manifest=overlay.manifest, **overlay.client_tls()
    )
    flt = f"class = 'exact' and publisher = '{publisher_id}'"
    sent: list[tuple[int, bytes]] = []
    received: list[tuple[int, bytes]] = []
    async with pub, sub_client, sub_client.subscribe(flt) as sub:
        await pub.advertise(flt)
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(count):
            payload = f"{publisher_id} #{i} ".encode() * 3
            plain = plain_every > 0 and i % plain_every == 0
            seq = await pub.publish(
                {"class": "exact", "publisher": publisher_id, "i": i},
                payload,
                confidential=not plain,
            )
            sent.append((seq, payload))
            await asyncio.sleep(1 / rate)
        idle = wait
        while True:
            try:
                msg = await sub.get(idle)
            except TrellisTimeout:
                break
            received.append((msg.seq, msg.payload))
            if len(received) >= count:
                idle = 0.5
    return Exchange(sent, received, dict(sub_client.copy_blames))


async def all_closed(writers: Iterable[asyncio.StreamWriter], timeout: float = 5.0) -> None:
    """Wait until ``writers`` (closed) have closed their sockets: a transport closes its
    socket one loop iteration after ``close()``, so a test that ended first left it to the
    garbage collector, whose ResourceWarning then failed whichever test was running (CI,
    2026-12-02: ``test_many_small_publishers_are_all_delivered``)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)


class GatedProxy:
    """A loopback TCP proxy whose broker-to-client direction is held at a gate: chunks
    pass only as the test lets them (``release(n)``, ``open()``)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.to_client: asyncio.Queue[bytes] = asyncio.Queue()
        self.credit = asyncio.Semaphore(0)
        self.opened = False
        self.from_client: list[bytes] = []
        self.client_data = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.connections = 0  # accepted from clients

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    def release(self, chunks: int = 1) -> None:
        for _ in range(chunks):
            self.credit.release()

    def open(self) -> None:
        self.opened = True
        self.release(1_000_000)

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        breader, bwriter = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [cwriter, bwriter]

        async def upstream() -> None:
            while data := await creader.read(65536):
                self.from_client.append(data)
                self.client_data.set()
                bwriter.write(data)
            bwriter.close()

        async def downstream() -> None:
            while data := await breader.read(65536):
                await self.credit.acquire()
                cwriter.write(data)
            cwriter.close()

        for coro in (upstream(), downstream()):
            task = asyncio.create_task(coro)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def wait_client_chunks(self, count: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.from_client) < count:
                self.client_data.clear()
                await self.client_data.wait()

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for writer in self.writers:
            writer.close()
        await all_closed(self.writers)
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
