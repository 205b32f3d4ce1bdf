"""Live replica attach and detach in a local overlay (``trellis placement apply``, SPEC §4).

The operator side of :mod:`broker.daemon.membership`. Each change is two manifest versions,
written to ``DIR/manifest.json`` (the brokers' and subscribers' trust anchor) and adopted by
every running broker over a control connection under its own id:

1. *prepare*: the VN may also be split toward with the new replica count (and a joining
   replica's slot and key are known), membership unchanged. Once every broker adopted it,
   every verifier accepts shares split either way.
2. *switch*: the VN's members become the first ``r'`` slots. A forwarder toward the VN
   switches its threshold scheme when it adopts this version, between two publications.

Attach starts the new broker between the two (it learns routing state from its neighbours'
majorities once they link to it) and waits for its links; detach waits for every broker to
acknowledge the switch (no one sends to the leaving replica any more), then stops it with
SIGTERM, so it routes what it already received and flushes its links before it exits.
A detach gives back the VN's last slot, so the remaining replicas keep their indices.

A VN that serves clients (an edge VN) is resized the same way: the switch names the
endpoints clients dial its members at, its replicas tell their clients, and each client
follows once ``f + 1`` replicas told it the same (it connects to a replica that joined, leaves
one that left, counts ``f' + 1`` copies, splits keys for ``r'``). Both steps wait until every
client of the VN said it follows the new version (``clients_switching`` in ``/healthz``), so a
leaving replica is stopped only once no client publishes through it.

:class:`Replicas` holds those steps; where brokers run and how one starts and stops is the
deployment's: :class:`LocalReplicas` (broker processes of ``trellis up``) here,
:class:`broker.tools.placement_compose.ComposeReplicas` (containers of the compose
deployment) beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import tomllib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from broker.daemon.membership import OP
from broker.daemon.reconfig_agent import ControlChannel
from broker.tools.launcher import BrokerProcess, run_async, start_broker, write_config
from broker.tools.local import (
    OVERLAY_FILE,
    OverlayError,
    fetch_json,
    free_ports,
    is_broker_process,
    own_link_tls,
    read_overlay,
)
from overlay.manifest import Manifest
from security.envelope import generate_signing_key, private_key_to_bytes, public_key_to_bytes

CONTROL_TIMEOUT = 10.0
LINK_TIMEOUT = 20.0
CLIENTS_TIMEOUT = 10.0


@dataclass(frozen=True)
class MembershipStep:
    """``RECONF membership``: adopt the manifest file's ``version``."""

    version: int
    endpoints: dict[str, str]
    clients: dict[str, str]
    op: str = OP

    def to_data(self) -> dict[str, Any]:
        return {"version": self.version, "endpoints": self.endpoints, "clients": self.clients}


