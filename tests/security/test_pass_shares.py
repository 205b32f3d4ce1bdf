"""Key shares by the pass (security/pass_shares.py): a whole pass of publications through a
simulated path of VNs, honest replicas checking and re-splitting what they receive,
Byzantine replicas misbehaving, and the subscriber reconstructing every key and naming only
Byzantine brokers."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from security import pass_shares, shamir
from security.envelope import Signer
from security.pass_shares import _DOMAIN as STATEMENT_DOMAIN
from security.pass_shares import (
    Assembly,
    Held,
    LeafBatch,
    PassStatement,
    SealChecks,
    claimed_vns,
    entry_problem,
    leaf_batches,
    open_pass,
    parse_statement,
    root_holdings,
    split_pass,
)
from security.propagation import (
    SALT_SIZE,
    Fault,
    Member,
    PathView,
    PropagationError,
    Reconstruction,
    commitment,
    threshold_for,
)

# What a Byzantine replica does with what it sends on: drop it all, flip a byte of each
# blob, send each receiver its own split (equivocate), split a made-up share, commit to an
# inconsistent split, or (on the last VN) hand the subscriber statements with forged
# signatures and altered leaves.
MODES = ("drop", "corrupt", "equivocate", "wrong_secret", "inconsistent", "forge")


@dataclass
class World:
    """A path of VNs (replica counts), signers, and the Byzantine replicas (id -> mode)."""

    sizes: tuple[int, ...]
    byzantine: dict[str, str] = field(default_factory=dict)
    signers: dict[str, Signer] = field(init=False)
    path: PathView = field(init=False)

    def __post_init__(self) -> None:
        self.signers = {"pub": Signer.generate("pub")}
        vns = []
        for d, r in enumerate(self.sizes):
            names = [f"v{d}.{i}" for i in range(r)]
            self.signers.update({n: Signer.generate(n) for n in names})
            vns.append(tuple(Member(n, self.signers[n].public_key) for n in names))
        self.path = PathView(Member("pub", self.signers["pub"].public_key), tuple(vns))


Sent = tuple[PassStatement, bytes]


def _bad_split(signer: Signer, toward: str, r: int, held: list[Held], mode: str) -> list[Sent]:
    """What a Byzantine splitter sends each of the r receivers."""
    if mode == "drop":
        return []
    if mode == "equivocate":
        return [_one(signer, toward, j, r, held) for j in range(r)]
    if mode == "wrong_secret":
        fake = [h._replace(opening=os.urandom(len(h.opening))) for h in held]
        statement, blobs = split_pass(signer, toward, 0, r, fake)
        return [(statement, blob) for blob in blobs]
    statement, blobs = split_pass(signer, toward, 0, r, held)
    if mode == "corrupt":
        return [(statement, blob[:-1] + bytes([blob[-1] ^ 1])) for blob in blobs]
    if mode == "inconsistent" and r > threshold_for(r):
        # Replace child 0 of every node with random bytes and commit to those: every
        # child matches its commitment, but they lie on no polynomial of degree k - 1.
        blobs = list(blobs)
        fresh = b"".join(os.urandom(e.size) for e in statement.entries)
        blobs[0] = fresh
        return _recommitted(signer, toward, r, statement, blobs)
    return [(statement, blob) for blob in blobs]


def _one(signer: Signer, toward: str, j: int, r: int, held: list[Held]) -> Sent:
    statement, blobs = split_pass(signer, toward, j, r, held)
    return statement, blobs[j]


def _recommitted(
    signer: Signer,
    toward: str,
    r: int,
    honest: PassStatement,
    blobs: list[bytes],
) -> list[Sent]:
    """The statement re-signed with commitments to ``blobs`` as they now are."""
    rows = []
    at = 0
    for entry in honest.entries:
        commits = [commitment(blobs[j][at : at + entry.size]) for j in range(r)]
        rows.append([entry.pub_id, bytes(entry.node), entry.parent, entry.size, b"".join(commits)])
        at += entry.size
    raw = msgpack.packb(
        [STATEMENT_DOMAIN, signer.id, toward, 0, honest.k, r, rows], use_bin_type=True
    )
    statement = parse_statement(raw, signer.sign(raw))
    return [(statement, blob) for blob in blobs]


class Replica:
    """One broker of the path: what it accepted (first share per lineage) and its blame."""

    def __init__(self, world: World, level: int, index: int) -> None:
        self.world = world
        self.level = level  # 1-based VN level
        self.index = index
        self.id = world.path.vns[level - 1][index].id
        self.held: dict[tuple[bytes, tuple[int, ...]], Held] = {}
        self.under: dict[bytes, PassStatement] = {}  # statements its shares came under
        self.relayed: dict[bytes, PassStatement] = {}  # every statement to pass on
        self.blamed: set[str] = set()
        self.seals = SealChecks()

    def receive(self, sender: str, sent: Sent, relayed: Iterable[PassStatement]) -> None:
        statement, blob = sent
        path = self.world.path
        if statement.splitter != sender or any(
            entry_problem(statement, e, path) or len(e.node) != self.level - 1
            for e in statement.entries
        ):
            self.blamed.add(sender)
            return
        key = self.world.signers[sender].public_key
        if self.level < len(self.world.sizes) and not self.seals.sealed(statement, key):
            self.blamed.add(sender)  # it will not vouch for a bad signature
            return
        held, bad = open_pass(statement, blob, self.index)
        if bad:
            self.blamed.add(sender)
        for share in held:
            self.held.setdefault((share.pub_id, share.lineage), share)
        self.under[statement.ref] = statement
        self.relayed[statement.ref] = statement
        for s in relayed:
            self.relayed.setdefault(s.ref, s)

    def send_on(self, toward: str, r: int) -> list[Sent]:
        held = [self.held[key] for key in sorted(self.held)]
        if not held:
            return []
        signer = self.world.signers[self.id]
        mode = self.world.byzantine.get(self.id)
        if mode is not None and mode != "forge":
            return _bad_split(signer, toward, r, held, mode)
        statement, blobs = split_pass(signer, toward, 0, r, held)
        return [(statement, blob) for blob in blobs]

    def leaves(self) -> tuple[list[PassStatement], list[LeafBatch]]:
        """What this last-VN replica hands the subscriber."""
        batches = leaf_batches(self.held.values(), self.under)
        statements = list(self.relayed.values())
        mode = self.world.byzantine.get(self.id)
        if mode == "drop":
            return [], []
        if mode in ("corrupt", "forge"):
            batches = [b._replace(blob=b.blob[:-1] + bytes([b.blob[-1] ^ 1])) for b in batches]
        if mode == "forge":
            # Every statement again under a made-up signature, and the leaves under those.
            forged = {s.ref: parse_statement(s.raw, os.urandom(64)) for s in statements}
            statements += list(forged.values())
            batches += [b._replace(ref=forged[b.ref].ref) for b in batches if b.ref in forged]
        return statements, batches


def _assembly(
    statements: Iterable[PassStatement], deliveries: Iterable[tuple[str, LeafBatch]]
) -> Assembly:
    assembly = Assembly()
    for statement in statements:
        assembly.add_statement(statement)
    for sender, batch in deliveries:
        assembly.add_leaves(sender, batch)
    return assembly


def run(
    world: World, count: int
) -> tuple[dict[bytes, bytes], dict[bytes, Reconstruction], set[str]]:
    """Publish ``count`` keys in one pass; return keys, reconstructions and the blame of
    honest brokers."""
    keys = {f"pub/{n}".encode(): os.urandom(32) for n in range(count)}
    layers, statements, deliveries = _deliver(world, keys)
    assembly = _assembly(statements, deliveries)
    seals = SealChecks()
    results = {
        pub_id: assembly.reconstruct(pub_id, world.path, seals=seals, complete=True)
        for pub_id in keys
    }
    # The whole pass at once rebuilds the same keys and names the same brokers.
    together = assembly.reconstruct_many(keys, world.path, seals=seals, complete=True)
    assert {p: (r.key, set(r.blame)) for p, r in together.items()} == {
        p: (r.key, set(r.blame)) for p, r in results.items()
    }
    blamed = {b for layer in layers for r in layer if r.id not in world.byzantine for b in r.blamed}
    return keys, results, blamed


@pytest.mark.parametrize("sizes", [(3,), (3, 3), (3, 3, 3), (5, 3, 5), (1, 3, 1)])
def test_every_key_comes_back_on_an_honest_path_with_no_blame(sizes: tuple[int, ...]) -> None:
    keys, results, blamed = run(World(sizes), count=5)
    for pub_id, key in keys.items():
        assert results[pub_id].key == key
        assert results[pub_id].blame == ()
    assert blamed == set()


def test_a_blob_is_child_j_of_every_node_and_any_k_children_give_the_opening() -> None:
    signer = Signer.generate("s")
    held = [Held(b"p/1", (), os.urandom(32), b""), Held(b"p/2", (), os.urandom(32), b"")]
    statement, blobs = split_pass(signer, "v0", 7, 5, held)
    assert (statement.k, statement.r, statement.serial) == (3, 5, 7)
    opened = [open_pass(statement, blob, j) for j, blob in enumerate(blobs)]
    assert all(bad == [] for _, bad in opened)
    for n, h in enumerate(held):
        children = [shares[n].opening[SALT_SIZE:] for shares, _ in opened]
        points = [shamir.trusted_share(x + 1, children[x]) for x in (4, 1, 2)]
        assert shamir.combine(points, 3) == h.opening
        assert [shares[n].lineage for shares, _ in opened] == [(j,) for j in range(5)]


def test_a_statement_survives_its_bytes_and_a_garbled_one_is_refused() -> None:
    signer = Signer.generate("s")
    statement, _ = split_pass(signer, "v1", 3, 3, [Held(b"p/1", (0,), os.urandom(48), b"x" * 32)])
    again = parse_statement(statement.raw, statement.signature)
    assert again.entries == statement.entries
    assert again.ref == statement.ref
    assert SealChecks().sealed(again, signer.public_key)
    assert not SealChecks().sealed(parse_statement(statement.raw, bytes(64)), signer.public_key)
    for garbled in (b"", b"\x91\x01", statement.raw[:-3], statement.raw.replace(b"v1", b"v2")):
        if garbled == statement.raw:
            continue
        try:
            parsed = parse_statement(garbled, statement.signature)
        except PropagationError:
            continue
        assert not SealChecks().sealed(parsed, signer.public_key)


def test_a_flipped_byte_fails_its_commitment_and_names_the_entry() -> None:
    signer = Signer.generate("s")
    held = [Held(f"p/{n}".encode(), (), os.urandom(32), b"") for n in range(3)]
    statement, blobs = split_pass(signer, "v0", 0, 3, held)
    blob = bytearray(blobs[1])
    blob[statement.entries[0].size + 5] ^= 1  # inside the second entry's opening
    shares, bad = open_pass(statement, bytes(blob), 1)
    assert [s.pub_id for s in shares] == [b"p/0", b"p/2"]
    assert [e.pub_id for e, _ in bad] == [b"p/1"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", [0, 1, 2])
def test_one_byzantine_replica_per_vn_costs_no_key_and_is_the_only_one_named(
    mode: str, level: int
) -> None:
    world = World((3, 3, 3), {f"v{level}.1": mode})
    keys, results, blamed = run(world, count=4)
    named = blamed | {b.broker for r in results.values() for b in r.blame}
    for pub_id, key in keys.items():
        assert results[pub_id].key == key
    assert named <= {f"v{level}.1"}


@pytest.mark.parametrize(
    ("byzantine", "mode", "fault"),
    [
        ("v0.2", "inconsistent", Fault.INCONSISTENT_SPLIT),  # children on no polynomial
        ("v0.0", "wrong_secret", Fault.WRONG_SECRET),  # a made-up share split onward
        ("v0.1", "equivocate", Fault.EQUIVOCATION),  # proven by two signed statements
    ],
)
def test_a_faulty_split_is_named_for_what_it_did(byzantine: str, mode: str, fault: Fault) -> None:
    world = World((3, 3), {byzantine: mode})
    keys, results, _ = run(world, count=2)
    faults = {(b.broker, b.fault) for r in results.values() for b in r.blame}
    assert (byzantine, fault) in faults
    assert all(results[p].key == k for p, k in keys.items())


def test_forged_signatures_from_a_last_vn_replica_prove_nothing_and_cost_nothing() -> None:
    world = World((3, 3), {"v1.0": "forge"})
    keys, results, _ = run(world, count=3)
    for pub_id, key in keys.items():
        result = results[pub_id]
        assert result.key == key
        assert {b.broker for b in result.blame} <= {"v1.0"}


def test_a_split_under_a_bad_signature_is_blamed_on_the_broker_that_vouched() -> None:
    # v0.0 splits under a publisher statement whose signature it did not check (a forged
    # one): the subscriber's audit names v0.0, not the publisher.
    world = World((3, 3))
    keys = {b"pub/0": os.urandom(32)}
    statement, blobs = split_pass(world.signers["pub"], "v0", 0, 3, root_holdings(keys.items()))
    forged = parse_statement(statement.raw, os.urandom(64))
    layer0 = [Replica(world, 1, i) for i in range(3)]
    for j, replica in enumerate(layer0):
        chosen = forged if j == 0 else statement
        held, _ = open_pass(chosen, blobs[j], j)
        for share in held:
            replica.held[(share.pub_id, share.lineage)] = share
        replica.under[chosen.ref] = chosen
        replica.relayed[chosen.ref] = chosen
    layer1 = [Replica(world, 2, i) for i in range(3)]
    for sender in layer0:
        sent = sender.send_on("v1", 3)
        for j, replica in enumerate(layer1):
            replica.receive(sender.id, sent[j], sender.relayed.values())
    statements, deliveries = [], []
    for replica in layer1:
        relayed, batches = replica.leaves()
        statements += relayed
        deliveries += [(replica.id, b) for b in batches]
    result = _assembly(statements, deliveries).reconstruct(b"pub/0", world.path, complete=True)
    assert result.key == keys[b"pub/0"]
    assert {(b.broker, b.fault) for b in result.blame} == {("v0.0", Fault.BAD_SHARE)}


def test_a_statement_of_another_splitter_is_refused_at_the_next_hop() -> None:
    world = World((3, 3))
    statement, _ = split_pass(
        world.signers["v0.1"], "v1", 0, 3, [Held(b"p", (0,), b"x" * 48, b"r" * 32)]
    )
    # v0.1 may only split shares whose lineage ends in 1.
    assert entry_problem(statement, statement.entries[0], world.path) is not None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([1, 3, 5]), min_size=1, max_size=3),
    st.integers(1, 4),
    st.data(),
)
def test_with_at_most_f_byzantine_replicas_per_vn_every_key_is_recovered_and_only_they_are_named(
    sizes: list[int], count: int, data: st.DataObject
) -> None:
    byzantine: dict[str, str] = {}
    for d, r in enumerate(sizes):
        f = (r - 1) // 2
        bad = data.draw(st.lists(st.integers(0, r - 1), max_size=f, unique=True))
        for i in bad:
            byzantine[f"v{d}.{i}"] = data.draw(st.sampled_from(MODES))
    world = World(tuple(sizes), byzantine)
    random.seed(data.draw(st.integers(0, 2**32 - 1)))
    keys, results, blamed = run(world, count)
    named = blamed | {b.broker for r in results.values() for b in r.blame}
    for pub_id, key in keys.items():
        assert results[pub_id].key == key
    assert named <= set(byzantine), (named, byzantine)


def _leaves_before_statements(
    world: World, count: int
) -> tuple[dict[bytes, bytes], list[PassStatement], Assembly]:
    """``count`` keys relayed over ``world``; an assembly handed their leaves only (the
    statements are returned, to hand it later)."""
    keys = {f"pub/{n}".encode(): os.urandom(32) for n in range(count)}
    _, statements, deliveries = _deliver(world, keys)
    assembly = Assembly()
    for sender, batch in deliveries:
        assembly.add_leaves(sender, batch)
    return keys, statements, assembly


def test_leaves_that_arrive_before_their_statement_wait_for_it() -> None:
    world = World((3, 3))
    keys, statements, assembly = _leaves_before_statements(world, 2)
    for pub_id in keys:
        assert assembly.reconstruct(pub_id, world.path).key is None
    for one in statements:
        assembly.add_statement(one)
    assert sorted(assembly.publications()) == sorted(keys)
    for pub_id, key in keys.items():
        assert assembly.reconstruct(pub_id, world.path, complete=True) == (key, ())


def test_a_relay_sending_leaves_under_a_statement_never_sent_fills_only_its_own_allowance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leaves under a statement not seen yet wait for it, bounded per relay in bytes: a
    Byzantine relay sending such leaves again and again (until 2026-11-29 the list under
    one reference grew without bound) is refused past its allowance, and the honest
    relays' leaves waiting beside them still give every key once the statements come."""
    budget = 64 * 1024
    monkeypatch.setattr(pass_shares, "LEAVES_WAITING_BUDGET", budget)
    world = World((3, 3))
    keys, statements, assembly = _leaves_before_statements(world, 2)
    junk = LeafBatch(os.urandom(32), (0,), bytes(1024))
    for _ in range(1000):
        assembly.add_leaves("v1.2", junk)
    assert assembly.waiting.charged("v1.2") <= budget
    assert len(assembly.waiting.get(junk.ref) or ()) < budget // 1024
    for one in statements:
        assembly.add_statement(one)
    for pub_id, key in keys.items():
        assert assembly.reconstruct(pub_id, world.path, complete=True) == (key, ())


