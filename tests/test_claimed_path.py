"""Which path a publication's key shares travelled, read from their signed certificates.

Live reconfiguration moves links, so verifiers cannot take the path from the manifest's
tree; a share names the replica that signed each split, and a verifier adopts a path only
when a majority of the sending VN vouches for it.
"""

from __future__ import annotations

from types import SimpleNamespace

from broker.confidential import PathVote, claimed_path
from overlay.manifest import Manifest
from overlay.tree import line_tree

VNS = ("a", "b", "c", "d")
MANIFEST = Manifest(
    line_tree(VNS),
    {vn: tuple(f"{vn}.{i}" for i in range(3)) for vn in VNS},
    {f"{vn}.{i}": bytes(32) for vn in VNS for i in range(3)},
)
SEC = {"vn": "a"}


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
