"""Share work per confidential publication: key shares by the pass
(:mod:`security.pass_shares`) beside the per-record form (:mod:`security.propagation`, timed
by ``pipeline_breakdown`` of ``bench_confidential.py``).

Both run the honest path of a line of three VNs of three replicas in one process, every
broker's and the subscriber's share work in turn, without sockets, frames or the event loop,
one publication per pass (the latency case) and 20 per pass (a stream). The pass pipeline
does what each party would: the publisher seals each payload with AES-GCM under a fresh key,
signs its publications once per pass (as the SDK signs a pass) and splits the keys in one
pass; every replica parses each statement it gets from its bytes, checks every entry against
the path, verifies the sender's signature before it splits (the last VN only relays), opens
its blob (one hash per share), keeps the first share per lineage and splits what it holds in
one pass; the last VN's replicas hand the subscriber their leaves and every statement; the
subscriber reconstructs the pass's keys together in a quick pass (no signature: the AES-GCM
tag checks each key, and a clean pass needs no audit, as the SDK decides today) and opens
each payload. Not a test:

    .venv/bin/python bench/bench_pass_shares.py [--pubs 60] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from security.envelope import Signer
from security.pass_shares import (
    Assembly,
    Held,
    PassStatement,
    SealChecks,
    entry_problem,
    leaf_batches,
    open_pass,
    parse_statement,
    root_holdings,
    split_pass,
)
from security.propagation import Member, PathView
from security.publication import publication_id

REPLICAS = 3
VNS = 3
PAYLOAD = b"x" * 100


class Party:
    """One replica: its signer, signature cache and what it holds."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self.seals = SealChecks()
        self.held: dict[tuple[bytes, tuple[int, ...]], Held] = {}
        self.under: dict[bytes, PassStatement] = {}
        self.relay: dict[bytes, tuple[bytes, bytes]] = {}  # raw -> (raw, signature)


def pipeline(count: int, signers: dict[str, Signer], path: PathView, serial: int) -> None:
    """One pass of ``count`` publications through the line to one subscriber."""
    publisher = signers["pub"]
    # (real publication ids: a subscriber keeps no entry naming no publication)
    first = serial * 1_000_000
    keys = [(publication_id("pub", first + n), os.urandom(32)) for n in range(count)]
    sealed = []
    for pub_id, key in keys:
        nonce = os.urandom(12)
        sealed.append((pub_id, nonce, AESGCM(key).encrypt(nonce, PAYLOAD, pub_id)))
    publisher.sign(b"".join(pub_id for pub_id, _ in keys))  # the pass's content signature
    statement, blobs = split_pass(publisher, "b0", serial, REPLICAS, root_holdings(keys))
    # What each replica receives: (sender, raw, signature, blob, relayed (raw, sig) pairs).
    inbound: list[list[tuple[str, bytes, bytes, bytes, list[tuple[bytes, bytes]]]]] = [
        [("pub", statement.raw, statement.signature, blobs[j], [])] for j in range(REPLICAS)
    ]
    keys_of = {m.id: m.public_key for vn in path.vns for m in vn} | {"pub": publisher.public_key}
    last: list[tuple[str, Party]] = []
    for level in range(1, VNS + 1):
        nxt: list[list[tuple[str, bytes, bytes, bytes, list[tuple[bytes, bytes]]]]] = [
            [] for _ in range(REPLICAS)
        ]
        for j in range(REPLICAS):
            me = f"b{level - 1}.{j}"
            party = Party(signers[me])
            for sender, raw, signature, blob, relayed in inbound[j]:
                got = parse_statement(raw, signature)
                if got.splitter != sender or any(entry_problem(got, e, path) for e in got.entries):
                    continue
                if level < VNS and not party.seals.sealed(got, keys_of[sender]):
                    continue
                held, _ = open_pass(got, blob, j)
                for share in held:
                    party.held.setdefault((share.pub_id, share.lineage), share)
                party.under[got.ref] = got
                party.relay[raw] = (raw, signature)
                for pair in relayed:
                    party.relay.setdefault(pair[0], pair)
            if level == VNS:
                last.append((me, party))
                continue
            out, child_blobs = split_pass(
                party.signer, f"b{level}", serial, REPLICAS, list(party.held.values())
            )
            relayed_on = list(party.relay.values())
            for i in range(REPLICAS):
                nxt[i].append((me, out.raw, out.signature, child_blobs[i], relayed_on))
        inbound = nxt
    # The subscriber: leaves and statements from every replica of the last VN.
    assembly = Assembly()
    parsed: set[bytes] = set()  # each replica relays every statement: parse each once
    for me, party in last:
        for raw, signature in party.relay.values():
            if raw not in parsed:
                parsed.add(raw)
                assembly.add_statement(parse_statement(raw, signature))
        for batch in leaf_batches(party.held.values(), party.under):
            assembly.add_leaves(me, batch)
    # As the SDK does today: a quick pass (no signature) whose key the AES-GCM tag checks;
    # the audit runs only when the quick pass finds something wrong (or by sample).
    results = assembly.reconstruct_many(
        [pub_id for pub_id, _, _ in sealed], path, audit=False, complete=True
    )
    for pub_id, nonce, ciphertext in sealed:
        result = results[pub_id]
        assert result.key is not None, result.blame
        assert not result.blame
        assert AESGCM(result.key).decrypt(nonce, ciphertext, pub_id) == PAYLOAD
        assembly.forget(pub_id)