def test_a_relay_naming_one_publication_in_forged_statements_fills_only_its_own_allowance() -> None:
    """A publication's entries and leaves are held until its key is known or given up: a
    Byzantine relay forging statement after statement for one publication, each with a leaf
    under it, grew the subscriber without bound (until 2026-11-29). It is charged what it
    brought, past ``held_budget`` the rest is refused, the honest relays' keys still come,
    and letting the publication go frees the allowance."""
    world = World((3, 3))
    mine = {f"pub/{n}".encode(): os.urandom(32) for n in range(3)}
    _, statements, deliveries = _deliver(world, mine)
    budget = 64 * 1024
    assembly = Assembly(held_budget=budget)
    byzantine = "v1.2"
    forger = Signer.generate("forger")
    target = next(iter(mine))
    for serial in range(2000):
        forged, blobs = split_pass(forger, "v2", serial, 3, root_holdings([(target, bytes(32))]))
        assembly.add_statement(forged, byzantine)
        assembly.add_leaves(byzantine, LeafBatch(forged.ref, (0,), blobs[0]))
    assert assembly.charged(byzantine) <= budget
    assert assembly.refused[byzantine] > 1000
    for one in statements:
        assembly.add_statement(one, "v1.0")
    for sender, batch in deliveries:
        assembly.add_leaves(sender, batch)
    for pub_id, key in mine.items():
        assert assembly.reconstruct(pub_id, world.path).key == key
    assembly.forget(target)
    assert assembly.charged(byzantine) == 0


