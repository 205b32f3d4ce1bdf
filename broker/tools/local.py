"""A local overlay of broker processes on loopback: `trellis up`, `down`, `topology`.

Ports are reserved up front (bind to port 0, note the port, release) so every broker's
config can name its neighbours' endpoints before any of them starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from broker.errors import TrellisError
from broker.tools.launcher import BrokerProcess, start_broker
from overlay.manifest import Manifest
from overlay.tree import Link, TopologyError, Tree, link
from security.envelope import generate_signing_key, private_key_to_bytes, public_key_to_bytes

OVERLAY_FILE = "overlay.json"
TLS_DIR = "tls"
TLS_CLIENT = "client"
"""With ``--tls``: the name of the client certificate issued beside the brokers'."""
LOCK_FILE = ".trellis-up.lock"


class ClientTLS(TypedDict, total=False):
    """The ``Client`` keyword arguments for TLS."""

    ca: Path
    cert: Path
    key: Path


# Called after each broker of an overlay is up: (broker id, how many are up, how many in all).
Progress = Callable[[str, int, int], None]


class OverlayError(TrellisError):
    """A local overlay could not be started, found or stopped."""

    code = "overlay"


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out as a connection's source port."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int]:
    """Where :func:`free_ports` draws from: ``TRELLIS_PORT_RANGE`` or the 12,000 ports just
    below the ephemeral range.

    Raises:
        OverlayError: ``TRELLIS_PORT_RANGE`` is not ``LOW-HIGH`` with 1024 ≤ LOW < HIGH ≤ 65536.
    """
    wanted = os.environ.get("TRELLIS_PORT_RANGE", "").strip()
    if not wanted:
        floor = _ephemeral_floor()
        return max(1024, floor - 12000), floor
    match = re.fullmatch(r"(\d+)-(\d+)", wanted)
    if not match or not 1024 <= int(match[1]) < int(match[2]) <= 65536:
        raise OverlayError(
            f"TRELLIS_PORT_RANGE={wanted!r}: expected LOW-HIGH with 1024 <= LOW < HIGH <= 65536"
        )
    return int(match[1]), int(match[2])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago.

    They are drawn below the kernel's ephemeral range: a port reserved there could be taken
    as the source port of some outgoing connection (a broker dialling its neighbours)
    before its own broker binds it. ``TRELLIS_PORT_RANGE=LOW-HIGH`` (HIGH excluded) narrows
    the draw, so that several launchers on one machine (parallel test workers, two operators'
    overlays) never reserve the same port between its release and their broker's bind.
    """
    low, floor = port_range()
    rng = random.Random()
    sockets: list[socket.socket] = []
    try:
        for _ in range(50 * count):
            if len(sockets) == count:
                break
            sock = socket.socket()
            try:
                sock.bind((host, rng.randrange(low, floor) if floor - low > count else 0))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        while len(sockets) < count:  # a crowded range: fall back to any free port
            sock = socket.socket()
            sock.bind((host, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def own_link_tls(info: Mapping[str, Any], broker_id: str) -> dict[str, Any]:
    """``open_connection`` arguments for a control connection under a broker's own id: on
    a TLS overlay the broker admits that id only with its own certificate, which a local
    overlay keeps beside the client's in its CA directory."""
    tls = info.get("tls")
    if not tls:
        return {}
    from security.tls import link_context

    ca = Path(tls["ca"])
    cert, key = ca.parent / f"{broker_id}.crt", ca.parent / f"{broker_id}.key"
    return {"ssl": link_context(ca, cert, key)}


def fetch_json(url: str, timeout: float = 2.0) -> Any:
    """GET a JSON document (admin endpoints are local, so a short timeout suffices)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def metric_by_label(metrics: str, name: str, label: str) -> dict[str, int]:
    """The samples of one labelled Prometheus metric, by the value of ``label``."""
    pattern = rf'{name}\{{broker="[^"]+",{label}="([^"]+)"\}} (\S+)'
    return {m.group(1): int(float(m.group(2))) for m in re.finditer(pattern, metrics)}


def vn_links(health: Mapping[str, Mapping[str, Any]], vn_of: Mapping[str, str]) -> set[Link]:
    """The links between VNs that brokers' ``/healthz`` reports (by broker id) show."""
    return {
        link(vn_of[broker], vn_of[peer])
        for broker, state in health.items()
        for peer in state.get("links", [])
        if broker in vn_of and peer in vn_of and vn_of[peer] != vn_of[broker]
    }


