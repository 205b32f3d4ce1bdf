"""What the share work of a confidential publication would cost with one split and one
certificate per (splitter, next VN, pass): a model, beside the current protocol's.

Not the product's code path: a design study for issue 11's cost goals (SPEC §3, §10), run in
one process like ``pipeline_breakdown`` in ``bench/bench_confidential.py`` (every broker's and
the subscriber's share work in turn, no sockets or event loop), on the same line of three VNs
of three replicas, so the two totals compare. It keeps what makes the current protocol sound
on the honest path and prices it:

* every level shares the parent's opening ``salt || data`` (16-byte salt), and a splitter
  commits to each child opening with SHA-256, as :mod:`security.propagation` does;
* a splitter signs one statement per pass and next VN (Ed25519): the commitments of every
  node it split in the pass, for every publication, with the parent commitments they came
  from; a receiver checks each opening it gets against its commitment (hashing) and the
  sender's signature once per pass before it splits (vouching), as brokers do today;
* all the openings a splitter holds in a pass are split in one :func:`security.shamir.split`
  of their concatenation (byte-wise Shamir splits a concatenation exactly as it splits each
  part), and the child vectors travel as one blob per next replica;
* the subscriber checks every leaf against its commitment, reconstructs level by level with
  one combine per level over the concatenated openings of every node of that level, checks
  every recovered opening against the commitment above it, verifies every signature of the
  pass (the audit), and opens the key with AES-GCM.

What it leaves out, and so what the product would add: the Byzantine path (which child
to leave out when one fails its commitment, blame, silence; it only runs when something is
wrong), path claims and routing of shares per publication, frames and the event loop. So
the model is a lower bound for the honest path, to set against the same bound for today's
protocol (``pipeline_breakdown``, printed beside it).

    .venv/bin/python bench/model_pass_shares.py [--pubs 60]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

import msgpack
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from security import shamir
from security.envelope import Signer

REPLICAS = 3
K = 2
VNS = 3
SALT = 16
PAYLOAD = b"x" * 100
_DOMAIN = b"trellis/share-commitment/v1\x00"


def commit(opening: bytes) -> bytes:
    return hashlib.sha256(_DOMAIN + opening).digest()


class Pass:
    """One splitter's output for one pass toward one next VN: the signed statement and the
    child blob for each next replica (openings of every node, in statement order)."""

    def __init__(self, statement: bytes, signature: bytes, blobs: list[bytes], size: int):
        self.statement = statement
        self.signature = signature
        self.blobs = blobs
        self.size = size  # bytes of one child opening


def split_pass(signer: Signer, nodes: list[tuple[bytes, bytes]], size: int) -> Pass:
    """Split every ``(node id, opening)`` of a pass at once; openings are ``size`` bytes.
    Child openings are ``salt || sub-share`` (``size + SALT`` bytes)."""
    joined = b"".join(opening for _, opening in nodes)
    shares = shamir.split(joined, K, REPLICAS)
    child = size + SALT
    salts = os.urandom(SALT * REPLICAS * len(nodes))
    blobs: list[bytes] = []
    commits: list[list[bytes]] = [[] for _ in nodes]
    for j, share in enumerate(shares):
        parts = []
        data = share.data
        for n in range(len(nodes)):
            at = (j * len(nodes) + n) * SALT
            opening = salts[at : at + SALT] + data[n * size : (n + 1) * size]
            parts.append(opening)
            commits[n].append(commit(opening))
        blobs.append(b"".join(parts))
    statement = msgpack.packb(
        [
            signer.id,
            [[node, commit(opening), c] for (node, opening), c in zip(nodes, commits, strict=True)],
        ],
        use_bin_type=True,
    )
    return Pass(statement, signer.sign(statement), blobs, child)


def receive(pss: Pass, replica: int, key: object, check_seal: bool) -> list[tuple[bytes, bytes]]:
    """A replica's checks on what one splitter sent it: every opening against the
    commitment for this replica (hashing), the seal once per pass when it will vouch."""
    _, entries = msgpack.unpackb(pss.statement, raw=False)
    if check_seal:
        key.verify(pss.signature, pss.statement)  # type: ignore[attr-defined]
    blob, size = pss.blobs[replica], pss.size
    held = []
    for n, (node, _parent, commits) in enumerate(entries):
        opening = blob[n * size : (n + 1) * size]
        if commit(opening) != commits[replica]:
            raise AssertionError("bad opening")
        held.append((node + bytes([replica]), opening))
    return held


def pipeline(count: int, signers: dict[str, Signer], *, tamper: bool = False) -> None:
    """One pass of ``count`` publications through b0 - b1 - b2 to one subscriber."""
    publisher = signers["pub"]
    keys = {name: s.public_key for name, s in signers.items()}
    # Publisher: a fresh key per publication, the roots split in one pass.
    roots = [(os.urandom(8), os.urandom(32)) for _ in range(count)]
    sealed = []
    for pub_id, key in roots:
        nonce = os.urandom(12)
        sealed.append((nonce, AESGCM(key).encrypt(nonce, PAYLOAD, pub_id)))
    first = split_pass(publisher, roots, 32)
    inbound: dict[int, list[tuple[str, Pass]]] = {j: [("pub", first)] for j in range(REPLICAS)}
    passes: list[tuple[str, Pass]] = [("pub", first)]
    leaves: list[tuple[str, list[tuple[bytes, bytes]]]] = []
    for level in range(VNS):
        nxt: dict[int, list[tuple[str, Pass]]] = {j: [] for j in range(REPLICAS)}
        for j in range(REPLICAS):
            me = f"b{level}.{j}"
            last = level == VNS - 1
            held: list[tuple[bytes, bytes]] = []
            for sender, pss in inbound[j]:
                # Vouch before splitting; the last VN relays and checks seals by sample.
                held += receive(pss, j, keys[sender], check_seal=not last)
            if last:
                leaves.append((me, held))
                continue
            size = len(held[0][1])
            out = split_pass(signers[me], held, size)
            passes.append((me, out))
            for i in range(REPLICAS):
                nxt[i].append((me, out))
        inbound = nxt
    if tamper:  # the model's own check: one altered leaf must not go unnoticed
        _, held = leaves[0]
        node, opening = held[0]
        held[0] = (node, opening[:-1] + bytes([opening[-1] ^ 1]))
    subscriber_assembles(count, roots, sealed, passes, leaves, keys)


def subscriber_assembles(
    count: int,
    roots: list[tuple[bytes, bytes]],
    sealed: list[tuple[bytes, bytes]],
    passes: list[tuple[str, Pass]],
    leaves: list[tuple[str, list[tuple[bytes, bytes]]]],
    keys: dict[str, object],
) -> None:
    # The audit: every statement's seal, once per pass.
    commits: dict[bytes, list[bytes]] = {}
    parents: dict[bytes, bytes] = {}
    for sender, pss in passes:
        keys[sender].verify(pss.signature, pss.statement)  # type: ignore[attr-defined]
        _, entries = msgpack.unpackb(pss.statement, raw=False)
        for node, parent, c in entries:
            commits[node] = c
            parents[node] = parent
    # Leaves: split node -> {x: child opening}, each checked against its commitment.
    values: dict[bytes, dict[int, bytes]] = {}
    for _, held in leaves:
        for node, opening in held:
            parent, x = node[:-1], node[-1]
            if commit(opening) != commits[parent][x]:
                raise AssertionError("bad leaf")
            values.setdefault(parent, {})[x + 1] = opening
    # Bottom-up, one level at a time and every node of the level at once: combine children
    # 1 and 2 (salts stripped), check the third lies on the same polynomial, and check each
    # recovered opening against the commitment its own splitter made (the root: AES-GCM).
    recovered: dict[bytes, bytes] = {}
    while values:
        nodes = sorted(values)
        size = len(values[nodes[0]][1]) - SALT
        ys = [b"".join(values[n][x][SALT:] for n in nodes) for x in (1, 2, 3)]
        pair = [shamir.trusted_share(1, ys[0]), shamir.trusted_share(2, ys[1])]
        if shamir.interpolate(pair, K, 3) != ys[2]:
            raise AssertionError("inconsistent children")
        joined = shamir.combine(pair, K)
        upper: dict[bytes, dict[int, bytes]] = {}
        for i, node in enumerate(nodes):
            opening = joined[i * size : (i + 1) * size]
            if len(node) == 8:  # a root: the publication's key
                recovered[node] = opening
            elif commit(opening) != commits[node[:-1]][node[-1]]:
                raise AssertionError("bad recovery")
            else:
                upper.setdefault(node[:-1], {})[node[-1] + 1] = opening
        values = upper
    for (pub_id, _), (nonce, ct) in zip(roots, sealed, strict=True):
        assert AESGCM(recovered[pub_id]).decrypt(nonce, ct, pub_id) == PAYLOAD
    assert len(recovered) == count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pubs", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    names = ["pub"] + [f"b{v}.{j}" for v in range(VNS) for j in range(REPLICAS)]
    signers = {n: Signer.generate(n) for n in names}
    from bench_confidential import pipeline_breakdown

    pipeline(3, signers)
    try:
        pipeline(3, signers, tamper=True)
    except AssertionError:
        pass
    else:
        raise SystemExit("the model did not notice an altered leaf")

    print("share work per confidential publication, 3 VN hops, r = 3, one process (µs):")
    print("| per pass | one split per pass (model) | today's protocol | ratio |")
    print("|---:|---:|---:|---:|")
    for per in (1, 20):
        model, today = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            done = 0
            while done < args.pubs:
                pipeline(per, signers)
                done += per
            model.append((time.perf_counter() - t0) / done * 1e6)
            label = "one per pass" if per == 1 else f"{per} per pass"
            today.append(pipeline_breakdown(args.pubs, per)[label]["total"])
        m, t = statistics.median(model), statistics.median(today)
        print(f"| {per} | {m:,.0f} | {t:,.0f} | {t / m:.1f}x |")


if __name__ == "__main__":
    main()