def test_forged_statements_naming_a_publication_no_leaf_came_for_are_bounded_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without leaves a publication's entries count toward ``UNCLAIMED_BYTES`` over all
    such publications: one named again and again becomes the oldest and goes."""
    monkeypatch.setattr(pass_shares, "UNCLAIMED_BYTES", 32 * 1024)
    assembly = Assembly()
    forger = Signer.generate("forger")
    for serial in range(2000):
        forged, _ = split_pass(forger, "v2", serial, 3, root_holdings([(b"ghost/7", bytes(32))]))
        assembly.add_statement(forged, "v1.2")
    held = sum(len(entries) for entries in assembly._entries.values())
    assert held * (pass_shares.ENTRY_OVERHEAD + 3 * 32) <= 32 * 1024


def test_entries_of_publications_whose_leaves_never_come_are_let_go_oldest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relay's statements cover publications for other subscribers of its VN too; their
    leaves never come to this one. Their entries go past ``UNCLAIMED_MEMORY`` (until
    2026-11-29 a subscriber kept them for good: one per publication it did not match),
    and the publications whose leaves do come keep theirs."""
    monkeypatch.setattr(pass_shares, "UNCLAIMED_MEMORY", 8)
    world = World((3, 3))
    others = {f"other/{n}".encode(): os.urandom(32) for n in range(40)}
    _, other_statements, _ = _deliver(world, others)
    mine = {f"pub/{n}".encode(): os.urandom(32) for n in range(2)}
    _, statements, deliveries = _deliver(world, mine)
    assembly = Assembly()
    for one in statements:
        assembly.add_statement(one)
    for sender, batch in deliveries:
        assembly.add_leaves(sender, batch)
    for one in other_statements:
        assembly.add_statement(one)
    kept = set(assembly._entries)  # (no public view of the entries: this is what leaks)
    assert len(kept - set(mine)) <= 8
    for pub_id, key in mine.items():
        assert assembly.reconstruct(pub_id, world.path, complete=True) == (key, ())