def fetch_text(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode()


def replica_ids(vn: str, replicas: int) -> list[str]:
    """Broker ids of a VN's replicas: the VN's own id when it has a single replica."""
    return [vn] if replicas == 1 else [f"{vn}.{i}" for i in range(replicas)]


@dataclass
class LocalOverlay:
    """Broker processes started from a tree of virtual nodes, and where they listen.

    Each tree node is a VN of ``replicas[vn]`` brokers (default 1); every replica links to
    every replica of each neighbouring VN.
    """

    workdir: Path
    tree: Tree
    brokers: dict[str, BrokerProcess] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)
    # Per-broker settings on top of ``settings`` (e.g. fault injection).
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Neighbours a broker accepts beyond its tree links (tests of refused links use this).
    extra_neighbours: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    # Brokers spawned but not yet ready (id -> pid), so that overlay.json names every
    # process of the overlay at every moment.
    starting: dict[str, int] = field(default_factory=dict)
    # Brokers speak TLS only, with certificates from a CA in ``workdir/tls``.
    tls: bool = False

    def replicas_of(self, vn: str) -> list[str]:
        return replica_ids(vn, self.replicas.get(vn, 1))

    @property
    def broker_ids(self) -> list[str]:
        return [b for vn in sorted(self.tree.brokers) for b in self.replicas_of(vn)]

    def vn_of(self, broker_id: str) -> str:
        for vn in self.tree.brokers:
            if broker_id in self.replicas_of(vn):
                return vn
        raise OverlayError(f"no broker '{broker_id}' in this overlay")

    def endpoint(self, broker_id: str) -> str:
        return f"127.0.0.1:{self.ports[broker_id]}"

    def endpoints(self, vn: str) -> list[str]:
        """Every replica of a VN, as a client of that VN connects to them."""
        return [self.endpoint(b) for b in self.replicas_of(vn)]

    def expected_links(self, broker_id: str) -> set[str]:
        vn = self.vn_of(broker_id)
        return {b for n in self.tree.neighbours(vn) for b in self.replicas_of(n)}

    def peer_entry(self, broker_id: str) -> dict[str, Any]:
        """How other brokers' configs name ``broker_id`` (as a neighbour or a peer)."""
        vn = self.vn_of(broker_id)
        members = self.replicas_of(vn)
        return {
            "id": broker_id,
            "endpoint": self.endpoint(broker_id),
            "vn": vn,
            "replica": members.index(broker_id),
            "vn_size": len(members),
        }

    def config_for(self, broker_id: str) -> dict[str, Any]:
        vn = self.vn_of(broker_id)
        neighbours = [
            self.peer_entry(b)
            for n in sorted(self.tree.neighbours(vn))
            for b in self.replicas_of(n)
        ]
        linked = {n["id"] for n in neighbours}
        # Every other broker is a peer: reconfiguration may link this one to any of them.
        peers = [self.peer_entry(b) for b in self.broker_ids if b != broker_id and b not in linked]
        neighbours += self.extra_neighbours.get(broker_id, [])
        mine = self.replicas_of(vn)
        extra = self.overrides.get(broker_id, {})
        if extra.get("byzantine") == "collude":
            extra = {**extra, "collude_log": str(self.workdir / f"{broker_id}.collude.jsonl")}
        return {
            "admin_port": 0,
            **self.settings,
            **self.tls_settings(broker_id),
            **extra,
            "manifest": str(self.manifest_path),
            "key_file": str(self.workdir / f"{broker_id}.key"),
            "links_file": str(self.workdir / f"{broker_id}.links.json"),
            "vn": vn,
            "replica": mine.index(broker_id),
            "vn_size": len(mine),
            "neighbours": neighbours,
            "peers": peers,
        }

    @property
    def tls_dir(self) -> Path:
        return self.workdir / TLS_DIR

    def tls_settings(self, broker_id: str) -> dict[str, str]:
        """A broker's ``tls_*`` settings (none without TLS)."""
        if not self.tls:
            return {}
        return {
            "tls_ca": str(self.tls_dir / "ca.crt"),
            "tls_cert": str(self.tls_dir / f"{broker_id}.crt"),
            "tls_key": str(self.tls_dir / f"{broker_id}.key"),
        }

    def client_tls(self) -> ClientTLS:
        """The SDK's TLS arguments for a client of this overlay (none without TLS)."""
        if not self.tls:
            return {}
        return {
            "ca": self.tls_dir / "ca.crt",
            "cert": self.tls_dir / f"{TLS_CLIENT}.crt",
            "key": self.tls_dir / f"{TLS_CLIENT}.key",
        }

    def write_certificates(self) -> None:
        """A CA in ``workdir/tls``, a certificate for each broker's own Ed25519 key (its
        manifest identity) and one client certificate."""
        from security.ca import create_ca, issue, load_private_key, save_ca, write_issued

        ca = create_ca(f"Trellis local overlay CA ({self.workdir.name})")
        save_ca(ca, self.tls_dir, force=True)
        for broker_id in self.broker_ids:
            key = load_private_key(self.workdir / f"{broker_id}.key")
            write_issued(issue(ca, broker_id, "broker", key=key), ca, self.tls_dir, broker_id)
        write_issued(issue(ca, TLS_CLIENT, "client"), ca, self.tls_dir, TLS_CLIENT)

    @property
    def manifest_path(self) -> Path:
        return self.workdir / "manifest.json"

    @property
    def manifest(self) -> Manifest:
        return Manifest.load(self.manifest_path)

    def write_keys(self) -> None:
        """A fresh Ed25519 key per broker and the manifest listing their public halves."""
        keys = {}
        for broker_id in self.broker_ids:
            key = generate_signing_key()
            path = self.workdir / f"{broker_id}.key"
            path.write_text(private_key_to_bytes(key).hex() + "\n", encoding="utf-8")
            path.chmod(0o600)
            keys[broker_id] = public_key_to_bytes(key.public_key())
        members = {vn: tuple(self.replicas_of(vn)) for vn in self.tree.brokers}
        Manifest(self.tree, members, keys).save(self.manifest_path)

    def start(self, broker_id: str) -> BrokerProcess:
        """Start (or restart, on the same port) one broker of the overlay."""

        def spawned(process: subprocess.Popen[bytes]) -> None:
            self.starting[broker_id] = process.pid
            self.save()

        try:
            proc = start_broker(
                self.workdir,
                broker_id,
                port=self.ports[broker_id],
                settings=self.config_for(broker_id),
                inherit_config=False,
                on_spawn=spawned,
            )
        finally:
            self.starting.pop(broker_id, None)
        self.brokers[broker_id] = proc
        self.save()
        return proc

    def linked(self) -> bool:
        """Whether every broker reports exactly its tree neighbours as live links."""
        for broker_id, proc in self.brokers.items():
            if not proc.alive():
                return False
            try:
                health = fetch_json(proc.admin_url + "/healthz")
            except OSError:
                return False
            if set(health["links"]) != self.expected_links(broker_id):
                return False
        return True

    def wait_linked(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.linked():
            if time.monotonic() > deadline:
                raise OverlayError(f"overlay links not all up within {timeout:g} s")
            time.sleep(0.05)

    def wait_quiet(self, timeout: float = 20.0, settle: float = 0.3) -> dict[str, Any]:
        """Wait until routing state stops changing everywhere (no control traffic for
        ``settle`` seconds); returns the final health of every broker."""
        deadline = time.monotonic() + timeout
        last = self.health()
        while time.monotonic() < deadline:
            time.sleep(settle)
            now = self.health()
            if now == last:
                return now
            last = now
        raise OverlayError(f"routing state still changing after {timeout:g} s")

    def live_tree(self, timeout: float = 5.0) -> Tree:
        """The VN tree as the brokers' live links say it is now (reconfiguration moves
        links, so this may differ from :attr:`tree`, the tree the overlay started as).

        While a round has a new link up in standby, the links form a cycle for a moment:
        this asks again until they form a tree or ``timeout`` passes; so it does when a
        broker's admin endpoint does not answer in time (a lossy network between here and
        there: one lost SYN costs a second).
        """
        deadline = time.monotonic() + timeout
        vn_of = {b: self.vn_of(b) for b in self.broker_ids}
        while True:
            try:
                return Tree(self.tree.brokers, vn_links(self.health(), vn_of))
            except (TopologyError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def health(self) -> dict[str, Any]:
        """``/healthz`` of every running broker of the overlay."""
        return {
            b: fetch_json(p.admin_url + "/healthz") for b, p in self.brokers.items() if p.alive()
        }

    def metrics(self, broker_id: str) -> str:
        return fetch_text(self.brokers[broker_id].admin_url + "/metrics")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every broker at once, then wait for each (SIGKILL past ``timeout``)."""
        for proc in self.brokers.values():
            if proc.alive():
                proc.process.send_signal(signal.SIGTERM)
        for proc in self.brokers.values():
            proc.stop(timeout, signalled=True)

    def describe(self) -> dict[str, Any]:
        return {
            "brokers": [
                {
                    "id": b,
                    "endpoint": self.endpoint(b),
                    "admin": p.admin_url,
                    "pid": p.pid,
                }
                for b, p in sorted(self.brokers.items())
            ],
            "starting": [{"id": b, "pid": pid} for b, pid in sorted(self.starting.items())],
            "links": [sorted(link) for link in sorted(self.tree.links)],
            "vns": {vn: self.replicas_of(vn) for vn in sorted(self.tree.brokers)},
            "reconfig": bool(self.settings.get("reconfig", {}).get("enabled", False)),
            **({"tls": {k: str(v) for k, v in self.client_tls().items()}} if self.tls else {}),
        }

    def save(self) -> None:
        path = self.workdir / OVERLAY_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2) + "\n")
        tmp.replace(path)


def start_overlay(
    workdir: Path,
    tree: Tree,
    settings: dict[str, Any] | None = None,
    *,
    wait: bool = True,
    replicas: dict[str, int] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    progress: Progress | None = None,
    tls: bool = False,
) -> LocalOverlay:
    """Start the broker processes of every VN of ``tree``, linked as the tree says.

    Refuses a directory whose overlay is running (or being started). If the start fails or
    is interrupted (KeyboardInterrupt, or SIGTERM made one by the caller), every broker it
    spawned is stopped before the exception goes on. With ``tls``, the brokers speak TLS
    only, with certificates from a CA created in ``workdir/tls`` (see
    :meth:`LocalOverlay.client_tls`).
    """
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    with _start_lock(workdir):
        running = running_brokers(workdir)
        if running:
            raise OverlayError(
                f"an overlay is already running in {workdir} ({len(running)} brokers); "
                f"stop it first with: trellis down --dir {workdir}"
            )
        overlay = LocalOverlay(
            workdir,
            tree,
            settings=dict(settings or {}),
            replicas=dict(replicas or {}),
            overrides=dict(overrides or {}),
            tls=tls,
        )
        names = overlay.broker_ids
        unknown = sorted(set(overlay.overrides) - set(names))
        if unknown:
            raise OverlayError(
                f"no broker {', '.join(unknown)} in this overlay; its brokers are "
                f"{', '.join(names)}"
            )
        overlay.ports = dict(zip(names, free_ports(len(names)), strict=True))
        overlay.write_keys()
        if tls:
            overlay.write_certificates()
        for name in names:  # a new overlay starts as its tree says, not as an earlier one ended
            (workdir / f"{name}.links.json").unlink(missing_ok=True)
        overlay.save()
        try:
            for name in names:
                overlay.start(name)
                if progress is not None:
                    progress(name, len(overlay.brokers), len(names))
            if wait:
                overlay.wait_linked()
        except BaseException:
            with signals_deferred():
                overlay.stop(timeout=5.0)
                overlay.save()
            raise
    return overlay


@contextlib.contextmanager
def _start_lock(workdir: Path) -> Iterator[None]:
    """Held while an overlay starts in ``workdir``: a second ``trellis up`` there is refused."""
    with (workdir / LOCK_FILE).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OverlayError(
                f"another trellis up is starting an overlay in {workdir}; wait for it, or stop "
                f"it with: trellis down --dir {workdir}"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Clean-up that a second Ctrl-C or SIGTERM must not cut short (it is bounded: SIGTERM,
    then SIGKILL). Only the main thread can change signal handlers; elsewhere, no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def read_overlay(workdir: Path) -> dict[str, Any]:
    """The ``overlay.json`` that ``trellis up`` wrote in ``workdir``."""
    path = workdir / OVERLAY_FILE
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise OverlayError(
            f"no overlay in {workdir} (missing {OVERLAY_FILE}); start one with: "
            f"trellis up --dir {workdir}"
        ) from None
    except ValueError as exc:
        raise OverlayError(f"{path} is not an overlay description: {exc}") from None
    if not isinstance(info, dict):
        raise OverlayError(f"{path} is not an overlay description (not a JSON object)")
    return info


def vn_client_access(workdir: Path, vn: str) -> tuple[list[str], dict[str, str]]:
    """What a client of VN ``vn`` of the local overlay in ``workdir`` needs: its replicas'
    endpoints and, on an overlay started with ``--tls``, the client certificate
    (``ca``/``cert``/``key``, as ``overlay.json`` names them).

    Raises:
        OverlayError: no overlay in ``workdir``, or it has no VN ``vn`` (the message lists
            the ones it has).
    """
    info = read_overlay(workdir)
    vns = {str(name): [str(b) for b in members] for name, members in info.get("vns", {}).items()}
    if vn not in vns:
        raise OverlayError(
            f"the overlay in {workdir} has no VN {vn!r}; its VNs: {', '.join(sorted(vns))}"
        )
    endpoints = {str(b["id"]): str(b["endpoint"]) for b in info.get("brokers", [])}
    missing = [b for b in vns[vn] if b not in endpoints]
    if missing:
        raise OverlayError(f"the overlay in {workdir} is not running {', '.join(missing)}")
    tls = {str(k): str(v) for k, v in (info.get("tls") or {}).items()}
    return [endpoints[b] for b in vns[vn]], tls


def _processes(info: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Every (broker id, pid) an overlay.json names: running brokers and ones starting."""
    entries = [*info.get("brokers", []), *info.get("starting", [])]
    return [(str(e["id"]), int(e["pid"])) for e in entries]


def is_broker_process(pid: int, broker_id: str) -> bool:
    """Whether ``pid`` is alive and runs ``trellis broker`` with ``broker_id``'s config (a
    pid in an old overlay.json may since belong to an unrelated process)."""
    if not Path("/proc/self/cmdline").exists():  # no /proc: trust a live pid of ours
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    args = raw.decode(errors="replace").split("\0")
    config = f"{broker_id}.toml"
    return "broker" in args and any(a == config or a.endswith("/" + config) for a in args)


def running_brokers(workdir: Path) -> list[str]:
    """Ids of the brokers of ``workdir``'s overlay that are running now (none if no overlay)."""
    try:
        info = read_overlay(workdir)
    except OverlayError:
        return []
    return [b for b, pid in _processes(info) if is_broker_process(pid, b)]


def stop_overlay(workdir: Path, timeout: float = 10.0) -> list[str]:
    """SIGTERM every broker listed in ``workdir``; returns the ids that were running."""
    info = read_overlay(workdir)
    running = [(b, pid) for b, pid in _processes(info) if is_broker_process(pid, b)]
    stopped = []
    for broker_id, pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            stopped.append(broker_id)
    deadline = time.monotonic() + timeout
    for broker_id, pid in running:
        while time.monotonic() < deadline:
            if not is_broker_process(pid, broker_id):
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return stopped
