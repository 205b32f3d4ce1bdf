"""The publication that opens a key epoch and the root split of its key share one signature.

An edge replica used to verify two publisher signatures per confidential publication (the
content and the root split's seal); they are now two leaves of one sealed batch, so the
second check is a cache hit. These tests prove the merged seal still binds everything the
two signatures bound, and that the cache really spares the second verification.
"""

from __future__ import annotations

from dataclasses import replace

from security.envelope import Signer, publication_digest
from security.propagation import (
    ChainVerifier,
    Member,
    PathView,
    Seal,
    SealCache,
    pack_record,
    seal_batch,
    statement_sealed,
    unpack_record,
)
from security.publication import (
    SIGNED_TOGETHER,
    EpochKey,
    SecBlock,
    publication_id,
    sign_pass,
    signature_valid,
    signed_id,
)

ATTRS = {"class": "stock", "symbol": "ACME"}
PUBLISHER = Signer.generate("pub-1")


def _opening(seq: int = 7) -> tuple[EpochKey, bytes, SecBlock]:
    epoch = EpochKey.start(PUBLISHER, seq, "b0", 3)
    sealed, sec = epoch.seal(PUBLISHER, seq, ATTRS, b"payload")
    return epoch, sealed, sec


def test_an_epochs_first_publication_is_sealed_with_its_root_split_under_one_signature() -> None:
    epoch, sealed, sec = _opening()
    assert sec.seal is not None
    assert len(epoch.records) == 3
    root = epoch.records[0].certs[0]
    assert root.signature == sec.sig
    assert root.count == 2 == sec.seal[1]
    assert signature_valid("pub-1", 7, ATTRS, sealed, sec)


def test_the_merged_seal_binds_content_id_vn_epoch_and_publisher() -> None:
    _, sealed, sec = _opening()
    assert not signature_valid("pub-1", 8, ATTRS, sealed, sec)
    assert not signature_valid("pub-2", 7, ATTRS, sealed, sec)
    assert not signature_valid("pub-1", 7, {**ATTRS, "symbol": "EVIL"}, sealed, sec)
    assert not signature_valid("pub-1", 7, ATTRS, sealed + b"\x00", sec)
    assert not signature_valid("pub-1", 7, ATTRS, sealed, replace(sec, vn="b1"))
    assert not signature_valid("pub-1", 7, ATTRS, sealed, replace(sec, epoch=6))
    other = Signer.generate("pub-1")
    assert not signature_valid(
        "pub-1", 7, ATTRS, sealed, replace(sec, pk=other.public_key.public_bytes_raw())
    )


def test_a_root_certificate_cannot_pass_for_the_publication_nor_a_wrong_position() -> None:
    _, sealed, sec = _opening()
    assert sec.seal is not None
    position, count, proof = sec.seal
    # The certificate's leaf sits at position 0: the content's path does not lead there.
    assert not signature_valid("pub-1", 7, ATTRS, sealed, replace(sec, seal=(0, count, proof)))
    assert not signature_valid("pub-1", 7, ATTRS, sealed, replace(sec, seal=(position, 3, proof)))
    assert not signature_valid("pub-1", 7, ATTRS, sealed, replace(sec, seal=(position, count, ())))


def test_later_publications_of_an_epoch_carry_a_plain_signature() -> None:
    epoch, _, _ = _opening()
    sealed, sec = epoch.seal(PUBLISHER, 8, ATTRS, b"next")
    assert sec.seal is None
    assert sec.epoch == 7
    assert signature_valid("pub-1", 8, ATTRS, sealed, sec)
    assert not signature_valid("pub-1", 8, {"class": "other"}, sealed, sec)