def test_leaves_under_entries_that_name_no_publication_are_not_kept() -> None:
    """Only a publication's leaves are ever let go (with its key assembly); a relay's
    leaves under entries naming no publication were kept for good until 2026-11-29."""
    world = World((3, 3))
    junk = {b"no-publication": os.urandom(32), b"p/x": os.urandom(32)}
    _, statements, deliveries = _deliver(world, junk)
    assembly = _assembly(statements, deliveries)
    assert assembly.publications() == []
    assert not assembly._entries  # (what would have stayed)


@pytest.mark.parametrize("byzantine", [{}, {"v1.0": "corrupt"}, {"v0.2": "equivocate"}])
def test_k_of_r_holders_leaves_give_every_key_before_the_rest_arrive(
    byzantine: dict[str, str],
) -> None:
    """While deliveries are still coming (complete=False), the leaves of k of the last
    VN's r replicas rebuild every key, a whole pass at once as one by one, and blame
    nobody honest for the missing ones."""
    world = World((3, 3, 3), byzantine)
    keys = {f"pub/{n}".encode(): os.urandom(32) for n in range(6)}
    _, statements, deliveries = _deliver(world, keys)
    partial = [(sender, batch) for sender, batch in deliveries if sender != "v2.1"]
    assembly = _assembly(statements, partial)
    together = assembly.reconstruct_many(keys, world.path, audit=False)
    one_by_one = {p: assembly.reconstruct(p, world.path, audit=False) for p in keys}
    assert {p: r.key for p, r in together.items()} == keys
    assert {p: (r.key, set(r.blame)) for p, r in together.items()} == {
        p: (r.key, set(r.blame)) for p, r in one_by_one.items()
    }
    audited = assembly.reconstruct_many(keys, world.path)
    assert {b.broker for r in audited.values() for b in r.blame} <= set(byzantine)


