"""Iterative share propagation over virtual nodes, robust reconstruction, blame and collusion.

The tests run a whole publication through a simulated path: every replica keeps a ShareInbox,
honest replicas re-split what it accepted, Byzantine replicas misbehave in one of the modes below,
and the subscriber reconstructs. Blame counted is what honest parties say: honest inboxes (their
own links) and the subscriber's proofs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from security import shamir
from security.envelope import DecryptionError, Signer, new_key, open_sealed, seal
from security.propagation import (
    MAX_CERT_BYTES,
    SALT_SIZE,
    Blame,
    CertBatch,
    ChainVerifier,
    Fault,
    Member,
    PathView,
    PropagationError,
    SealCache,
    ShareInbox,
    ShareRecord,
    SplitCert,
    cert_digest,
    coalition_key,
    commitment,
    confidentiality_free,
    merkle_fold,
    merkle_tree,
    pack_record,
    publisher_split,
    reconstruct,
    resplit,
    seal_certs,
    silent_senders,
    threshold_for,
    unpack_record,
)

MODES = ("drop", "corrupt", "equivocate", "wrong_secret", "inconsistent")
PUB_ID = b"publisher-1:7"
ATTRS = {"class": "stock", "symbol": "ACME"}


@dataclass
class World:
    """A path of VNs with keys, and which replicas are Byzantine (id -> mode)."""

    path: PathView
    publisher: Signer
    replicas: list[list[Signer]]
    byzantine: dict[str, str] = field(default_factory=dict)


_KEYS: dict[str, Signer] = {}


def _signer(name: str) -> Signer:
    if name not in _KEYS:
        _KEYS[name] = Signer.generate(name)
    return _KEYS[name]


def make_world(rs: list[int], byzantine: dict[str, str] | None = None) -> World:
    publisher = _signer("publisher")
    replicas = [[_signer(f"vn{d}.r{j}") for j in range(r)] for d, r in enumerate(rs, 1)]
    path = PathView(
        Member(publisher.id, publisher.public_key),
        tuple(tuple(Member(s.id, s.public_key) for s in vn) for vn in replicas),
    )
    return World(path, publisher, replicas, dict(byzantine or {}))


def with_byzantine(world: World, per_vn: list[int], modes: list[str], seed: int) -> World:
    """Mark ``per_vn[d]`` random replicas of VN_d Byzantine, cycling through ``modes``."""
    rng = random.Random(seed)
    chosen = {}
    for vn, count in zip(world.replicas, per_vn, strict=True):
        for signer in rng.sample(vn, count):
            chosen[signer.id] = rng.choice(modes)
    return dataclasses.replace(world, byzantine=chosen)


@dataclass
class Outcome:
    key: bytes | None
    subscriber_blame: tuple[Blame, ...]
    broker_blame: list[Blame]
    leaves_delivered: int
    seen_by_byzantine: list[ShareRecord]
    made_by_byzantine: list[ShareRecord]

    @property
    def culprits(self) -> set[str]:
        return {b.broker for b in (*self.subscriber_blame, *self.broker_blame)}


def _flip(record: ShareRecord) -> ShareRecord:
    return dataclasses.replace(record, data=bytes([record.data[0] ^ 0x5A]) + record.data[1:])


def _inconsistent_split(record: ShareRecord, k: int, r: int, signer: Signer) -> list[ShareRecord]:
    """A split whose commitments are honest about the sub-shares, but sub-share 0 is random."""
    shares = shamir.split(record.opening, k, r)
    datas = [os.urandom(len(shares[0].data))] + [s.data for s in shares[1:]]
    salts = [os.urandom(SALT_SIZE) for _ in range(r)]
    unsigned = SplitCert(
        record.pub_id,
        record.lineage,
        k,
        r,
        signer.id,
        tuple(commitment(salt + data) for salt, data in zip(salts, datas, strict=True)),
        b"",
        cert_digest(record.certs[-1]),
    )
    [cert] = seal_certs([unsigned], signer)
    return [
        ShareRecord(record.pub_id, (*record.lineage, j), (*record.certs, cert), salts[j], datas[j])
        for j in range(r)
    ]


def _forward(
    mode: str | None, record: ShareRecord, k: int, r: int, signer: Signer
) -> list[tuple[int, ShareRecord]]:
    """What a replica in ``mode`` (None = honest) sends to replicas 0..r-1 of the next VN."""
    if mode == "drop":
        return []
    if mode == "equivocate":
        return [(j, resplit(record, k, r, signer)[j]) for j in range(r)]
    if mode == "wrong_secret":
        fake = dataclasses.replace(record, data=os.urandom(len(record.data)))
        return list(enumerate(resplit(fake, k, r, signer)))
    if mode == "inconsistent":
        return list(enumerate(_inconsistent_split(record, k, r, signer)))
    children = resplit(record, k, r, signer)
    if mode == "corrupt":
        children = [_flip(c) for c in children]
    return list(enumerate(children))


def _deliver(mode: str | None, record: ShareRecord) -> list[ShareRecord]:
    """What a last-VN replica in ``mode`` hands the subscriber for one held share."""
    if mode == "drop":
        return []
    if mode == "equivocate":
        return [record, _flip(record)]
    if mode in {"corrupt", "wrong_secret", "inconsistent"}:
        return [_flip(record)]
    return [record]


def run(world: World, key: bytes) -> Outcome:
    path = world.path
    verifier = ChainVerifier(path)
    k1, r1 = path.scheme(1)
    in_flight = [
        (world.publisher.id, j, rec)
        for j, rec in enumerate(publisher_split(key, k1, r1, world.publisher, PUB_ID))
    ]
    broker_blame: list[Blame] = []
    seen: list[ShareRecord] = []
    made: list[ShareRecord] = []
    deliveries: list[tuple[str, ShareRecord]] = []
    for level, vn in enumerate(world.replicas, 1):
        inboxes = [ShareInbox(path, PUB_ID, level, j, verifier) for j in range(len(vn))]
        for sender, j, record in in_flight:
            if vn[j].id in world.byzantine:
                seen.append(record)
            inboxes[j].offer(record, sender)
        in_flight = []
        for signer, inbox in zip(vn, inboxes, strict=True):
            mode = world.byzantine.get(signer.id)
            if mode is None:
                inbox.silent()
                broker_blame.extend(inbox.blames)
            for record in inbox.records:
                if level == path.depth:
                    deliveries.extend((signer.id, leaf) for leaf in _deliver(mode, record))
                    continue
                k, r = path.scheme(level + 1)
                sent = _forward(mode, record, k, r, signer)
                if mode is not None:
                    made.extend(child for _, child in sent)
                in_flight.extend((signer.id, j, child) for j, child in sent)
    result = reconstruct(deliveries, path, PUB_ID, complete=True)
    heard = {sender for sender, _ in deliveries}
    silent = silent_senders(path, path.depth + 1, heard)
    return Outcome(
        result.key,
        (*result.blame, *silent),
        broker_blame,
        len(deliveries),
        seen,
        made,
    )


def expected_culprits(world: World) -> set[str]:
    """Byzantine replicas whose misbehaviour reached an honest party, so blame must name them."""
    out = set()
    for level, vn in enumerate(world.replicas, 1):
        nxt = world.replicas[level] if level < len(world.replicas) else None
        for signer in vn:
            mode = world.byzantine.get(signer.id)
            if mode is None:
                continue
            if nxt is None or mode in {"drop", "corrupt", "wrong_secret"}:
                out.add(signer.id)
            elif mode == "equivocate":
                if sum(s.id not in world.byzantine for s in nxt) >= 2:
                    out.add(signer.id)
            elif mode == "inconsistent" and nxt[0].id not in world.byzantine:
                out.add(signer.id)
    return out


def test_threshold_and_confidentiality_follow_the_replica_count() -> None:
    assert [threshold_for(r) for r in range(1, 8)] == [1, 1, 2, 2, 3, 3, 4]
    assert [confidentiality_free(r) for r in (1, 2, 3, 5)] == [True, True, False, False]
    with pytest.raises(PropagationError):
        threshold_for(0)


HONEST_PATHS = [[r] for r in (1, 3, 5)] + [[a, b] for a in (1, 3, 5) for b in (1, 3, 5)]
HONEST_PATHS += [[3, 5, 1], [5, 3, 3], [1, 3, 5, 3], [5, 5, 5, 5]]


@pytest.mark.parametrize("rs", HONEST_PATHS, ids=lambda rs: "-".join(map(str, rs)))
def test_subscriber_gets_prod_r_shares_and_the_key(rs: list[int]) -> None:
    world = make_world(rs)
    key = new_key()
    outcome = run(world, key)
    assert outcome.leaves_delivered == math.prod(rs)
    assert outcome.key == key
    assert outcome.culprits == set()


def test_records_carry_lineage_schemes_and_a_verifiable_chain() -> None:
    world = make_world([3, 5])
    top = publisher_split(new_key(), 2, 3, world.publisher, PUB_ID)
    child = resplit(top[1], 3, 5, world.replicas[0][1])[4]
    assert child.lineage == (1, 4)
    assert child.schemes == ((2, 3), (3, 5))
    assert [c.splitter for c in child.certs] == ["publisher", "vn1.r1"]
    assert ChainVerifier(world.path).record_problem(child) is None
    assert unpack_record(pack_record(child)) == child


def test_a_parsed_certificate_equals_and_hashes_like_the_one_packed() -> None:
    # Parsing builds certificates without the dataclass __init__: they must still be
    # interchangeable with the originals as dictionary keys (verifier caches, link ids).
    world = make_world([3, 5])
    top = publisher_split(new_key(), 2, 3, world.publisher, PUB_ID)
    child = resplit(top[1], 3, 5, world.replicas[0][1])[4]
    parsed = unpack_record(pack_record(child))
    for original, copy in zip(child.certs, parsed.certs, strict=True):
        assert copy == original
        assert hash(copy) == hash(original)
        assert copy.signed_bytes() == original.signed_bytes()
        assert copy.statement == original.statement
    assert parsed.with_cert(child.certs[-1]) == child


@pytest.mark.parametrize("garbage", [b"", b"\x93\x01\x02\x03", pack_record.__doc__.encode()])
def test_unpack_rejects_malformed_records(garbage: bytes) -> None:
    with pytest.raises(PropagationError):
        unpack_record(garbage)


def test_a_certificate_heavier_than_any_honest_one_is_refused_as_malformed() -> None:
    """Parsed certificates are cached by count (process-wide): one of megabytes (a huge
    proof or commitment list) made each cached entry cost that much."""
    world = make_world([3, 5])
    top = publisher_split(new_key(), 2, 3, world.publisher, PUB_ID)
    child = resplit(top[1], 3, 5, world.replicas[0][1])[4]
    assert len(pack_record(child)) < MAX_CERT_BYTES  # an honest chain parses
    heavy = dataclasses.replace(child.certs[-1], proof=(bytes(32),) * 4096)
    with pytest.raises(PropagationError, match="at most 8192"):
        unpack_record(pack_record(child.with_cert(heavy)))


def test_publisher_split_refuses_a_threshold_other_than_f_plus_1() -> None:
    with pytest.raises(PropagationError, match="threshold_for"):
        publisher_split(new_key(), 1, 3, _signer("publisher"), PUB_ID)


BYZANTINE_PATHS = [[3], [5], [3, 5], [5, 3, 1], [3, 3, 3, 3], [5, 1, 5]]


@pytest.mark.parametrize("mode", [*MODES, "mixed"])
@pytest.mark.parametrize("rs", BYZANTINE_PATHS, ids=lambda rs: "-".join(map(str, rs)))
def test_up_to_f_byzantine_per_vn_cannot_stop_delivery_and_are_named_exactly(
    rs: list[int], mode: str
) -> None:
    for seed in range(4 if mode == "mixed" else 1):
        modes = list(MODES) if mode == "mixed" else [mode]
        world = with_byzantine(make_world(rs), [threshold_for(r) - 1 for r in rs], modes, seed)
        key = new_key()
        outcome = run(world, key)
        assert outcome.key == key
        sealed = seal(key, PUB_ID, ATTRS, b"payload")
        assert open_sealed(outcome.key, PUB_ID, ATTRS, sealed) == b"payload"
        assert outcome.culprits <= set(world.byzantine), "an honest broker was blamed"
        assert outcome.culprits == expected_culprits(world)


def test_equivocation_blame_carries_two_validly_signed_certificates() -> None:
    world = make_world([3, 3], {"vn1.r0": "equivocate"})
    outcome = run(world, new_key())
    [blame] = [b for b in outcome.subscriber_blame if b.fault is Fault.EQUIVOCATION]
    assert blame.broker == "vn1.r0"
    assert len(blame.evidence) >= 2
    verifier = ChainVerifier(world.path)
    assert all(verifier.cert_problem(c, PUB_ID, (0,)) is None for c in blame.evidence)


@pytest.mark.parametrize(
    ("mode", "fault"),
    [
        ("corrupt", Fault.BAD_SHARE),
        ("drop", Fault.SILENT),
        ("wrong_secret", Fault.WRONG_SECRET),
        ("inconsistent", Fault.INCONSISTENT_SPLIT),
    ],
)
def test_each_fault_is_reported_under_its_own_name(mode: str, fault: Fault) -> None:
    world = make_world([5, 3], {"vn1.r2": mode})
    outcome = run(world, new_key())
    faults = {b.fault for b in (*outcome.subscriber_blame, *outcome.broker_blame)}
    assert fault in faults
    assert outcome.culprits == {"vn1.r2"}


def test_a_share_from_a_broker_that_does_not_hold_it_is_blamed_on_the_sender() -> None:
    world = make_world([3])
    records = publisher_split(new_key(), 2, 3, world.publisher, PUB_ID)
    deliveries = [("vn1.r0", records[0]), ("vn1.r1", records[2]), ("vn1.r2", records[2])]
    result = reconstruct(deliveries, world.path, PUB_ID)
    assert [(b.broker, b.fault) for b in result.blame] == [("vn1.r1", Fault.WRONG_SENDER)]
    assert result.key is not None


def test_inbox_blames_the_sender_of_a_share_meant_for_another_replica() -> None:
    world = make_world([3])
    records = publisher_split(new_key(), 2, 3, world.publisher, PUB_ID)
    inbox = ShareInbox(world.path, PUB_ID, 1, 0)
    assert inbox.offer(records[0], "publisher")
    assert not inbox.offer(records[0], "publisher")
    assert not inbox.offer(records[1], "publisher")
    assert [(b.broker, b.fault) for b in inbox.blames] == [("publisher", Fault.WRONG_SENDER)]


def _pooled_reconstruction(world: World, outcome: Outcome) -> bytes | None:
    """Everything colluders can compute from what they saw and made."""
    return coalition_key((*outcome.seen_by_byzantine, *outcome.made_by_byzantine))


COLLUSION_PATHS = [[3], [5, 3], [3, 5, 3], [5, 5, 1, 3], [3, 3, 3, 3]]


@pytest.mark.parametrize("rs", COLLUSION_PATHS, ids=lambda rs: "-".join(map(str, rs)))
def test_f_colluders_per_vn_pooling_everything_never_learn_the_key(rs: list[int]) -> None:
    for seed in range(3):
        world = with_byzantine(
            make_world(rs), [threshold_for(r) - 1 for r in rs], ["curious"], seed
        )
        key = new_key()
        outcome = run(world, key)
        assert outcome.key == key
        assert _pooled_reconstruction(world, outcome) is None


@pytest.mark.parametrize("rs", COLLUSION_PATHS[1:], ids=lambda rs: "-".join(map(str, rs)))
def test_f_plus_1_colluders_in_one_vn_do_learn_the_key(rs: list[int]) -> None:
    """Control for the test above: the pooled attack works once one VN has a majority."""
    for level in range(len(rs)):
        if confidentiality_free(rs[level]):
            continue
        per_vn = [threshold_for(r) - 1 for r in rs]
        per_vn[level] += 1
        world = with_byzantine(make_world(rs), per_vn, ["curious"], level)
        key = new_key()
        assert _pooled_reconstruction(world, run(world, key)) == key


def test_key_check_rejects_a_candidate_that_does_not_open_the_payload() -> None:
    world = make_world([3, 3])
    key = new_key()
    sealed = seal(key, PUB_ID, ATTRS, b"payload")

    def opens(candidate: bytes) -> bool:
        try:
            open_sealed(candidate, PUB_ID, ATTRS, sealed)
        except DecryptionError:
            return False
        return True

    outcome = run(world, key)
    assert outcome.key == key
    deliveries = [(world.path.holder(r.lineage).id, r) for r in _honest_leaves(world, new_key())]
    assert reconstruct(deliveries, world.path, PUB_ID, check=opens).key is None


def _honest_leaves(world: World, key: bytes) -> list[ShareRecord]:
    records = publisher_split(key, 2, 3, world.publisher, PUB_ID)
    return [
        leaf for rec in records for leaf in resplit(rec, 2, 3, world.replicas[0][rec.lineage[-1]])
    ]


def test_a_valid_share_replayed_from_another_publication_is_blamed_on_its_sender() -> None:
    """Otherwise its certificate would pass for a second version of the same split, framing the
    honest splitter as an equivocator."""
    world = make_world([3])
    ours = publisher_split(new_key(), 2, 3, world.publisher, PUB_ID)
    other = publisher_split(new_key(), 2, 3, world.publisher, b"publisher-1:8")
    deliveries = [("vn1.r0", ours[0]), ("vn1.r1", ours[1]), ("vn1.r2", other[2])]
    result = reconstruct(deliveries, world.path, PUB_ID, complete=True)
    assert result.key is not None
    assert [(b.broker, b.fault) for b in result.blame] == [("vn1.r2", Fault.BAD_SHARE)]
    inbox = ShareInbox(world.path, PUB_ID, 1, 2)
    assert not inbox.offer(other[2], "publisher")
    assert [b.fault for b in inbox.blames] == [Fault.BAD_SHARE]


# -- amortised signatures: Merkle batches, the seal cache, vouching ----------------------------

_leaf_bytes = st.binary(min_size=32, max_size=32)


@settings(max_examples=200, deadline=None)
@given(st.lists(_leaf_bytes, min_size=1, max_size=70))
def test_every_leaf_of_a_batch_folds_to_its_root(leaves: list[bytes]) -> None:
    root, proofs = merkle_tree(leaves)
    for position, (leaf, proof) in enumerate(zip(leaves, proofs, strict=True)):
        assert merkle_fold(leaf, position, len(leaves), proof) == root


@settings(max_examples=200, deadline=None)
@given(st.lists(_leaf_bytes, min_size=2, max_size=70, unique=True), st.data())
def test_a_leaf_proven_with_another_leaf_position_or_path_misses_the_root(
    leaves: list[bytes], data: st.DataObject
) -> None:
    root, proofs = merkle_tree(leaves)
    count = len(leaves)
    i = data.draw(st.integers(0, count - 1))
    j = data.draw(st.integers(0, count - 1).filter(lambda j: j != i))
    assert merkle_fold(leaves[j], i, count, proofs[i]) != root
    assert merkle_fold(leaves[i], j, count, proofs[i]) != root
    if proofs[i]:
        k = data.draw(st.integers(0, len(proofs[i]) - 1))
        bent = list(proofs[i])
        bent[k] = bytes(b ^ 1 for b in bent[k])
        assert merkle_fold(leaves[i], i, count, bent) != root
        assert merkle_fold(leaves[i], i, count, proofs[i][:-1]) != root
    assert merkle_fold(leaves[i], i, count, (*proofs[i], root)) is None
    assert merkle_fold(leaves[i], count, count, proofs[i]) is None


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.sampled_from([1, 3, 5]))
def test_a_batch_of_splits_costs_one_signature_and_each_verifies(splits: int, r: int) -> None:
    world = make_world([3, r])
    holder = world.replicas[0][1]
    batch = CertBatch(holder)
    outgoing = []
    for n in range(splits):
        pub_id = f"publisher/{n}".encode()
        top = publisher_split(new_key(), 2, 3, world.publisher, pub_id)
        outgoing.append((pub_id, batch.split(top[1], threshold_for(r), r)))
    sealed = batch.seal()
    assert batch.signatures == 1
    assert len(sealed) == splits
    assert len(batch) == 0
    assert len({cert.signature for cert in sealed.values()}) == 1
    for pub_id, subs in outgoing:
        cert = sealed[subs[0].certs[-1]]
        for sub in subs:
            record = dataclasses.replace(sub, certs=(*sub.certs[:-1], cert))
            assert ChainVerifier(world.path).record_problem(record, pub_id) is None
            # and the statement as sent, unsealed, does not
            assert ChainVerifier(world.path).record_problem(sub, pub_id) is not None


def test_a_batch_root_is_verified_once_per_cache_and_a_forgery_never_enters_it() -> None:
    world = make_world([3, 3])
    batch = CertBatch(world.replicas[0][0])
    records = [
        publisher_split(new_key(), 2, 3, world.publisher, f"publisher/{n}".encode())[0]
        for n in range(5)
    ]
    subs = [batch.split(record, 2, 3) for record in records]
    sealed = batch.seal()
    cache = SealCache()
    for split in subs:
        cert = sealed[split[0].certs[-1]]
        assert ChainVerifier(world.path, cache=cache).seal_ok(cert)
    assert cache.verified == 1  # five certificates, one root, one Ed25519 verification
    forged = dataclasses.replace(
        sealed[subs[0][0].certs[-1]], signature=bytes(64), commitments=(bytes(32),) * 3
    )
    for _ in range(2):
        assert not ChainVerifier(world.path, cache=cache).seal_ok(forged)
    assert cache.verified == 3, "a failed verification is never cached as good"


def _with_bad_upper_seal(world: World) -> list[ShareRecord]:
    """vn1.r0 vouches (signs below) for a publisher certificate whose seal is garbage."""
    top = publisher_split(new_key(), 2, 3, world.publisher, PUB_ID)
    broken = dataclasses.replace(top[0].certs[0], signature=bytes(64))
    bad_top = dataclasses.replace(top[0], certs=(broken,))
    return resplit(bad_top, 2, 3, world.replicas[0][0])


def test_a_broker_trusts_what_its_sender_vouched_for_and_an_audit_blames_the_voucher() -> None:
    world = make_world([3, 3])
    children = _with_bad_upper_seal(world)
    inbox = ShareInbox(world.path, PUB_ID, 2, 1)
    assert inbox.offer(children[1], "vn1.r0")  # checks vn1.r0's own seal only
    fault = ChainVerifier(world.path).record_fault(children[1], PUB_ID)
    assert fault is not None
    assert fault[1] == "vn1.r0"
    result = reconstruct([("vn2.r1", children[1])], world.path, PUB_ID)
    assert [(b.broker, b.fault) for b in result.blame] == [("vn1.r0", Fault.BAD_SHARE)]


def test_a_broken_own_seal_is_blamed_first_hand_and_only_set_aside_in_an_audit() -> None:
    """The broker that receives a split from its splitter names it (its own certificate,
    over an authenticated link); a subscriber, sent the record by a holder that relays
    without checking every seal, cannot tell the holder's forgery from the splitter's:
    it sets the record aside and names nobody, and still recovers the key from the rest."""
    world = make_world([3, 3])
    key = new_key()
    top = publisher_split(key, 2, 3, world.publisher, PUB_ID)
    children = resplit(top[0], 2, 3, world.replicas[0][0])
    cert = children[1].certs[-1]
    forged = dataclasses.replace(children[1], certs=(top[0].certs[0], replace_seal(cert)))
    inbox = ShareInbox(world.path, PUB_ID, 2, 1)
    assert not inbox.offer(forged, "vn1.r0")
    assert [(b.broker, b.fault) for b in inbox.blames] == [("vn1.r0", Fault.BAD_SHARE)]
    result = reconstruct([("vn2.r1", forged)], world.path, PUB_ID)
    assert result.blame == ()
    honest = [(world.path.holder(r.lineage).id, r) for r in _honest_leaves(world, key)]
    forged_leaf = next(r for _, r in honest if r.lineage == (0, 1))
    bent = dataclasses.replace(
        forged_leaf, certs=(*forged_leaf.certs[:-1], replace_seal(forged_leaf.certs[-1]))
    )
    deliveries = [(s, bent if r is forged_leaf else r) for s, r in honest]
    audited = reconstruct(deliveries, world.path, PUB_ID, complete=True)
    assert audited.key == key
    assert audited.blame == ()


def replace_seal(cert: SplitCert) -> SplitCert:
    return dataclasses.replace(cert, signature=bytes(b ^ 0xFF for b in cert.signature))


def test_the_quick_pass_finds_the_key_without_any_signature_check() -> None:
    world = make_world([3, 3])
    key = new_key()
    deliveries = [(world.path.holder(r.lineage).id, r) for r in _honest_leaves(world, key)]
    cache = SealCache()
    quick = ChainVerifier(world.path, seals="none", cache=cache)
    assert reconstruct(deliveries, world.path, PUB_ID, verifier=quick).key == key
    assert cache.verified == 0
