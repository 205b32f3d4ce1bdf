"""Which path a publication's key shares travelled, read from their signed certificates.

Live reconfiguration moves links, so verifiers cannot take the path from the manifest's
tree; a share names the replica that signed each split, and a verifier adopts a path only
when a majority of the sending VN vouches for it.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from overlay.manifest import Manifest
from overlay.tree import line_tree
from security.paths import PathVote, claimed_path
from security.publication import SecBlock

VNS = ("a", "b", "c", "d")
MANIFEST = Manifest(
    line_tree(VNS),
    {vn: tuple(f"{vn}.{i}" for i in range(3)) for vn in VNS},
    {f"{vn}.{i}": bytes(32) for vn in VNS for i in range(3)},
)
SEC = SecBlock(pk=b"", sig=b"", vn="a", epoch=1)


def share(*splitters: str) -> SimpleNamespace:
    """A stand-in share: only its level and its certificates' signers matter here."""
    certs = [SimpleNamespace(splitter=s) for s in splitters]
    return SimpleNamespace(level=len(certs), certs=certs)


def test_path_is_read_from_the_signers_of_each_split() -> None:
    assert claimed_path(MANIFEST, SEC, share("pub"), "a") == ("a",)
    assert claimed_path(MANIFEST, SEC, share("pub", "a.2"), "c") == ("a", "c")
    # Not the manifest's line a-b-c-d: after a move a share may skip b.
    assert claimed_path(MANIFEST, SEC, share("pub", "a.0", "d.1"), "c") == ("a", "d", "c")


def test_impossible_paths_are_refused() -> None:
    assert claimed_path(MANIFEST, SEC, share("pub"), "b") is None  # edge VN is not the holder's
    assert claimed_path(MANIFEST, SEC, share("pub", "b.0"), "c") is None  # not the edge VN
    assert claimed_path(MANIFEST, SEC, share("pub", "a.0", "x.9"), "c") is None  # unknown
    assert claimed_path(MANIFEST, SEC, share("pub", "a.0", "c.1"), "c") is None  # VN twice
    short = SimpleNamespace(level=2, certs=[SimpleNamespace(splitter="pub")])
    assert claimed_path(MANIFEST, SEC, short, "c") is None


def test_a_byzantine_minority_cannot_impose_a_path() -> None:
    vote = PathVote()
    # b.2 is Byzantine: whatever it sends, it is one voice of VN b's three.
    for _ in range(5):
        assert vote.offer(MANIFEST, SEC, share("pub", "a.0", "d.0"), "b.2", "c") is None
    assert vote.offer(MANIFEST, SEC, share("pub", "a.0", "b.0"), "b.0", "c") is None
    assert vote.offer(MANIFEST, SEC, share("pub", "a.1", "b.1"), "b.1", "c") == ("a", "b", "c")


def test_the_publisher_alone_vouches_at_its_edge() -> None:
    assert PathVote().offer(MANIFEST, SEC, share("pub"), "pub", "a") == ("a",)


def test_an_epoch_split_across_a_move_is_recovered_from_the_complete_path() -> None:
    """Replica a.0 split the epoch's key along the old path a-b-c before the move; a.1
    split along the new path a-c after it, and a.0 re-sent its share there too. The old
    path holds one of the k = 2 level-1 shares, never enough; the new path holds two."""
    from security.envelope import Signer, generate_signing_key, public_key_to_bytes
    from security.paths import KeyAssembly
    from security.propagation import publisher_split, resplit, threshold_for
    from security.publication import publication_id

    keys = {f"{vn}.{i}": generate_signing_key() for vn in "abc" for i in range(3)}
    publisher = generate_signing_key()
    signers = {b: Signer(b, k) for b, k in keys.items()}
    manifest = Manifest(
        line_tree("abc"),
        {vn: tuple(f"{vn}.{i}" for i in range(3)) for vn in "abc"},
        {b: public_key_to_bytes(k.public_key()) for b, k in keys.items()},
    )
    sec = SecBlock(pk=public_key_to_bytes(publisher.public_key()), sig=b"", vn="a", epoch=1)
    secret = bytes(range(32))
    pub_id = publication_id("pub", 1)
    level1 = publisher_split(secret, threshold_for(3), 3, Signer("pub", publisher), pub_id)
    k = threshold_for(3)
    assembly = KeyAssembly("pub", 1, sec=sec)
    # Old path a-b-c: only a.0's subtree arrives (a.1 and a.2 had not split yet).
    for to_b in resplit(level1[0], k, 3, signers["a.0"]):
        holder_b = f"b.{to_b.lineage[-1]}"
        for to_c in resplit(to_b, k, 3, signers[holder_b]):
            assembly.add(f"c.{to_c.lineage[-1]}", to_c)
    assert assembly.recover(manifest, "c") is None
    # New path a-c: a.0 re-sends its share to the new hop, a.1 splits there directly.
    for i in (0, 1):
        for to_c in resplit(level1[i], k, 3, signers[f"a.{i}"]):
            assembly.add(f"c.{to_c.lineage[-1]}", to_c)
    assert assembly.recover(manifest, "c") == secret
    assert set(assembly.paths) == {("a", "b", "c"), ("a", "c")}
    assert assembly.culprits == frozenset()