@pytest.mark.parametrize("mode", ["forge", "equivocate", "corrupt"])
def test_the_quick_pass_checks_no_signature_and_still_gives_the_key(mode: str) -> None:
    """audit=False verifies nothing; what it finds wrong is only a reason to audit."""
    bad = "v1.0" if mode == "forge" else "v0.1"
    world = World((3, 3), {bad: mode})
    keys = {f"pub/{n}".encode(): os.urandom(32) for n in range(3)}
    _, statements, deliveries = _deliver(world, keys)
    assembly = _assembly(statements, deliveries)
    seals = SealChecks()
    for pub_id, key in keys.items():
        quick = assembly.reconstruct(pub_id, world.path, seals=seals, audit=False)
        assert quick.key == key
    assert seals.verified == 0


def _deliver(
    world: World, keys: dict[bytes, bytes]
) -> tuple[list[list[Replica]], list[PassStatement], list[tuple[str, LeafBatch]]]:
    """Every replica of the path after one pass per splitter, and the statements and
    leaves the subscriber gets for ``keys``."""
    depth = len(world.sizes)
    layers = [[Replica(world, d + 1, i) for i in range(r)] for d, r in enumerate(world.sizes)]
    statement, blobs = split_pass(
        world.signers["pub"], "v0", 0, world.sizes[0], root_holdings(keys.items())
    )
    for j, replica in enumerate(layers[0]):
        replica.receive("pub", (statement, blobs[j]), ())
    for d in range(1, depth):
        for sender in layers[d - 1]:
            sent = sender.send_on(f"v{d}", world.sizes[d])
            for j, replica in enumerate(layers[d]):
                if j < len(sent):
                    replica.receive(sender.id, sent[j], list(sender.relayed.values()))
    statements: list[PassStatement] = []
    deliveries: list[tuple[str, LeafBatch]] = []
    for replica in layers[-1]:
        relayed, batches = replica.leaves()
        statements += relayed
        deliveries += [(replica.id, b) for b in batches]
    return layers, statements, deliveries


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_garbled_statement_is_refused_with_a_propagation_error_or_parses_to_another(
    data: st.DataObject,
) -> None:
    signer = Signer.generate("s")
    held = [Held(f"p/{n}".encode(), (n % 3,), os.urandom(48), os.urandom(32)) for n in range(3)]
    statement, _ = split_pass(signer, "v1", 1, 3, held)
    raw = bytearray(statement.raw)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    garbled = bytes(raw[:cut]) + data.draw(st.binary(max_size=8))
    try:
        parsed = parse_statement(garbled, statement.signature)
    except PropagationError:
        return
    if garbled != statement.raw:
        assert parsed.ref != statement.ref
        assert not SealChecks().sealed(parsed, signer.public_key)


