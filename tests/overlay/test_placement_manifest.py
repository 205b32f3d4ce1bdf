"""Manifest versions for live replica attach/detach (SPEC §4), and key shares split on both
sides of a threshold-scheme switch.

A VN's replicas are slots in a fixed order: r members are the first r slots, so a detach
gives back the last slot and no remaining replica changes index. A version keeps every
replica count the VN had, so shares split before a switch verify after it; each node of the
share tree is reconstructed under its own certificate's (k, r), never from a mix.
"""

from __future__ import annotations

import pytest

from overlay.manifest import Manifest
from overlay.tree import TopologyError, line_tree
from security.envelope import Signer, public_key_to_bytes
from security.paths import path_view
from security.propagation import (
    ChainVerifier,
    ShareInbox,
    publisher_split,
    reconstruct,
    resplit,
    threshold_for,
)
from security.publication import SecBlock, publication_id

SIGNERS = {b: Signer.generate(b) for b in ("a.0", "a.1", "a.2", "b.0", "b.1", "b.2", "b.3")}
PUBLISHER = Signer.generate("pub")


def key_of(broker: str) -> bytes:
    return public_key_to_bytes(SIGNERS[broker].public_key)


def start() -> Manifest:
    members = {"a": ("a.0", "a.1", "a.2"), "b": ("b.0", "b.1", "b.2")}
    return Manifest(
        line_tree(["a", "b"]), members, {b: key_of(b) for ids in members.values() for b in ids}
    )


def test_attach_takes_the_next_slot_and_detach_gives_back_the_last() -> None:
    v0 = start()
    prepared = v0.prepared("b", 4, {"b.3": key_of("b.3")})
    assert prepared.version == 1
    assert prepared.members == v0.members  # nobody switches yet...
    assert prepared.slots("b") == ("b.0", "b.1", "b.2", "b.3")
    assert prepared.schemes("b") == {3, 4}  # ...but every verifier accepts both schemes
    assert prepared.owner("b.3") == "b"
    attached = prepared.resized("b", 4)
    assert (attached.version, attached.members["b"]) == (2, ("b.0", "b.1", "b.2", "b.3"))
    detached = attached.prepared("b", 3).resized("b", 3)
    assert detached.version == 4
    assert detached.members["b"] == ("b.0", "b.1", "b.2")
    assert detached.spares["b"] == ("b.3",)  # its key stays: its old splits still verify
    assert detached.schemes("b") == {3, 4}
    assert [detached.replica_index(b) for b in ("b.0", "b.1", "b.2", "b.3")] == [0, 1, 2, 3]
    assert Manifest.from_dict(detached.to_dict()).to_dict() == detached.to_dict()


def test_a_manifest_without_a_version_is_version_0_and_bad_versions_are_refused() -> None:
    data = start().to_dict()
    del data["version"]
    assert Manifest.from_dict(data).version == 0
    with pytest.raises(TopologyError, match="size"):
        Manifest.from_dict({**data, "sizes": {"b": [4]}})  # b has 3 slots
    with pytest.raises(TopologyError, match="no key"):
        Manifest.from_dict({**data, "spares": {"b": ["b.9"]}})
    with pytest.raises(TopologyError, match="two slots"):
        Manifest.from_dict({**data, "spares": {"b": ["a.0"]}})
    with pytest.raises(TopologyError, match="5 replicas, but 3 slots"):
        start().resized("b", 5)


def test_shares_split_before_and_after_a_switch_reconstruct_together() -> None:
    """Replica a.0 split toward b with (2, 3) before it switched, a.1 and a.2 with (2, 4)
    after b.3 attached: the subscriber at b recovers the key from the mixture, each node
    under its own scheme, and a.2's split for 5 replicas (never allowed) is refused."""
    manifest = start().prepared("b", 4, {"b.3": key_of("b.3")}).resized("b", 4)
    key = bytes(range(32))
    pub_id = publication_id("pub", 1)
    roots = publisher_split(key, 2, 3, PUBLISHER, pub_id)
    leaves = []
    for i, r in enumerate((3, 4, 4)):
        leaves += resplit(roots[i], threshold_for(r), r, SIGNERS[f"a.{i}"])
    sec = SecBlock(pk=public_key_to_bytes(PUBLISHER.public_key), sig=b"", vn="a", epoch=1)
    view = path_view(manifest, "pub", sec, ("a", "b"))
    deliveries = [(f"b.{leaf.lineage[-1]}", leaf) for leaf in leaves]
    result = reconstruct(deliveries, view, pub_id, complete=True)
    assert result.key == key
    assert not result.blame
    # Only the replica count the manifest allows: 5 is none of b's.
    stale = resplit(roots[2], 3, 5, SIGNERS["a.2"])[0]
    verifier = ChainVerifier(view)
    assert "not one the manifest allows" in (verifier.record_problem(stale, pub_id) or "")
    # Before b.3's slot was known, a split for 4 did not verify at b.0 either.
    before = path_view(start(), "pub", sec, ("a", "b"))
    inbox = ShareInbox(before, pub_id, 2, 0)
    assert not inbox.offer(leaves[3], "a.1")
    assert "not one the manifest allows" in inbox.blames[-1].detail
    inbox.rebase(view)  # the broker adopted the new version: the same share verifies
    assert inbox.offer(leaves[3], "a.1")