def line_of_parties() -> tuple[dict[str, Signer], PathView]:
    """The publisher's and every replica's signer, and the publication's path."""
    names = ["pub"] + [f"b{v}.{j}" for v in range(VNS) for j in range(REPLICAS)]
    signers = {n: Signer.generate(n) for n in names}
    path = PathView(
        Member("pub", signers["pub"].public_key),
        tuple(
            tuple(Member(f"b{v}.{j}", signers[f"b{v}.{j}"].public_key) for j in range(REPLICAS))
            for v in range(VNS)
        ),
    )
    return signers, path


def pass_breakdown(pubs: int = 60, per_pass: int = 20) -> dict[str, dict[str, float]]:
    """:func:`bench_confidential.pipeline_breakdown` for shares by the pass: µs per
    publication by kind of work, one publication per pass and ``per_pass`` per pass."""
    from bench_confidential import work_breakdown

    signers, path = line_of_parties()
    serial = 0
    out: dict[str, dict[str, float]] = {}
    for label, per in (("one per pass", 1), (f"{per_pass} per pass", per_pass)):

        def run_all(per: int = per) -> None:
            nonlocal serial
            done = 0
            while done < pubs:
                serial += 1
                pipeline(per, signers, path, serial)
                done += per

        out[label] = work_breakdown(run_all, pubs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pubs", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from bench_confidential import pipeline_breakdown

    print("share work per confidential publication, 3 VN hops, r = 3, one process (µs):")
    print("| per pass | by the pass (security.pass_shares) | per record | ratio |")
    print("|---:|---:|---:|---:|")
    runs = [(pass_breakdown(args.pubs), pipeline_breakdown(args.pubs)) for _ in range(args.repeat)]
    rows: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    for per, label in ((1, "one per pass"), (20, "20 per pass")):
        passes = [by_pass[label] for by_pass, _ in runs]
        today = [by_record[label] for _, by_record in runs]
        mid = statistics.median(r["total"] for r in passes)
        mid_today = statistics.median(r["total"] for r in today)
        print(f"| {per} | {mid:,.0f} | {mid_today:,.0f} | {mid_today / mid:.1f}x |")
        rows[label] = (_median_row(passes), _median_row(today))
    print("\nwhere the work goes, µs per publication (medians), by the pass / per record:")
    labels = list(rows)
    print("| work | " + " | ".join(f"{lb}: pass | {lb}: record" for lb in labels) + " |")
    print("|---|" + "---:|" * (2 * len(labels)))
    for kind in next(iter(rows.values()))[0]:
        cells = " | ".join(f"{p[kind]:,.1f} | {t[kind]:,.1f}" for p, t in rows.values())
        print(f"| {kind} | {cells} |")


def _median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    return {kind: statistics.median(r[kind] for r in rows) for kind in rows[0]}


if __name__ == "__main__":
    main()
