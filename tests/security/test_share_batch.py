"""SHARES frames: a pass's records for one receiver, each certificate carried once per frame.

The batch form must give back exactly the records that went in (so verification and blame
see what a SHARE frame would have carried), spend one table slot per distinct certificate,
stay within a frame's size by splitting large passes, and confine a garbled certificate to
the entries that name it.
"""

from __future__ import annotations

import msgpack

from security.envelope import Signer, new_key
from security.propagation import (
    BATCH_RECORDS,
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
    frames = pack_batch(items)
    assert [len(entries) for _, entries in frames] == [BATCH_RECORDS, 3]
    again = [got for frame in frames for got in unpack_batch(*frame)]
    assert again == items


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
