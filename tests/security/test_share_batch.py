"""SHARES frames: a pass's records for one receiver, each certificate carried once per link.

The batch form must give back exactly the records that went in (so verification and blame
see what a SHARE frame would have carried), send a certificate once per link and name it by
id afterwards, stay within a frame's size by splitting large passes, start over on a new
connection, and confine a garbled or unknown certificate to the entries that name it.
"""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from security.envelope import Signer, new_key
from security.propagation import (
    BATCH_RECORDS,
    CERT_WINDOW,
    LinkCertsIn,
    LinkCertsOut,
    PropagationError,
    ShareRecord,
    pack_batch,
    publisher_split,
    resplit,
    unpack_batch,
)

PUBLISHER = Signer.generate("pub")
RELAY = Signer.generate("b0.0")


def _level2(pubs: int) -> list[tuple[str, int, ShareRecord]]:
    """What replica 0 of the edge VN sends replica 1 of the next VN for ``pubs`` keys."""
    items = []
    for seq in range(1, pubs + 1):
        top = publisher_split(new_key(), 2, 3, PUBLISHER, f"pub/{seq}".encode())
        items.append(("pub", seq, resplit(top[0], 2, 3, RELAY)[1]))
    return items


def test_a_batch_gives_back_exactly_the_records_that_went_in() -> None:
    items = _level2(5)
    (frame,) = pack_batch(items)
    assert unpack_batch(*frame) == items


def test_each_certificate_travels_once_per_frame() -> None:
    top = publisher_split(new_key(), 2, 3, PUBLISHER, b"pub/1")
    # Three sub-shares of one split share the root certificate and the split's own.
    items = [("pub", 1, sub) for sub in resplit(top[0], 2, 3, RELAY)]
    ((certs, entries),) = pack_batch(items)
    assert len(certs) == 2
    assert [e[4] for e in entries] == [(0, 1)] * 3


def test_a_large_pass_is_split_into_frames_of_bounded_size() -> None:
    items = _level2(BATCH_RECORDS + 3)
    frames = LinkCertsOut().frames(items)
    assert [len(entries) for _, _, entries in frames] == [BATCH_RECORDS, 3]
    receiver = LinkCertsIn()
    again = [got for frame in frames for got in receiver.unpack(*frame)]
    assert again == items


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(600, 20_000))
def test_every_frame_stays_within_its_byte_budget_unless_it_holds_one_record(
    pubs: int, budget: int
) -> None:
    """With many replicas per VN (here 2 of 3 at two levels, and a small budget standing
    for a small ``max_frame``) a record's certificates weigh kilobytes: frames were cut by
    count only until 2026-11-29 (a 128-record frame could exceed the frame limit)."""
    items = _level2(pubs)
    frames = LinkCertsOut().frames(items, budget)
    for base, certs, entries in frames:
        if len(entries) > 1:
            assert len(msgpack.packb([base, certs, entries], use_bin_type=True)) <= budget
    receiver = LinkCertsIn()
    assert [got for frame in frames for got in receiver.unpack(*frame)] == items


def test_a_certificate_the_link_carried_is_named_by_id_in_later_frames() -> None:
    top = publisher_split(new_key(), 2, 3, PUBLISHER, b"pub/1")
    first = [("pub", 1, sub) for sub in resplit(top[0], 2, 3, RELAY)]
    second = [("pub", 1, sub) for sub in resplit(top[1], 2, 3, Signer.generate("b0.1"))]
    sender, receiver = LinkCertsOut(), LinkCertsIn()
    ((base1, certs1, entries1),) = sender.frames(first[:1])
    ((base2, certs2, entries2),) = sender.frames(second[:1])
    assert (base1, len(certs1)) == (0, 2)
    assert (base2, len(certs2)) == (2, 1)  # the root certificate is not sent again
    assert entries2[0][4] == (0, 2)
    assert receiver.unpack(base1, certs1, entries1) == first[:1]
    assert receiver.unpack(base2, certs2, entries2) == second[:1]


def test_a_new_connection_starts_the_numbering_over() -> None:
    items = _level2(2)
    receiver = LinkCertsIn()
    for _ in range(2):  # the same receiver state, two connections in turn
        ((base, certs, entries),) = LinkCertsOut().frames(items)
        assert base == 0
        assert receiver.unpack(base, certs, entries) == items


def test_a_sender_numbering_its_certificates_downwards_cannot_grow_the_table() -> None:
    """Only ids near the newest carried are kept: a sender sending frames with ever
    smaller bases (no honest one does) kept every certificate it sent until 2026-11-29."""
    ((_, certs, _),) = LinkCertsOut().frames(_level2(1))
    receiver = LinkCertsIn()
    base = 1 << 40
    for _ in range(20 * CERT_WINDOW // len(certs)):
        receiver.unpack(base, certs, [])
        base -= len(certs)
    assert len(receiver._table) <= 3 * CERT_WINDOW + len(certs)


def test_an_id_the_link_never_carried_spoils_only_its_entry() -> None:
    items = _level2(2)
    ((base, certs, entries),) = LinkCertsOut().frames(items)
    publisher, seq, pub_id, lineage, _, salt, data = entries[0]
    forged = (publisher, seq, pub_id, lineage, (0, 99), salt, data)
    got = LinkCertsIn().unpack(base, certs, [forged, entries[1]])
    assert isinstance(got[0][2], PropagationError)
    assert got[1] == items[1]


def test_a_garbled_certificate_spoils_only_the_entries_that_name_it() -> None:
    items = _level2(2)
    ((certs, entries),) = pack_batch(items)
    bad = certs.index(next(c for c in certs if msgpack.unpackb(c)[1] == [0]))  # pub/1's b0 cert
    certs = [*certs]
    certs[bad] = b"\xc1"  # never valid msgpack
    got = unpack_batch(certs, entries)
    assert isinstance(got[0][2], PropagationError)
    assert got[1] == items[1]


def test_a_certificate_index_out_of_range_is_an_error_not_a_crash() -> None:
    ((certs, entries),) = pack_batch(_level2(1))
    publisher, seq, pub_id, lineage, _, salt, data = entries[0]
    got = unpack_batch(certs, [(publisher, seq, pub_id, lineage, (0, 9), salt, data)])
    assert isinstance(got[0][2], PropagationError)
