"""A userspace IP switch between network namespaces: every host's only link.

Each host (a network namespace, or the root namespace for the test's clients) gets one TUN
device; this process holds all of them and forwards each IPv4 packet to the TUN device that
owns its destination address. Between the two it applies the faults a test asks for, per
ordered pair of hosts: a cut (every packet dropped silently, as a partition does), random
loss, and a delay with uniform jitter (packets may overtake each other, as with netem).

Why a userspace switch and not veth pairs, a bridge and ``tc netem``: the kernels we run
on (CI's included) ship neither ``sch_netem`` nor the ``gact`` action, and no nft or
iptables tools; TUN devices and network namespaces they do have. The hosts' TCP stacks
are the kernel's own, so retransmission, flow control and connection timeouts are real.

Control: one JSON object per line on stdin, one JSON answer per line on stdout.

* ``{"op": "hosts", "hosts": {"10.0.0.2": 1, ...}}``: which device owns which address.
* ``{"op": "impair", "pairs": [[a, b], ...] | null, "loss": 0.05, "delay": 0.05,
  "jitter": 0.01}``: faults on packets from ``a`` to ``b`` (``null``: every pair).
* ``{"op": "cut", "pairs": [[a, b], ...]}``: drop every packet between ``a`` and ``b``
  (both directions). ``{"op": "heal"}`` removes every cut and impairment.
* ``{"op": "stats"}``: packets forwarded, lost, cut, delayed.

Run as ``python -m tests.hosts.switch PREFIX COUNT``: it creates COUNT devices named
PREFIX0..PREFIX{COUNT-1}, prints ``{"devices": [...]}`` and serves until stdin closes.
The devices vanish with the process (they are not persistent).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import socket
import struct
import sys
from dataclasses import dataclass

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000


@dataclass(frozen=True, slots=True)
class Impairment:
    loss: float = 0.0
    delay: float = 0.0
    jitter: float = 0.0


def open_tun(name: str) -> int:
    """A new non-persistent TUN device ``name`` (IPv4 packets, no packet-info header)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


class Switch:
    """Forwards packets between TUN devices by destination address, with faults."""

    def __init__(self, fds: list[int]) -> None:
        self.fds = fds
        self.owner: dict[bytes, int] = {}
        self.cuts: set[tuple[bytes, bytes]] = set()
        self.pairs: dict[tuple[bytes, bytes], Impairment] = {}
        self.everywhere: Impairment | None = None
        self.rng = random.Random()
        self.counts = {"forwarded": 0, "lost": 0, "cut": 0, "delayed": 0, "unroutable": 0}
        self.loop = asyncio.get_running_loop()

    def start(self) -> None:
        for fd in self.fds:
            self.loop.add_reader(fd, self._readable, fd)

    def _readable(self, fd: int) -> None:
        for _ in range(64):
            try:
                packet = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                self.loop.remove_reader(fd)
                return
            self._route(packet)

    def _route(self, packet: bytes) -> None:
        if len(packet) < 20 or packet[0] >> 4 != 4:
            return  # IPv6 router solicitations and the like: not ours
        src, dst = packet[12:16], packet[16:20]
        out = self.owner.get(dst)
        if out is None:
            self.counts["unroutable"] += 1
            return
        if (src, dst) in self.cuts:
            self.counts["cut"] += 1
            return
        fault = self.pairs.get((src, dst), self.everywhere)
        if fault is None:
            self._write(out, packet)
            return
        if fault.loss and self.rng.random() < fault.loss:
            self.counts["lost"] += 1
            return
        delay = fault.delay + (self.rng.uniform(-fault.jitter, fault.jitter) if fault.jitter else 0)
        if delay <= 0:
            self._write(out, packet)
            return
        self.counts["delayed"] += 1
        self.loop.call_later(delay, self._write, out, packet)

    def _write(self, index: int, packet: bytes) -> None:
        try:
            os.write(self.fds[index], packet)
            self.counts["forwarded"] += 1
        except OSError:  # a full device queue: the packet is lost, as on a real link
            self.counts["lost"] += 1

    def command(self, cmd: dict[str, object]) -> dict[str, object]:
        op = cmd.get("op")
        if op == "hosts":
            hosts = cmd["hosts"]
            assert isinstance(hosts, dict)
            self.owner = {socket.inet_aton(a): int(i) for a, i in hosts.items()}
        elif op == "impair":
            fault = Impairment(
                float(cmd.get("loss", 0.0)),  # type: ignore[arg-type]
                float(cmd.get("delay", 0.0)),  # type: ignore[arg-type]
                float(cmd.get("jitter", 0.0)),  # type: ignore[arg-type]
            )
            pairs = cmd.get("pairs")
            if pairs is None:
                self.everywhere = fault
            else:
                assert isinstance(pairs, list)
                for a, b in pairs:
                    self.pairs[(socket.inet_aton(a), socket.inet_aton(b))] = fault
        elif op == "cut":
            pairs = cmd["pairs"]
            assert isinstance(pairs, list)
            for a, b in pairs:
                self.cuts.add((socket.inet_aton(a), socket.inet_aton(b)))
                self.cuts.add((socket.inet_aton(b), socket.inet_aton(a)))
        elif op == "heal":
            self.cuts.clear()
            self.pairs.clear()
            self.everywhere = None
        elif op != "stats":
            return {"error": f"unknown op {op!r}"}
        return {"ok": True, **self.counts}


async def serve(prefix: str, count: int) -> None:
    fds = [open_tun(f"{prefix}{i}") for i in range(count)]
    switch = Switch(fds)
    switch.start()
    print(json.dumps({"devices": [f"{prefix}{i}" for i in range(count)]}), flush=True)
    reader = asyncio.StreamReader()
    await switch.loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        try:
            answer = switch.command(json.loads(line))
        except (ValueError, KeyError, TypeError, AssertionError, OSError) as exc:
            answer = {"error": str(exc)}
        print(json.dumps(answer), flush=True)
    for fd in fds:
        os.close(fd)


def main() -> None:
    prefix, count = sys.argv[1], int(sys.argv[2])
    try:
        import uvloop

        uvloop.run(serve(prefix, count))
    except ImportError:  # pragma: no cover
        asyncio.run(serve(prefix, count))


if __name__ == "__main__":
    main()