def test_the_edge_replica_verifies_one_signature_for_content_and_root_share() -> None:
    _, sealed, sec = _opening()
    cache = SealCache()
    key = PUBLISHER.public_key
    position, count, proof = sec.seal or (0, 1, ())
    statement = publication_digest(signed_id("pub-1", 7, "b0", 7), ATTRS, sealed)
    assert statement_sealed(key, "pub-1", statement, Seal(sec.sig, position, count, proof), cache)
    assert cache.verified == 1
    epoch_records = _opening()[0].records  # another epoch: its own signature
    replicas = tuple(Member(f"b0.{i}", Signer.generate(f"b0.{i}").public_key) for i in range(3))
    view = PathView(Member("pub-1", key), (replicas,))
    verifier = ChainVerifier(view, seals="last", cache=cache)
    epoch, sealed, sec = _opening(seq=9)
    position, count, proof = sec.seal or (0, 1, ())
    statement = publication_digest(signed_id("pub-1", 9, "b0", 9), ATTRS, sealed)
    assert statement_sealed(key, "pub-1", statement, Seal(sec.sig, position, count, proof), cache)
    before = cache.verified
    record = unpack_record(pack_record(epoch.records[1]))
    assert verifier.record_problem(record, publication_id("pub-1", 9)) is None
    assert cache.verified == before  # the root split's seal was the content's: no new check
    assert verifier.record_problem(epoch_records[0], publication_id("pub-1", 9)) is not None


def test_seal_batch_gives_every_extra_statement_a_path_to_the_signed_root() -> None:
    statements = [b"one", b"two", b"three"]
    _, seals = seal_batch([], PUBLISHER, statements)
    cache = SealCache()
    key = PUBLISHER.public_key
    for statement, seal in zip(statements, seals, strict=True):
        assert statement_sealed(key, "pub-1", statement, seal, cache)
        assert not statement_sealed(key, "pub-1", statement + b"!", seal, cache)
        assert not statement_sealed(key, "pub-2", statement, seal, cache)
    assert cache.verified == 1 + 3 + 3  # the root once; each forgery tried and refused


def test_a_pass_of_publications_and_the_root_splits_they_open_share_one_signature() -> None:
    first = EpochKey.start(PUBLISHER, 20, "b0", 3)
    pending = [first.prepare(PUBLISHER, 20, ATTRS, b"a"), first.prepare(PUBLISHER, 21, ATTRS, b"b")]
    second = EpochKey.start(PUBLISHER, 22, "b0", 3)
    pending.append(second.prepare(PUBLISHER, 22, ATTRS, b"c"))
    assert [p.opens for p in pending] == [True, False, True]
    secs = sign_pass(PUBLISHER, pending)
    assert len({sec.sig for sec in secs}) == 1
    cache = SealCache()
    key = PUBLISHER.public_key
    for seq, p, sec in zip((20, 21, 22), pending, secs, strict=True):
        assert sec.seal is not None
        assert sec.epoch == (22 if seq == 22 else 20)
        assert signature_valid("pub-1", seq, ATTRS, p.sealed, sec)
        position, count, proof = sec.seal
        assert statement_sealed(
            key, "pub-1", p.statement, Seal(sec.sig, position, count, proof), cache
        )
    assert cache.verified == 1
    replicas = tuple(Member(f"b0.{i}", Signer.generate(f"b0.{i}").public_key) for i in range(3))
    verifier = ChainVerifier(PathView(Member("pub-1", key), (replicas,)), seals="last", cache=cache)
    for epoch, seq in ((first, 20), (second, 22)):
        assert len(epoch.records) == 3
        for record in epoch.records:
            assert verifier.record_problem(record, publication_id("pub-1", seq)) is None
    assert cache.verified == 1  # both root splits were in the verified batch
    # A publication of the pass cannot be moved to another seq or epoch.
    assert not signature_valid("pub-1", 21, ATTRS, pending[2].sealed, secs[2])
    assert not signature_valid("pub-1", 21, ATTRS, pending[1].sealed, replace(secs[1], epoch=22))


def test_a_long_pass_is_signed_in_bounded_batches_so_merkle_paths_stay_short() -> None:
    epoch = EpochKey.start(PUBLISHER, 100, "b0", 3)
    n = 3 * SIGNED_TOGETHER + 1
    pending = [epoch.prepare(PUBLISHER, 100 + i, ATTRS, b"x") for i in range(n)]
    secs = sign_pass(PUBLISHER, pending)
    assert len({sec.sig for sec in secs}) == 4
    assert max(len(sec.seal[2]) for sec in secs if sec.seal is not None) <= 4
    for i, (p, sec) in enumerate(zip(pending, secs, strict=True)):
        assert signature_valid("pub-1", 100 + i, ATTRS, p.sealed, sec)
