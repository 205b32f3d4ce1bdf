"""The overlay manifest: which brokers form each virtual node, the VN tree, and keys.

Verifying a key share needs to know who may sign each split along a publication's path:
the replicas of every VN on it, in replica order, with their Ed25519 public keys. Operators
distribute this manifest (a JSON file) to brokers and confidential subscribers as their
trust anchor; nothing learned over the network can change its membership or keys. Which
VNs a publication crossed is read from its shares' signed certificates, not from the tree
here (live reconfiguration moves links; see ``security.paths.claimed_path``).

Replicas attach and detach live (SPEC §4), so the manifest is versioned. A VN's replicas
are *slots* in a fixed order: its ``r`` members are the first ``r`` slots, an attach takes
the next slot and a detach gives back the last one (so a remaining replica keeps its index).
Slots beyond ``r`` (``spares``: replicas that left, or were announced before they join)
keep their keys, and ``sizes`` keeps every replica count the operator gave the VN: a split
certificate's ``r`` then names exactly which members it was made for, and shares split
before a switch still verify after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from overlay.tree import TopologyError, Tree


@dataclass(frozen=True, eq=False)
class Manifest:
    """VN tree, replica membership (in replica order) and public keys (raw 32 bytes)."""

    tree: Tree
    members: Mapping[str, tuple[str, ...]]
    keys: Mapping[str, bytes]
    version: int = 0
    # VN -> its slots after the members (replicas that left or are about to join)
    spares: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # VN -> replica counts it had before (the current one is always allowed)
    sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.members) != set(self.tree.brokers):
            raise TopologyError(
                "manifest members must list exactly the VNs of the tree", "malformed"
            )
        if not set(self.spares) <= set(self.members) or not set(self.sizes) <= set(self.members):
            raise TopologyError("spares and sizes may name only VNs of the tree", "malformed")
        seen: set[str] = set()
        for vn, ids in self.members.items():
            slots = self.slots(vn)
            missing = [b for b in slots if b not in self.keys]
            if not ids or missing:
                raise TopologyError(f"VN {vn}: no replicas or no key for {missing}", "malformed")
            if seen & set(slots) or len(set(slots)) != len(slots):
                raise TopologyError(f"VN {vn}: a broker is in two slots", "malformed")
            seen.update(slots)
            if any(type(r) is not int or not 1 <= r <= len(slots) for r in self.sizes.get(vn, ())):
                raise TopologyError(f"VN {vn}: a size is not 1..{len(slots)}", "malformed")

    def slots(self, vn: str) -> tuple[str, ...]:
        """Every replica ``vn`` has had or is about to have, in replica order."""
        return (*self.members[vn], *self.spares.get(vn, ()))

    def schemes(self, vn: str) -> frozenset[int]:
        """The replica counts a split toward ``vn`` may use: now's, and earlier ones."""
        return frozenset((*self.sizes.get(vn, ()), len(self.members[vn])))

    def prepared(self, vn: str, r: int, joining: Mapping[str, bytes] | None = None) -> Manifest:
        """The next version, members unchanged, in which splits toward ``vn`` may also use
        ``r`` replicas (and ``joining`` replicas have their slots and keys): every verifier
        must hold it before any forwarder switches (see :meth:`resized`)."""
        nxt = self.resized(vn, r, joining)
        return Manifest(
            self.tree,
            self.members,
            nxt.keys,
            nxt.version,
            {**nxt.spares, vn: nxt.slots(vn)[len(self.members[vn]) :]},
            nxt.sizes,
        )

    def resized(self, vn: str, r: int, joining: Mapping[str, bytes] | None = None) -> Manifest:
        """The next version, with ``vn`` at ``r`` replicas: the first ``r`` slots; new slots
        are taken by ``joining`` (broker id -> public key), in order."""
        joining = dict(joining or {})
        slots = (*self.slots(vn), *(b for b in joining if b not in self.slots(vn)))
        if not 1 <= r <= len(slots):
            raise TopologyError(f"VN {vn}: {r} replicas, but {len(slots)} slots", "malformed")
        old = len(self.members[vn])
        return Manifest(
            self.tree,
            {**self.members, vn: slots[:r]},
            {**self.keys, **joining},
            self.version + 1,
            {**self.spares, vn: slots[r:]},
            {**self.sizes, vn: tuple(sorted({*self.sizes.get(vn, ()), old, r}))},
        )

    @cached_property
    def _owners(self) -> dict[str, str]:
        return {b: vn for vn in self.members for b in self.slots(vn)}

    def owner(self, broker_id: str) -> str | None:
        """The VN ``broker_id`` belongs to, or None when it is no broker of the manifest."""
        return self._owners.get(broker_id)

    def vn_of(self, broker_id: str) -> str:
        vn = self.owner(broker_id)
        if vn is None:
            raise TopologyError(f"broker {broker_id!r} is in no VN of the manifest", "unknown")
        return vn

    def replica_index(self, broker_id: str) -> int:
        return self.slots(self.vn_of(broker_id)).index(broker_id)

    def vn_path(self, source_vn: str, target_vn: str) -> list[str]:
        """The VNs a publication from ``source_vn`` crosses to reach ``target_vn`` in the
        tree the overlay started as (live reconfiguration may have moved it since: key
        shares are verified along the path their certificates name, see
        ``security.paths.claimed_path``)."""
        return self.tree.path(source_vn, target_vn)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": self.version,
            "tree": self.tree.to_dict(),
            "members": {vn: list(ids) for vn, ids in sorted(self.members.items())},
            "keys": {b: key.hex() for b, key in sorted(self.keys.items())},
        }
        if any(self.spares.values()):
            data["spares"] = {vn: list(ids) for vn, ids in sorted(self.spares.items()) if ids}
        if self.sizes:
            data["sizes"] = {vn: list(rs) for vn, rs in sorted(self.sizes.items())}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        try:
            return cls(
                Tree.from_dict(data["tree"]),
                {vn: tuple(ids) for vn, ids in data["members"].items()},
                {b: bytes.fromhex(key) for b, key in data["keys"].items()},
                int(data.get("version", 0)),
                {vn: tuple(ids) for vn, ids in data.get("spares", {}).items()},
                {vn: tuple(rs) for vn, rs in data.get("sizes", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TopologyError(f"malformed manifest: {exc}", "malformed") from None

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def save(self, path: str | Path) -> None:
        """Write the manifest atomically (brokers and subscribers may read it at any time)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