def _two_vn_world() -> tuple[Manifest, SecBlock, dict[str, Any], list[Any], bytes]:
    from security.envelope import Signer, generate_signing_key, public_key_to_bytes
    from security.propagation import publisher_split, resplit, threshold_for
    from security.publication import publication_id

    keys = {f"{vn}.{i}": generate_signing_key() for vn in "ab" for i in range(3)}
    publisher = generate_signing_key()
    signers = {b: Signer(b, k) for b, k in keys.items()}
    manifest = Manifest(
        line_tree("ab"),
        {vn: tuple(f"{vn}.{i}" for i in range(3)) for vn in "ab"},
        {b: public_key_to_bytes(k.public_key()) for b, k in keys.items()},
    )
    sec = SecBlock(pk=public_key_to_bytes(publisher.public_key()), sig=b"", vn="a", epoch=1)
    secret = bytes(range(32))
    k = threshold_for(3)
    level1 = publisher_split(secret, k, 3, Signer("pub", publisher), publication_id("pub", 1))
    leaves = [leaf for i in range(3) for leaf in resplit(level1[i], k, 3, signers[f"a.{i}"])]
    return manifest, sec, signers, leaves, secret


def test_a_relay_forging_upstream_certificates_cannot_hold_the_key_back() -> None:
    """b.1 relays leaves under certificates of a.i's splits it forged (commitments to its own
    data) and never sends its third leaf, so the wait is never over: the key still comes from
    the pass without signature checks and opens the payload, and an audit sets b.1's leaves
    aside. It names nobody: b.1 relays without checking every seal, so a.i could have sent
    it those certificates; b.1's own sampled check names a.i when a.i does."""
    from security.envelope import seal
    from security.paths import KeyAssembly
    from security.propagation import commitment, reconstruct
    from security.publication import publication_id

    manifest, sec, _, leaves, secret = _two_vn_world()
    assembly = KeyAssembly("pub", 1, sec=sec)
    sent = []
    for leaf in leaves:
        holder = f"b.{leaf.lineage[-1]}"
        if holder == "b.1":
            if leaf.lineage[0] == 2:
                continue
            data = bytes(len(leaf.data))
            own = leaf.certs[1]
            forged = dataclasses.replace(
                own,
                commitments=tuple(
                    commitment(leaf.salt + data) if j == 1 else c
                    for j, c in enumerate(own.commitments)
                ),
            )
            leaf = dataclasses.replace(leaf, data=data, certs=(leaf.certs[0], forged))  # noqa: PLW2901
        sent.append((holder, leaf))
        assembly.add(holder, leaf)
        assembly.recover(manifest, "b")
    assert assembly.key == secret
    pub_id = publication_id("pub", 1)
    assert assembly.open(1, {"x": 1}, seal(secret, pub_id, {"x": 1}, b"hi")) == b"hi"
    [path] = assembly.paths.values()
    audit = reconstruct(sent, path.view, pub_id)
    assert audit.key == secret
    assert audit.culprits == frozenset()
    honest = reconstruct([(s, r) for s, r in sent if s != "b.1"], path.view, pub_id)
    assert audit.key == honest.key


def test_a_quick_key_that_fails_the_tag_is_replaced_by_the_verified_one() -> None:
    from security.envelope import seal
    from security.paths import KeyAssembly
    from security.publication import publication_id

    manifest, sec, _, leaves, secret = _two_vn_world()
    assembly = KeyAssembly("pub", 1, sec=sec)
    for leaf in leaves:
        assembly.add(f"b.{leaf.lineage[-1]}", leaf)
    assert assembly.recover(manifest, "b") == secret
    # As if forged certificates had fooled the unverified pass into a wrong key:
    assembly.key, assembly.tentative = bytes(32), True
    for path in assembly.paths.values():
        path.audited = False
    sealed = seal(secret, publication_id("pub", 2), {"x": 1}, b"hi")
    assert assembly.open(2, {"x": 1}, sealed) == b"hi"
    assert assembly.key == secret
    assert assembly.distrust