def test_a_statement_still_on_its_way_blames_nobody_below_it() -> None:
    """A subscriber may try before every statement is in: a split whose parent statement
    has not arrived cannot be checked, and its honest splitter is not blamed for it."""
    world = World((3, 3, 3))
    keys = {b"pub/0": os.urandom(32)}
    _, statements, deliveries = _deliver(world, keys)
    assembly = Assembly()
    later = [s for s in statements if s.splitter == "pub"]
    for one in statements:
        if one.splitter != "pub":
            assembly.add_statement(one)
    for sender, batch in deliveries:
        assembly.add_leaves(sender, batch)
    early = assembly.reconstruct(b"pub/0", world.path)
    assert early == (None, ())
    for one in later:
        assembly.add_statement(one)
    assert assembly.reconstruct(b"pub/0", world.path, complete=True) == (keys[b"pub/0"], ())


def test_the_path_of_a_share_is_read_up_its_chain_of_statements() -> None:
    world = World((3, 3, 3))
    keys = {b"pub/0": os.urandom(32)}
    layers, _, _ = _deliver(world, keys)
    holder = layers[2][1]  # v2.1 holds leaves split by v1.*
    known = {**holder.relayed}

    def owner(broker: str) -> str | None:
        return broker.rpartition(".")[0] if broker.startswith("v") else None

    for statement in holder.under.values():
        for entry in statement.entries:
            claim = claimed_vns(statement, entry, known, owner, "v0", "v2")
            assert claim == ("v0", "v1", "v2")
    edge = layers[0][0]
    (root,) = edge.under.values()
    assert claimed_vns(root, root.entries[0], {}, owner, "v0", "v0") == ("v0",)
    assert claimed_vns(root, root.entries[0], {}, owner, "v0", "v1") is None
    middle = next(iter(layers[1][0].under.values()))
    assert claimed_vns(middle, middle.entries[0], {}, owner, "v0", "v1") is None  # no chain
    assert claimed_vns(middle, middle.entries[0], known, owner, "v0", "v1") == ("v0", "v1")
    assert claimed_vns(middle, middle.entries[0], known, owner, "v1", "v1") is None