@dataclass(frozen=True)
class Change:
    """One replica attached or detached, and how long it took (seconds)."""

    action: str
    vn: str
    broker: str
    seconds: float
    version: int
    clients_behind: int = 0
    """Client connections of the VN that had not followed the change by the deadline."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "vn": self.vn,
            "broker": self.broker,
            "seconds": round(self.seconds, 3),
            "version": self.version,
            "clients_behind": self.clients_behind,
        }


@dataclass(frozen=True)
class BrokerAccess:
    """How the operator reaches one running broker: its client/broker port (for the
    control connection, with ``tls``: the ``open_connection`` arguments under its own id) and
    its admin base URL."""

    endpoint: str
    admin: str
    tls: dict[str, Any]


class Replicas(ABC):
    """The manifest steps of attach and detach, whatever runs the brokers.

    A deployment says where its manifest file is (``manifest_path``), which brokers run
    and how to reach them (:meth:`running`), and how a replica gets its identity, starts,
    stops, and how its membership is recorded (the abstract methods)."""

    manifest_path: Path

    @property
    def manifest(self) -> Manifest:
        return Manifest.load(self.manifest_path)

    @abstractmethod
    def running(self) -> dict[str, BrokerAccess]:
        """The brokers of the deployment that run now, by id."""

    @abstractmethod
    def _identity(self, broker_id: str, fresh: bool) -> bytes | None:
        """Give a joining replica its signing key (a new one when ``fresh``: its public half
        returned, for the manifest) and, on TLS, a certificate from the deployment's CA."""

    @abstractmethod
    def _start(self, broker_id: str, vn: str, index: int, settings: dict[str, Any]) -> str:
        """Start the joining replica; the endpoint the other brokers dial it at."""

    @abstractmethod
    def _stop(self, broker_id: str) -> None:
        """Stop a replica that left, gracefully (SIGTERM: it flushes its links)."""

    @abstractmethod
    def _record(self, vn: str, members: Sequence[str]) -> None:
        """Keep the deployment's own records (broker lists, config files) true to ``vn``'s
        new ``members``."""

    def _write_manifest(self, manifest: Manifest) -> None:
        manifest.save(self.manifest_path)

    def _publish(
        self, manifest: Manifest, endpoints: dict[str, str], clients: dict[str, str] | None = None
    ) -> None:
        """Write ``manifest`` and have every running broker adopt it (all acknowledge);
        ``clients``: the endpoints clients dial a resized VN's members at."""
        self._write_manifest(manifest)
        step = MembershipStep(manifest.version, endpoints, clients or {})

        async def one(me: str, broker: BrokerAccess) -> None:
            channel = ControlChannel(me, me, broker.endpoint, broker.tls)
            try:
                await channel.open(CONTROL_TIMEOUT)
                reply = await channel.call(cast(Any, step), CONTROL_TIMEOUT)
            finally:
                await channel.close()
            if not reply.ok:
                raise OverlayError(f"broker {me} refused version {step.version}: {reply.error}")

        async def everyone() -> None:
            await asyncio.gather(*(one(b, a) for b, a in self.running().items()))

        run_async(everyone())

    def attach(self, vn: str, settings: dict[str, Any] | None = None) -> Change:
        """Start one more replica of ``vn`` (in its next slot) and switch the overlay to it.

        ``settings``: extra broker settings for the new replica (e.g. fault injection)."""
        started = time.monotonic()
        manifest = self.manifest
        if vn not in manifest.members:
            raise OverlayError(f"no VN {vn!r} in this overlay")
        index = len(manifest.members[vn])
        slots = manifest.slots(vn)
        fresh = index >= len(slots)
        broker_id = slots[index] if not fresh else f"{vn}.{index}"
        public = self._identity(broker_id, fresh)
        joining = {broker_id: public} if public is not None else {}
        prepared = manifest.prepared(vn, index + 1, joining)
        self._publish(prepared, {})
        endpoint = self._start(broker_id, vn, index, settings or {})
        switched = prepared.resized(vn, index + 1)
        self._record(vn, switched.members[vn])
        self._publish(switched, {broker_id: endpoint}, self._client_endpoints(switched, vn))
        self._wait_links(broker_id)
        behind = self._wait_clients(vn, switched.members[vn])
        return Change("attach", vn, broker_id, time.monotonic() - started, switched.version, behind)

    def detach(self, vn: str) -> Change:
        """Switch the overlay away from ``vn``'s last replica, then stop it gracefully."""
        started = time.monotonic()
        manifest = self.manifest
        if vn not in manifest.members:
            raise OverlayError(f"no VN {vn!r} in this overlay")
        members = manifest.members[vn]
        if len(members) < 2:
            raise OverlayError(f"VN {vn} has one replica: it cannot lose one")
        leaving = members[-1]
        prepared = manifest.prepared(vn, len(members) - 1)
        self._publish(prepared, {})
        switched = prepared.resized(vn, len(members) - 1)
        self._publish(switched, {}, self._client_endpoints(switched, vn))
        behind = self._wait_clients(vn, members)
        self._stop(leaving)
        self._record(vn, switched.members[vn])
        return Change("detach", vn, leaving, time.monotonic() - started, switched.version, behind)

    def _client_endpoints(self, manifest: Manifest, vn: str) -> dict[str, str]:
        """Where clients dial the members of ``vn`` (the operator's own endpoints for them)."""
        running = self.running()
        return {b: running[b].endpoint for b in manifest.members[vn] if b in running}

    def _wait_clients(self, vn: str, replicas: Sequence[str]) -> int:
        """Wait until every client of ``vn``'s ``replicas`` follows the version in force;
        returns how many client connections still did not by the deadline (they are told
        again in their next WELCOME)."""
        deadline = time.monotonic() + CLIENTS_TIMEOUT
        while True:
            running = self.running()
            behind = 0
            for broker_id in replicas:
                if broker_id in running:
                    try:
                        health = fetch_json(running[broker_id].admin + "/healthz")
                    except (OSError, ValueError):
                        continue
                    behind += int(health.get("clients_switching", 0))
            if not behind or time.monotonic() > deadline:
                return behind
            time.sleep(0.02)

    def health(self) -> dict[str, dict[str, Any]]:
        """``/healthz`` of every running broker that answers, by id."""
        out = {}
        for broker_id, broker in self.running().items():
            try:
                out[broker_id] = fetch_json(broker.admin + "/healthz")
            except (OSError, ValueError):
                continue
        return out

    def _linked_vns(self, sibling: str, vn: str) -> list[str]:
        """The VNs a running replica of ``vn`` links to now (the joining one will too)."""
        manifest = self.manifest
        health = fetch_json(self.running()[sibling].admin + "/healthz")
        owners = {manifest.owner(b) for b in health["links"]}
        return sorted(v for v in owners if v is not None and v != vn)

    def _wait_links(self, broker_id: str) -> None:
        """Wait until the new replica linked to every replica of its neighbouring VNs."""
        deadline = time.monotonic() + LINK_TIMEOUT
        health: dict[str, Any] = {"missing_links": ["(no answer)"]}
        while True:
            broker = self.running().get(broker_id)
            if broker is not None:
                try:
                    health = fetch_json(broker.admin + "/healthz")
                except (OSError, ValueError):
                    pass  # still starting
                else:
                    if not health["missing_links"]:
                        return
            if time.monotonic() > deadline:
                raise OverlayError(
                    f"{broker_id} did not link to {health['missing_links']} within "
                    f"{LINK_TIMEOUT:g} s"
                )
            time.sleep(0.02)