def test_without_audit_the_key_comes_first_and_the_audit_follows_when_asked() -> None:
    """The subscriber hands out deliveries before auditing: recover(audit=False) gives the
    key of a complete path without verifying a seal; a later recover() audits it."""
    from security.paths import KeyAssembly

    manifest, sec, _, leaves, secret = _two_vn_world()
    assembly = KeyAssembly("pub", 1, sec=sec)
    for leaf in leaves:
        assembly.add(f"b.{leaf.lineage[-1]}", leaf)
    assert assembly.recover(manifest, "b", audit=False) == secret
    [path] = assembly.paths.values()
    assert not path.audited
    assert path.verifier is None  # no seal was checked
    assert assembly.recover(manifest, "b") == secret
    assert path.audited
    assert assembly.culprits == frozenset()


def test_a_complete_epoch_that_hashing_finds_clean_is_audited_without_a_signature(
    monkeypatch: Any,
) -> None:
    """Seals matter only as proof against a splitter: when every share checks out by
    hashing and gives the one key, there is nothing to prove, so no seal is verified
    (but for the epochs picked at random, here none)."""
    from security import paths, propagation
    from security.paths import KeyAssembly

    monkeypatch.setattr(paths, "AUDIT_ONE_IN", 1 << 60)
    monkeypatch.setattr(propagation, "DEFAULT_SEALS", propagation.SealCache())
    manifest, sec, _, leaves, secret = _two_vn_world()
    assembly = KeyAssembly("pub", 1, sec=sec)
    for leaf in leaves:
        assembly.add(f"b.{leaf.lineage[-1]}", leaf)
    assert assembly.recover(manifest, "b") == secret
    [path] = assembly.paths.values()
    assert path.audited
    assert path.verifier is None
    assert propagation.DEFAULT_SEALS.verified == 0
    assert assembly.culprits == frozenset()


def test_an_epoch_picked_at_random_is_audited_in_full(monkeypatch: Any) -> None:
    from security import paths
    from security.paths import KeyAssembly

    monkeypatch.setattr(paths, "AUDIT_ONE_IN", 1)
    manifest, sec, _, leaves, secret = _two_vn_world()
    assembly = KeyAssembly("pub", 1, sec=sec)
    for leaf in leaves:
        assembly.add(f"b.{leaf.lineage[-1]}", leaf)
    assert assembly.recover(manifest, "b") == secret
    [path] = assembly.paths.values()
    assert path.audited
    assert path.verifier is not None


def test_a_fault_hashing_shows_brings_the_full_audit_and_its_blame(monkeypatch: Any) -> None:
    """b.2 relays one leaf with its data altered: the opening misses its commitment, the
    clean check fails, and the verified audit names b.2 (it relays only what hashes true)."""
    from security import paths
    from security.paths import KeyAssembly

    monkeypatch.setattr(paths, "AUDIT_ONE_IN", 1 << 60)
    manifest, sec, _, leaves, secret = _two_vn_world()
    assembly = KeyAssembly("pub", 1, sec=sec)
    for leaf in leaves:
        holder = f"b.{leaf.lineage[-1]}"
        if holder == "b.2" and leaf.lineage[0] == 0:
            leaf = dataclasses.replace(leaf, data=bytes(b ^ 1 for b in leaf.data))  # noqa: PLW2901
        assembly.add(holder, leaf)
    assert assembly.recover(manifest, "b") == secret
    [path] = assembly.paths.values()
    assert path.audited
    assert path.verifier is not None
    assert assembly.culprits == frozenset({"b.2"})


def test_a_relay_repeating_or_forging_records_fills_only_its_own_allowance() -> None:
    """A subscriber held every record-form share a relay sent until the epoch was let go: a
    Byzantine relay sending forged records for one epoch again and again grew it without
    bound (until 2026-12-02). Its records are charged to it, refused past the budget, the
    honest relays' shares still give the key, a record sent twice is held once, and letting
    the epoch go frees the allowance."""
    import os

    from security.paths import KeyAssembly, RecordAllowance, record_cost

    manifest, sec, _, leaves, secret = _two_vn_world()
    budget = 64 * 1024
    allowance = RecordAllowance(budget)
    assembly = KeyAssembly("pub", 1, sec=sec)
    own = next(leaf for leaf in leaves if leaf.lineage[-1] == 2)
    taken = sum(
        allowance.take(assembly, "b.2", dataclasses.replace(own, data=os.urandom(len(own.data))))
        for _ in range(2000)
    )
    assert allowance.charged("b.2") <= budget
    assert taken == allowance.charged("b.2") // record_cost(own) < 2000
    assert allowance.refused["b.2"] == 2000 - taken
    for leaf in leaves:
        holder = f"b.{leaf.lineage[-1]}"
        if holder != "b.2":
            assert allowance.take(assembly, holder, leaf)
            assert not allowance.take(assembly, holder, leaf)  # again: held once
    assert allowance.charged("b.0") == 3 * record_cost(own)
    assert assembly.recover(manifest, "b") == secret
    allowance.release(assembly)
    assert allowance.charged("b.2") == allowance.charged("b.0") == 0
    assert allowance.take(KeyAssembly("pub", 2, sec=sec), "b.2", own)
