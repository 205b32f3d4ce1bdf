"""Live replica attach and detach at one broker (SPEC §4): adopt a new manifest version.

The manifest stays the trust anchor: membership changes come only from the operator, who
writes the new version to the broker's ``manifest`` file and then asks the broker, on a
control connection opened under the broker's own id (as ``trellis rebuild`` does), to
adopt it (``RECONF membership``, with the endpoints of replicas that join). Peers can never
change who belongs to a VN.

Adopting happens in one event-loop step, between two frames, so the switch is atomic for
this forwarder: every split toward a VN after it uses the new ``(k', r')`` and the new
members, none before it does (``splits_by_scheme`` in ``/healthz`` counts splits per VN and
``r``). For each neighbouring VN whose membership changed the broker

* sends nothing more to a replica that left (what is queued to it still goes out) and keeps
  reading from it until it closes the link itself, after flushing what it routed;
* accepts or dials a replica that joins; the new replica learns routing state from the
  existing majority rule (an entry counts once a majority of a neighbouring VN's replicas
  sent it) and is sent this broker's state for its VN when its link comes up;
* counts copies from that VN against ``f' + 1`` from now on.

When the broker's *own* VN changes (it serves clients there: an edge VN), the broker tells
each of its clients with ``NOTICE membership`` (the version, the VN's members in slot order
with the endpoints clients dial them at, and the manifest), and repeats it in the WELCOME of
clients that connect later. A client follows a version once ``f + 1`` replicas of its VN sent
it identical (one of them is honest), and answers with ``NOTICE membership`` naming the
version; the operator waits for those answers before it stops a replica that leaves.

Key shares already being verified are checked against the new version too: it keeps the
replica counts earlier versions allowed, so shares split before the switch still verify.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from broker.daemon.config import BrokerConfig, NeighbourConfig
from broker.daemon.forwarding import Forwarder
from broker.daemon.hops import VNHop
from broker.daemon.shares import SecureForwarding
from overlay.manifest import Manifest
from overlay.tree import TopologyError
from security.errors import InvalidRequest

log = logging.getLogger("trellis.overlay")

OP = "membership"
"""The control request that makes a broker adopt its manifest file's new version."""


class Broker(Protocol):
    """What adopting a membership change needs of the daemon's broker
    (:class:`broker.daemon.dispatch.Broker`, which imports this module)."""

    config: BrokerConfig
    vn: str
    shares: SecureForwarding
    forwarder: Forwarder
    vnhops: dict[str, VNHop]
    neighbours: dict[str, NeighbourConfig]
    directory: dict[str, NeighbourConfig]

    @property
    def links(self) -> Mapping[str, object]: ...

    def start_dialer(self, neighbour: NeighbourConfig) -> None: ...

    def stop_dialer(self, peer_id: str) -> None: ...


def _endpoint_map(data: Mapping[str, Any], field: str) -> dict[str, str]:
    value = data.get(field, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequest(f"RECONF membership field {field!r} must map broker ids to HOST:PORT")
    return value


def parse_endpoints(data: Mapping[str, Any]) -> tuple[int, dict[str, str]]:
    """The (version, joining broker id -> HOST:PORT) a membership request names."""
    version = data.get("version")
    if type(version) is not int or version < 0:
        raise InvalidRequest("RECONF membership field 'version' must be a non-negative integer")
    return version, _endpoint_map(data, "endpoints")


def client_notice(manifest: Manifest, vn: str, clients: Mapping[str, str]) -> dict[str, Any]:
    """What a client of ``vn`` is told of a membership version: the members in slot order,
    each with the endpoint clients dial it at ("" when the operator did not say), and the
    manifest itself (a client without the file still verifies the new replicas' shares)."""
    return {
        "version": manifest.version,
        "vn": vn,
        "members": [[m, clients.get(m, "")] for m in manifest.members[vn]],
        "manifest": manifest.to_dict(),
    }


def adopt(broker: Broker, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """Adopt the manifest version the operator wrote to this broker's manifest file.

    Returns the ``NOTICE membership`` for this broker's clients when its own VN's members
    changed (None otherwise). A version not newer than the one in force is a no-op (a
    repeated request).
    """
    version, endpoints = parse_endpoints(data)
    clients = _endpoint_map(data, "clients")
    path = broker.config.manifest
    shares = broker.shares
    if path is None or shares.manifest is None:
        raise InvalidRequest("this broker has no manifest: membership is fixed")
    try:
        manifest = Manifest.load(path)
    except (OSError, ValueError, TopologyError) as exc:
        raise InvalidRequest(f"cannot read the manifest {str(path)!r}: {exc}") from None
    if manifest.version != version:
        raise InvalidRequest(
            f"the manifest file is at version {manifest.version}, the request names {version}"
        )
    if version <= shares.manifest.version:
        return None
    if manifest.owner(broker.config.id) != broker.vn:
        raise InvalidRequest(f"version {version} does not keep {broker.config.id} in {broker.vn}")
    switched: dict[str, list[int]] = {}
    for vn, hop in broker.vnhops.items():
        if vn not in manifest.members:
            continue
        members = manifest.members[vn]
        if members != shares.manifest.members.get(vn):
            switched[vn] = [hop.size, len(members)]
            _switch(broker, vn, members, endpoints)
    own = manifest.members.get(broker.vn) != shares.manifest.members.get(broker.vn)
    shares.adopt_manifest(manifest)
    log.info(
        "adopted manifest version %d; switched %s%s",
        version,
        switched or "nothing",
        f"; own VN {broker.vn} now {manifest.members[broker.vn]}" if own else "",
    )
    return client_notice(manifest, broker.vn, clients) if own else None


def _switch(
    broker: Broker, vn: str, members: tuple[str, ...], endpoints: Mapping[str, str]
) -> None:
    """Point this broker's hop for neighbouring VN ``vn`` at ``members`` (in replica order)."""
    hop = broker.vnhops[vn]
    size = len(members)
    for index, member in enumerate(members):
        known = broker.neighbours.get(member) or broker.directory.get(member)
        endpoint = endpoints.get(member) or (known.endpoint if known is not None else None)
        if endpoint is None:
            raise InvalidRequest(f"no endpoint for {member}, which joins {vn}")
        entry = NeighbourConfig(id=member, endpoint=endpoint, vn=vn, replica=index, vn_size=size)
        broker.directory[member] = broker.neighbours[member] = entry
        if member not in broker.links:
            broker.start_dialer(entry)
    for member in [m for m, n in broker.neighbours.items() if n.vn_id == vn]:
        if member not in members:
            # Leaving: nothing more is sent to it; its link stays until it closes it, so
            # what it still routes arrives.
            broker.stop_dialer(member)
            del broker.neighbours[member]
            hop.members.pop(member, None)
    hop.resize(members)
    broker.forwarder.resize(vn, size)