class LocalReplicas(Replicas):
    """Attach and detach replicas of the local overlay in ``workdir`` (``trellis up``)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        self.info = read_overlay(self.workdir)
        self.manifest_path = self.workdir / "manifest.json"
        # Brokers this object started (their processes are reaped when they stop).
        self.started: dict[str, BrokerProcess] = {}

    def _brokers(self) -> dict[str, dict[str, Any]]:
        return {
            str(b["id"]): b
            for b in self.info.get("brokers", [])
            if is_broker_process(int(b["pid"]), str(b["id"]))
        }

    def running(self) -> dict[str, BrokerAccess]:
        return {
            b: BrokerAccess(str(e["endpoint"]), str(e["admin"]), own_link_tls(self.info, b))
            for b, e in self._brokers().items()
        }

    def _save(self) -> None:
        path = self.workdir / OVERLAY_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.info, indent=2) + "\n")
        tmp.replace(path)

    def _endpoints(self) -> dict[str, str]:
        return {b: e["endpoint"] for b, e in self._brokers().items()}

    def _identity(self, broker_id: str, fresh: bool) -> bytes | None:
        """A key file for a fresh slot; on a TLS overlay, a certificate from the overlay's
        CA for the replica's own key (its manifest identity), beside its siblings' (a
        rejoining slot gets a fresh one)."""
        key_path = self.workdir / f"{broker_id}.key"
        public = new_key_file(key_path) if fresh else None
        tls = self.info.get("tls")
        if tls:
            from security.ca import issue, load_ca, load_private_key, write_issued

            directory = Path(tls["ca"]).parent
            ca = load_ca(directory)
            key = load_private_key(key_path)
            write_issued(issue(ca, broker_id, "broker", key=key), ca, directory, broker_id)
        return public

    def _start(self, broker_id: str, vn: str, index: int, settings: dict[str, Any]) -> str:
        proc = start_broker(
            self.workdir,
            broker_id,
            port=free_ports(1)[0],
            settings=self._config_for(broker_id, vn, index, settings),
            inherit_config=False,
        )
        self.started[broker_id] = proc
        entry = {
            "id": broker_id,
            "endpoint": proc.endpoint,
            "admin": proc.admin_url,
            "pid": proc.pid,
        }
        self.info["brokers"] = [
            *(b for b in self.info.get("brokers", []) if b["id"] != broker_id),
            entry,
        ]
        return proc.endpoint

    def _stop(self, broker_id: str) -> None:
        broker = self._brokers().get(broker_id)
        if broker_id in self.started:
            self.started.pop(broker_id).stop()
        elif broker is not None:
            _stop_pid(int(broker["pid"]), broker_id)
        self.info["brokers"] = [b for b in self.info.get("brokers", []) if b["id"] != broker_id]

    def _record(self, vn: str, members: Sequence[str]) -> None:
        self.info.setdefault("vns", {})[vn] = list(members)
        self._save()
        self._rewrite_configs(vn, members)

    def _rewrite_configs(self, vn: str, members: Iterable[str]) -> None:
        """Keep every broker's config file true to the new membership of ``vn``, so that a
        broker restarted from it later (a crash, an operator's restart) knows the replicas
        that joined, forgets the one that left, and its own VN's size."""
        endpoints = {str(b["id"]): str(b["endpoint"]) for b in self.info.get("brokers", [])}
        current = [b for b in members if b in endpoints]
        for broker_id in endpoints:
            path = self.workdir / f"{broker_id}.toml"
            if not path.exists():
                continue
            config = tomllib.loads(path.read_text(encoding="utf-8"))
            updated = with_members(config, vn, [(b, endpoints[b]) for b in current])
            if updated != config:
                write_config(path, updated)

    def _config_for(
        self, broker_id: str, vn: str, index: int, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """A joining replica's config: a sibling's, with its own identity and the current
        replicas of the VNs its sibling links to now."""
        manifest = self.manifest
        brokers = self._brokers()
        sibling = next((b for b in manifest.members[vn] if b in brokers), None)
        if sibling is None:
            raise OverlayError(f"no replica of {vn} runs: nothing to attach to")
        base = tomllib.loads((self.workdir / f"{sibling}.toml").read_text(encoding="utf-8"))
        for key in ("id", "host", "port", "ready_file", "byzantine", "collude_log"):
            base.pop(key, None)
        endpoints = self._endpoints()
        neighbours = [
            {
                "id": b,
                "endpoint": endpoints[b],
                "vn": other,
                "replica": i,
                "vn_size": len(manifest.members[other]),
            }
            for other in self._linked_vns(sibling, vn)
            for i, b in enumerate(manifest.members[other])
            if b in endpoints
        ]
        linked = {n["id"] for n in neighbours}
        peers = [p for p in base.get("peers", []) if p["id"] not in linked and p["id"] != broker_id]
        settings = {
            **base,
            **extra,
            "key_file": str(self.workdir / f"{broker_id}.key"),
            "links_file": str(self.workdir / f"{broker_id}.links.json"),
            **self._tls_settings(broker_id, base),
            "vn": vn,
            "replica": index,
            "vn_size": index + 1,
            "neighbours": neighbours,
            "peers": peers,
        }
        if settings.get("byzantine") == "collude":
            settings["collude_log"] = str(self.workdir / f"{broker_id}.collude.jsonl")
        (self.workdir / f"{broker_id}.links.json").unlink(missing_ok=True)
        return settings

    def _tls_settings(self, broker_id: str, base: dict[str, Any]) -> dict[str, str]:
        """The sibling's ``tls_*`` settings with the joining replica's own certificate."""
        if "tls_cert" not in base:
            return {}
        directory = Path(str(base["tls_cert"])).parent
        return {
            "tls_cert": str(directory / f"{broker_id}.crt"),
            "tls_key": str(directory / f"{broker_id}.key"),
        }


def new_key_file(path: Path) -> bytes:
    """A fresh Ed25519 signing key for a joining replica, written (hex seed, owner-only) as
    a broker's ``key_file`` reads it; its public half, for the manifest."""
    key = generate_signing_key()
    path.write_text(private_key_to_bytes(key).hex() + "\n", encoding="utf-8")
    path.chmod(0o600)
    return public_key_to_bytes(key.public_key())


def with_members(
    config: Mapping[str, Any], vn: str, members: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """A broker config (as its TOML reads) with VN ``vn``'s replicas replaced by
    ``members`` ((id, endpoint) in slot order): in ``neighbours`` if the broker lists that VN
    there, in ``peers`` otherwise; its own ``vn_size`` if it is one of them."""
    out = dict(config)
    me = str(config.get("id", ""))
    entries = [
        {"id": b, "endpoint": e, "vn": vn, "replica": i, "vn_size": len(members)}
        for i, (b, e) in enumerate(members)
    ]
    if config.get("vn") == vn:
        out["vn_size"] = len(members)
        if any(b == me for b, _ in members):
            out["replica"] = next(i for i, (b, _) in enumerate(members) if b == me)
    others = [e for e in entries if e["id"] != me]
    neighbours = list(config.get("neighbours", []))
    peers = list(config.get("peers", []))
    if any(n.get("vn") == vn for n in neighbours):
        neighbours = [n for n in neighbours if n.get("vn") != vn] + others
        peers = [p for p in peers if p.get("vn") != vn]
    else:
        peers = [p for p in peers if p.get("vn") != vn] + others
    out["neighbours"], out["peers"] = neighbours, peers
    return out


def _stop_pid(pid: int, broker_id: str, timeout: float = 10.0) -> None:
    """SIGTERM a broker we did not spawn (graceful: it flushes its links), SIGKILL past
    ``timeout``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while is_broker_process(pid, broker_id):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)
