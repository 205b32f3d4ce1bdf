"""Hosts with their own addresses: broker processes in Linux network namespaces.

Every broker runs in a namespace of its own (``ip netns exec NS python -m broker broker``)
with one address on a private /24; the test's clients stay in the root namespace, which
has an address on the same subnet. All packets between hosts cross the userspace switch
of :mod:`tests.hosts.switch`, which cuts, drops and delays them on demand.

Clean-up: every name this module creates starts with ``trh<PID>`` (the creating
process's pid). :meth:`Network.close` kills the brokers it started, stops the switch (its
TUN devices vanish with it) and deletes its namespaces; :func:`remove_leftovers` does the
same for namespaces whose creating process is gone (a test run that was killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.tools import launcher
from broker.tools.launcher import BrokerProcess, stop_process, write_config
from broker.tools.local import LocalOverlay, OverlayError
from overlay.tree import Tree

PREFIX = "trh"
BROKER_PORT = 7700
_LEFTOVER = re.compile(rf"^{PREFIX}(\d+)-")


class HostsUnavailable(RuntimeError):
    """This machine cannot create network namespaces or TUN devices (not root, no iproute2,
    no /dev/net/tun): the multi-host tests skip with this message."""


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    if check and done.returncode != 0:
        raise OSError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Delete namespaces an earlier run of this harness left (its process is gone), after
    killing the brokers still running in them. Returns the namespaces removed."""
    removed = []
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = _LEFTOVER.match(name)
        if not match or _pid_alive(int(match.group(1))):
            continue
        for pid in ip("netns", "pids", name, check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", name, check=False)
        removed.append(name)
    return removed


def check_available() -> None:
    """Raise :class:`HostsUnavailable` unless namespaces and TUN devices can be made here."""
    if sys.platform != "linux":
        raise HostsUnavailable("network namespaces need Linux")
    if os.geteuid() != 0:
        raise HostsUnavailable("creating network namespaces needs root")
    if not Path("/dev/net/tun").exists():
        raise HostsUnavailable("no /dev/net/tun: TUN devices are unavailable")
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        ip("netns", "add", probe)
    except FileNotFoundError:
        raise HostsUnavailable("iproute2's `ip` command is not installed") from None
    except OSError as exc:
        raise HostsUnavailable(f"cannot create a network namespace: {exc}") from None
    ip("netns", "del", probe, check=False)


@dataclass
class Host:
    name: str
    address: str
    device: str
    netns: str | None  # None: the root namespace (where the test's clients run)


@dataclass
class Network:
    """Hosts on one private /24, joined by the fault-injecting switch."""

    hosts: dict[str, Host] = field(default_factory=dict)
    switch: subprocess.Popen[str] | None = None
    subnet: str = ""
    # Every broker process started on a host of this network (close() reaps them).
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def create(cls, names: Sequence[str]) -> Network:
        """A network with a host per name plus ``client`` (the root namespace)."""
        check_available()
        remove_leftovers()
        net = cls()
        try:
            net._build(list(names))
        except BaseException:
            net.close()
            raise
        return net

    def _build(self, names: list[str]) -> None:
        tag = f"{PREFIX}{os.getpid()}"
        # A /24 no route of the root namespace covers yet.
        routes = ip("route", "show")
        for _ in range(50):
            subnet = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
            if f"{subnet}." not in routes:
                break
        self.subnet = subnet
        # Device names are at most 15 bytes: a short random stem, unique among live links.
        stem = f"th{random.randrange(16**5):05x}x"
        self.switch = subprocess.Popen(
            [sys.executable, "-m", "tests.hosts.switch", stem, str(len(names) + 1)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.switch.stdout is not None
        hello = json.loads(self.switch.stdout.readline() or "{}")
        if "devices" not in hello:
            raise OSError(f"the switch did not start (exit {self.switch.poll()})")
        devices: list[str] = hello["devices"]
        self.hosts["client"] = Host("client", f"{subnet}.1", devices[0], None)
        for i, name in enumerate(names):
            self.hosts[name] = Host(name, f"{subnet}.{i + 2}", devices[i + 1], f"{tag}-{name}")
        for host in self.hosts.values():
            if host.netns is not None:
                ip("netns", "add", host.netns)
                ip("link", "set", host.device, "netns", host.netns)
                ip("link", "set", "lo", "up", netns=host.netns)
            ip("addr", "add", f"{host.address}/32", "dev", host.device, netns=host.netns)
            ip("link", "set", host.device, "up", netns=host.netns)
            ip("route", "add", f"{subnet}.0/24", "dev", host.device, netns=host.netns)
        self.control(
            {"op": "hosts", "hosts": {h.address: i for i, h in enumerate(self.hosts.values())}}
        )

    def control(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.switch is not None
        assert self.switch.stdin
        assert self.switch.stdout
        self.switch.stdin.write(json.dumps(cmd) + "\n")
        self.switch.stdin.flush()
        answer: dict[str, Any] = json.loads(self.switch.stdout.readline() or "{}")
        if not answer.get("ok"):
            raise OSError(f"switch refused {cmd}: {answer}")
        return answer

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def cut(self, group_a: Iterable[str], group_b: Iterable[str]) -> None:
        """Partition: drop every packet between any host of ``group_a`` and of ``group_b``."""
        b = list(group_b)
        pairs = [[self.address(x), self.address(y)] for x in group_a for y in b]
        self.control({"op": "cut", "pairs": pairs})

    def impair_all(self, loss: float = 0.0, delay: float = 0.0, jitter: float = 0.0) -> None:
        """Loss, delay and jitter on every packet between any two hosts."""
        self.control(
            {"op": "impair", "pairs": None, "loss": loss, "delay": delay, "jitter": jitter}
        )

    def heal(self) -> None:
        self.control({"op": "heal"})

    def stats(self) -> dict[str, Any]:
        return self.control({"op": "stats"})

    def namespaces(self) -> list[str]:
        return [h.netns for h in self.hosts.values() if h.netns is not None]

    def close(self) -> None:
        """Kill whatever still runs in our namespaces, stop the switch, delete namespaces."""
        for netns in self.namespaces():
            for pid in ip("netns", "pids", netns, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for proc in self.processes:
            stop_process(proc, timeout=5.0)
        if self.switch is not None:
            if self.switch.stdin is not None:
                with contextlib.suppress(OSError):
                    self.switch.stdin.close()
            stop_process(self.switch, timeout=5.0)
            if self.switch.stdout is not None:
                self.switch.stdout.close()
        for netns in self.namespaces():
            ip("netns", "del", netns, check=False)


def spawn_broker(
    network: Network,
    netns: str,
    workdir: Path,
    broker_id: str,
    host: str,
    settings: dict[str, Any],
) -> subprocess.Popen[bytes]:
    """Start ``trellis broker`` inside ``netns`` (``ip netns exec`` execs it: same pid)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{broker_id}.ready").unlink(missing_ok=True)
    config = write_config(
        workdir / f"{broker_id}.toml",
        {
            "id": broker_id,
            "host": host,
            "port": BROKER_PORT,
            "ready_file": str(workdir / f"{broker_id}.ready"),
            **settings,
        },
    )
    with (workdir / f"{broker_id}.log").open("ab") as out:
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                netns,
                sys.executable,
                "-m",
                "broker",
                "broker",
                "--config",
                str(config),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    network.processes.append(proc)
    return proc


def wait_ready(
    proc: subprocess.Popen[bytes], workdir: Path, broker_id: str, host: str, timeout: float = 60.0
) -> BrokerProcess:
    """The launcher's wait for a broker's ready file; a broker that fails is stopped."""
    try:
        return launcher.wait_ready(
            proc, workdir, broker_id, host, workdir / f"{broker_id}.ready", timeout
        )
    except BaseException:
        stop_process(proc, timeout=5.0)
        raise


@dataclass
class HostOverlay(LocalOverlay):
    """A :class:`LocalOverlay` whose every broker is a host of ``network``."""

    network: Network = field(default_factory=Network)

    def endpoint(self, broker_id: str) -> str:
        return f"{self.network.address(broker_id)}:{BROKER_PORT}"

    def start(self, broker_id: str) -> BrokerProcess:
        """Start (or restart, at the same address) one broker."""
        self.start_many([broker_id])
        return self.brokers[broker_id]

    def start_many(self, broker_ids: Sequence[str]) -> None:
        """Start several brokers at once (in parallel: each takes a second to import)."""
        host = self.network.hosts
        spawned = {
            b: spawn_broker(
                self.network,
                str(host[b].netns),
                self.workdir,
                b,
                host[b].address,
                self.config_for(b),
            )
            for b in broker_ids
        }
        try:
            for b, proc in spawned.items():
                self.brokers[b] = wait_ready(proc, self.workdir, b, host[b].address)
        except BaseException:
            for proc in spawned.values():
                stop_process(proc, timeout=5.0)
            raise

    def kill(self, broker_id: str) -> None:
        """``kill -9`` one broker."""
        self.brokers[broker_id].kill()

    def save(self) -> None:  # no overlay.json: `trellis down` is not how these stop
        pass


def start_host_overlay(
    workdir: Path,
    network: Network,
    tree: Tree,
    replicas: dict[str, int],
    settings: dict[str, Any] | None = None,
) -> HostOverlay:
    """Every replica of every VN of ``tree`` as a broker on its own host of ``network``."""
    overlay = HostOverlay(
        workdir.resolve(),
        tree,
        settings=dict(settings or {}),
        replicas=dict(replicas),
        network=network,
    )
    overlay.workdir.mkdir(parents=True, exist_ok=True)
    missing = [b for b in overlay.broker_ids if b not in network.hosts]
    if missing:
        raise OverlayError(f"no host for {', '.join(missing)}")
    overlay.ports = dict.fromkeys(overlay.broker_ids, BROKER_PORT)
    overlay.write_keys()
    try:
        overlay.start_many(overlay.broker_ids)
        overlay.wait_linked(timeout=60.0)
    except BaseException:
        overlay.stop(timeout=5.0)
        raise
    return overlay