def test_a_leaf_delivered_twice_counts_once() -> None:
    """A resumed session is handed its last leaves again: they must not make a partial
    delivery look complete (a short split would then be blamed on an honest splitter)."""
    world = World((3, 3))
    keys = {b"pub/1": os.urandom(32)}
    _, statements, deliveries = _deliver(world, keys)
    partial = [(sender, batch) for sender, batch in deliveries if sender != "v1.2"]
    assembly = _assembly(statements, partial + partial)
    assert len(assembly.leaves(b"pub/1")) == 6
    assert assembly.reconstruct(b"pub/1", world.path) == (keys[b"pub/1"], ())


@pytest.mark.parametrize("last", [1, 3])
def test_a_key_split_over_an_old_and_a_new_path_comes_back_on_each_with_no_blame(
    last: int,
) -> None:
    """A move puts v2 next to v0 while a publication's shares are on their way: each edge
    replica splits its share toward the old next VN (v1) and the new one (v2), and v2's
    replicas split what came both ways toward v3 in one statement each. Both paths reach the
    subscriber; each path's reconstruction reads the splits made along it only. Two splits
    of a node toward two VNs are no equivocation, and a statement holding entries of two
    paths is no fault of its splitter."""
    sizes = {"v0": 3, "v1": 3, "v2": 3, "v3": last}
    names = [f"{vn}.{i}" for vn, r in sizes.items() for i in range(r)]
    signers = {name: Signer.generate(name) for name in ["pub", *names]}

    def view(*vns: str) -> PathView:
        members = tuple(
            tuple(Member(f"{vn}.{i}", signers[f"{vn}.{i}"].public_key) for i in range(sizes[vn]))
            for vn in vns
        )
        return PathView(Member("pub", signers["pub"].public_key), members, names=vns)

    held: dict[str, list[Held]] = {name: [] for name in names}
    under: dict[str, dict[bytes, PassStatement]] = {name: {} for name in names}
    statements: list[PassStatement] = []

    def split(splitter: str, toward: str, shares: list[Held]) -> None:
        statement, blobs = split_pass(signers[splitter], toward, 0, sizes[toward], shares)
        statements.append(statement)
        for j, blob in enumerate(blobs):
            got, bad = open_pass(statement, blob, j)
            assert not bad
            held[f"{toward}.{j}"] += got
            under[f"{toward}.{j}"][statement.ref] = statement

    keys = {b"pub/0": os.urandom(32)}
    split("pub", "v0", root_holdings(keys.items()))
    for i in range(3):
        split(f"v0.{i}", "v1", held[f"v0.{i}"])
        split(f"v0.{i}", "v2", held[f"v0.{i}"])
    for j in range(3):
        split(f"v1.{j}", "v2", held[f"v1.{j}"])
    for j in range(3):
        split(f"v2.{j}", "v3", held[f"v2.{j}"])
    deliveries = [
        (f"v3.{x}", batch)
        for x in range(last)
        for batch in leaf_batches(held[f"v3.{x}"], under[f"v3.{x}"])
    ]
    assembly = _assembly(statements, deliveries)
    for path in (view("v0", "v1", "v2", "v3"), view("v0", "v2", "v3")):
        for audit in (False, True):
            found = assembly.reconstruct(b"pub/0", path, audit=audit, complete=True)
            assert found == (keys[b"pub/0"], ()), (path.names, audit)


