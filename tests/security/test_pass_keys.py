"""A subscriber's keys from shares by the pass (security/pass_keys.py) when a move sends an
epoch's shares along an old and a new path at once: the key comes back, each path is
complete on its own leaves, and no honest broker is named."""

from __future__ import annotations

import os

import pytest

from overlay.manifest import Manifest
from overlay.tree import line_tree
from security.envelope import Signer, generate_signing_key, public_key_to_bytes
from security.pass_keys import PassKeys
from security.pass_shares import Held, PassStatement, leaf_batches, open_pass, root_holdings
from security.pass_shares import split_pass as split_statement
from security.paths import KeyAssembly
from security.publication import SecBlock, publication_id

SIZES = {"a": 3, "b": 3, "c": 3, "d": 1}
OLD, NEW = ("a", "b", "c", "d"), ("a", "c", "d")


class Split:
    """The line a - b - c - d (the subscriber at d) while c moves next to a: what every
    replica holds after the splits made so far, and every statement signed."""

    def __init__(self) -> None:
        names = [f"{vn}.{i}" for vn, r in SIZES.items() for i in range(r)]
        keys = {name: generate_signing_key() for name in names}
        publisher = generate_signing_key()
        self.signers = {name: Signer(name, key) for name, key in keys.items()}
        self.signers["pub"] = Signer("pub", publisher)
        self.manifest = Manifest(
            line_tree(SIZES),
            {vn: tuple(f"{vn}.{i}" for i in range(r)) for vn, r in SIZES.items()},
            {name: public_key_to_bytes(key.public_key()) for name, key in keys.items()},
        )
        self.sec = SecBlock(
            pk=public_key_to_bytes(publisher.public_key()), sig=b"", vn="a", epoch=1
        )
        self.secret = os.urandom(32)
        self.held: dict[str, list[Held]] = {name: [] for name in names}
        self.under: dict[str, dict[bytes, PassStatement]] = {name: {} for name in names}
        self.statements: list[PassStatement] = []
        self.split("pub", "a", root_holdings([(publication_id("pub", 1), self.secret)]))

    def split(self, splitter: str, toward: str, shares: list[Held]) -> None:
        statement, blobs = split_statement(
            self.signers[splitter], toward, 0, SIZES[toward], list(shares)
        )
        self.statements.append(statement)
        for j, blob in enumerate(blobs):
            got, bad = open_pass(statement, blob, j)
            assert not bad
            self.held[f"{toward}.{j}"] += got
            self.under[f"{toward}.{j}"][statement.ref] = statement

    def relay(self, vn: str, toward: str) -> None:
        """Every replica of ``vn`` splits what it holds toward ``toward`` in one pass."""
        for j in range(SIZES[vn]):
            self.split(f"{vn}.{j}", toward, self.held[f"{vn}.{j}"])

    def subscriber(self) -> tuple[PassKeys, KeyAssembly]:
        """A subscriber's leaves and keys, and the epoch's assembly."""
        passes = PassKeys()
        keys = KeyAssembly("pub", 1, sec=self.sec)
        keys.passes = passes
        return passes, keys

    def hand(self, passes: PassKeys, depth: int, dropped: str | None = None) -> None:
        """d.0 hands the subscriber its leaves of the path ``depth`` VNs long (the leaves of
        the replica ``dropped`` of c left out), every statement with them."""
        leaves = [
            leaf
            for leaf in self.held["d.0"]
            if len(leaf.lineage) == depth
            and (dropped is None or leaf.lineage[-2] != int(dropped[2:]))
        ]
        raw = [(s.raw, s.signature) for s in self.statements]
        batches = [(b.ref, b.positions, b.blob) for b in leaf_batches(leaves, self.under["d.0"])]
        passes.add("d.0", raw, batches)


@pytest.mark.parametrize("audit", [False, True])
def test_an_epoch_split_along_an_old_and_a_new_path_gives_its_key_and_names_nobody(
    audit: bool,
) -> None:
    """Every edge replica split its share toward b before the move and toward c after it
    (a hop new to the epoch gets every share held); c's replicas split what came both ways
    toward d in one statement each. The long path's leaves come first, all but those of
    c.2: enough for the key, not complete. Then the short path's nine: the two together
    are as many as the long path needs, but neither path is complete on the other's
    leaves, and no split is short or twice made."""
    world = Split()
    world.relay("a", "b")
    world.relay("a", "c")
    world.relay("b", "c")
    world.relay("c", "d")
    passes, keys = world.subscriber()
    world.hand(passes, len(OLD), dropped="c.2")
    passes.recover(keys, world.manifest, "d", audit=audit)
    assert keys.key == world.secret
    world.hand(passes, len(NEW))
    passes.recover(keys, world.manifest, "d", audit=audit)
    passes.recover(keys, world.manifest, "d", audit=True)
    passes.audit_late(keys)
    assert keys.key == world.secret
    assert keys.culprits == frozenset()


def test_an_epoch_whose_old_path_is_incomplete_comes_back_along_the_new_one() -> None:
    """Only a.0 split toward b before the move; after it, every edge replica (a.0 again)
    splits toward c. The old path never holds enough; the new one does, with no blame."""
    world = Split()
    world.split("a.0", "b", world.held["a.0"])
    world.relay("b", "c")
    world.relay("a", "c")
    world.relay("c", "d")
    passes, keys = world.subscriber()
    world.hand(passes, len(OLD))
    passes.recover(keys, world.manifest, "d", audit=True)
    assert keys.key is None
    world.hand(passes, len(NEW))
    passes.recover(keys, world.manifest, "d", audit=True)
    passes.audit_late(keys)
    assert keys.key == world.secret
    assert keys.culprits == frozenset()
