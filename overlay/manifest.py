"""The overlay manifest: which brokers form each virtual node, the VN tree, and keys.

Verifying a key share needs to know who may sign each split along a publication's path:
the replicas of every VN on it, in replica order, with their Ed25519 public keys. Operators
distribute this manifest (a JSON file) to brokers and confidential subscribers as their
trust anchor; nothing learned over the network can change its membership or keys. Which
VNs a publication crossed is read from its shares' signed certificates, not from the tree
here (live reconfiguration moves links; see ``security.paths.claimed_path``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
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

    def __post_init__(self) -> None:
        if set(self.members) != set(self.tree.brokers):
            raise TopologyError(
                "manifest members must list exactly the VNs of the tree", "malformed"
            )
        for vn, ids in self.members.items():
            missing = [b for b in ids if b not in self.keys]
            if not ids or missing:
                raise TopologyError(f"VN {vn}: no replicas or no key for {missing}", "malformed")

    @cached_property
    def _owners(self) -> dict[str, str]:
        return {b: vn for vn, ids in self.members.items() for b in ids}

    def owner(self, broker_id: str) -> str | None:
        """The VN ``broker_id`` belongs to, or None when it is no broker of the manifest."""
        return self._owners.get(broker_id)

    def vn_of(self, broker_id: str) -> str:
        vn = self.owner(broker_id)
        if vn is None:
            raise TopologyError(f"broker {broker_id!r} is in no VN of the manifest", "unknown")
        return vn

    def replica_index(self, broker_id: str) -> int:
        return self.members[self.vn_of(broker_id)].index(broker_id)

    def vn_path(self, source_vn: str, target_vn: str) -> list[str]:
        """The VNs a publication from ``source_vn`` crosses to reach ``target_vn`` in the
        tree the overlay started as (live reconfiguration may have moved it since: key
        shares are verified along the path their certificates name, see
        ``security.paths.claimed_path``)."""
        return self.tree.path(source_vn, target_vn)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tree": self.tree.to_dict(),
            "members": {vn: list(ids) for vn, ids in sorted(self.members.items())},
            "keys": {b: key.hex() for b, key in sorted(self.keys.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        try:
            return cls(
                Tree.from_dict(data["tree"]),
                {vn: tuple(ids) for vn, ids in data["members"].items()},
                {b: bytes.fromhex(key) for b, key in data["keys"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TopologyError(f"malformed manifest: {exc}", "malformed") from None

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