def test_a_statement_a_relay_over_its_allowance_brought_first_is_taken_from_another() -> None:
    """A statement refused because its relay is over its allowance is not kept as seen:
    the same statement from an honest relay is taken, and the key comes."""
    world = World((3, 3))
    mine = {b"pub/1": os.urandom(32)}
    _, statements, deliveries = _deliver(world, mine)
    assembly = Assembly(held_budget=2048)
    for sender, batch in deliveries:  # leaves first: their statements wait
        assembly.add_leaves(sender, batch)
    full = "v1.2"
    assembly._charged[full] = assembly.held_budget  # (as if its allowance were used up)
    for one in statements:
        assembly.add_statement(one, full)
    assert assembly.refused.get(full, 0) > 0
    for one in statements:
        assembly.add_statement(one, "v1.0")
    assert assembly.reconstruct(b"pub/1", world.path, complete=True) == (mine[b"pub/1"], ())


def test_publications_an_assembly_was_never_told_to_let_go_go_oldest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client path that lets an epoch go without forgetting it left the relays charged
    for it for good; past ``CHARGED_MEMORY`` publications with leaves the oldest go."""
    monkeypatch.setattr(pass_shares, "CHARGED_MEMORY", 4)
    world = World((3, 3))
    keys = {f"pub/{n}".encode(): os.urandom(32) for n in range(10)}
    _, statements, deliveries = _deliver(world, keys)
    assembly = Assembly()
    for one in statements:
        assembly.add_statement(one, "v1.0")
    for sender, batch in deliveries:
        assembly.add_leaves(sender, batch)
    assert len(assembly._charges) <= 4
    assert sum(assembly._charged.values()) == sum(
        sum(by.values()) for by in assembly._charges.values()
    )
