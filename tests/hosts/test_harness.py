"""The multi-host harness leaves nothing behind: namespaces, devices, processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client import Client
from overlay.tree import Tree
from tests.hosts.net import PREFIX, Network, ip, remove_leftovers, start_host_overlay
from tests.support import drain

pytestmark = pytest.mark.usefixtures("hosts_available")


def _ours(net: Network) -> tuple[set[str], set[str]]:
    """Our namespaces and switch devices that exist now."""
    netns = {line.split()[0] for line in ip("netns", "list").splitlines() if line.split()}
    ours = netns & set(net.namespaces())
    links = ip("-o", "link", "show") + "".join(ip("-o", "link", "show", netns=n) for n in ours)
    devices = {h.device for h in net.hosts.values() if f" {h.device}:" in links}
    return ours, devices


def test_close_removes_every_namespace_device_and_process(tmp_path: Path) -> None:
    net = Network.create(["a", "b"])
    try:
        overlay = start_host_overlay(tmp_path, net, Tree(["a", "b"], [("a", "b")]), {})
        pids = [p.pid for p in overlay.brokers.values()]
        assert _ours(net) == (set(net.namespaces()), {h.device for h in net.hosts.values()})
        assert overlay.endpoint("a").startswith(net.subnet + ".")

        async def exchange() -> list[int]:
            async with (
                Client(overlay.endpoints("a"), client_id="p") as pub,
                Client(overlay.endpoints("b")) as sub_client,
                sub_client.subscribe("class = 'h'") as sub,
            ):
                await pub.advertise("class = 'h'")
                for i in range(5):
                    await pub.publish({"class": "h", "i": i}, b"x")
                return [d.seq for d in await drain(sub)]

        assert asyncio.run(exchange()) == [1, 2, 3, 4, 5]
    finally:
        net.close()  # the brokers are still running: close must kill them
    assert _ours(net) == (set(), set())
    for pid in pids:
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )


def test_a_partition_drops_packets_between_the_two_groups_only() -> None:
    net = Network.create(["a", "b", "c"])
    try:
        net.cut(["a"], ["b"])

        def connects(src: str, dst: str) -> bool:
            probe = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    str(net.hosts[src].netns),
                    sys.executable,
                    "-c",
                    "import socket,sys; s=socket.socket(); s.settimeout(1.0)\n"
                    "try: s.connect((sys.argv[1], 9))\n"
                    "except ConnectionRefusedError: sys.exit(0)\n"
                    "except OSError: sys.exit(1)",
                    net.address(dst),
                ],
                capture_output=True,
                timeout=10,
                check=False,
            )
            return probe.returncode == 0  # refused: the packet got there and back

        assert not connects("a", "b")
        assert not connects("b", "a")
        assert connects("a", "c")
        assert connects("b", "c")
        net.heal()
        assert connects("a", "b")
        assert net.stats()["cut"] > 0
    finally:
        net.close()


def test_leftovers_of_a_dead_run_are_removed() -> None:
    name = f"{PREFIX}999999-left"  # no process has pid 999999 (above pid_max's default)
    ip("netns", "add", name)
    assert name in remove_leftovers()
    assert name not in ip("netns", "list")
