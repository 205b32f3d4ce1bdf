"""Synthetic traffic logs in the brokers' format, for tests and benchmarks.

An overlay of VNs in a line, ``replicas`` brokers each. Publishers sit at random VNs and
publish to subscribers at other VNs; every replica on the way routes each publication (one
``pub`` record) and hears a copy from every replica of the previous VN (``copy`` records
after the first). Faults, when asked for: a *dropper* replica routes nothing and sends
nothing; a *corrupter* sends copies whose payload digest differs and, for confidential
publications, shares that every receiver rejects naming it. Some copies arrive late (after
the window their publication belongs to closes, written at the end of their file), and the
last file ends with a torn frame. Files are in the brokers' format (:mod:`analytics.logfile`),
one frame per ``batch`` records.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from analytics.logfile import SUFFIX, FileWriter


def generate(
    out: str | Path,
    publications: int,
    *,
    vns: int = 4,
    replicas: int = 3,
    seed: int = 1,
    start: float = 1_800_000_000.0,
    rate: float = 50.0,
    window: float = 60.0,
    dropper: str | None = "v1.2",
    corrupter: str | None = "v2.1",
    confidential: float = 0.2,
    late: float = 0.02,
    torn: bool = True,
    batch: int = 2000,
) -> int:
    """Write logs for ``publications`` publications under ``out``; returns the record count."""
    rng = random.Random(seed)
    root = Path(out)
    names = [f"v{i}" for i in range(vns)]
    members = {vn: [f"{vn}.{r}" for r in range(replicas)] for vn in names}
    files: dict[str, FileWriter] = {}
    late_records: dict[str, list[dict[str, Any]]] = {}
    count = 0

    def write(broker: str, record: dict[str, Any], delayed: bool = False) -> None:
        nonlocal count
        count += 1
        if delayed:
            late_records.setdefault(broker, []).append(record)
        else:
            writer = files[broker]
            writer.add(record)
            if len(writer.batch) >= batch:
                writer.flush()

    for vn, brokers in members.items():
        i = names.index(vn)
        nb = [
            {"id": b, "vn": n, "r": int(b.split(".")[1])}
            for n in names
            if abs(names.index(n) - i) == 1
            for b in members[n]
        ]
        for b in brokers:
            folder = root / b
            folder.mkdir(parents=True, exist_ok=True)
            vn_name, r = b.split(".")
            meta = {"t": start, "b": b, "vn": vn_name, "r": int(r), "vs": replicas, "nb": nb}
            files[b] = FileWriter(folder / f"traffic-00000000T000000.000000Z{SUFFIX}", meta)
            count += 1

    publishers = [(f"pub{j}", rng.randrange(vns)) for j in range(max(1, vns * 2))]
    seqs = dict.fromkeys((p for p, _ in publishers), 0)
    t = start
    for _ in range(publications):
        t += rng.expovariate(rate)
        publisher, home = rng.choice(publishers)
        seqs[publisher] += 1
        seq = seqs[publisher]
        subs = {rng.randrange(vns) for _ in range(rng.randint(1, 3))}
        conf = rng.random() < confidential
        size = rng.randint(10, 500)
        digest = rng.randrange(1 << 31)
        # The VNs the publication visits, with the VN it came from and where it goes next.
        far_left, far_right = min([*subs, home]), max([*subs, home])
        visit: list[tuple[int, int | None, list[int]]] = []
        for i in range(far_left, far_right + 1):
            if i == home:
                prev, nxt = None, [j for j in (i - 1, i + 1) if far_left <= j <= far_right]
            elif i < home:
                prev, nxt = i + 1, [i - 1] if i > far_left else []
            else:
                prev, nxt = i - 1, [i + 1] if i < far_right else []
            visit.append((i, prev, nxt))
        for i, prev, nxt in visit:
            vn = names[i]
            hop_t = t + 0.001 * abs(i - home)
            local = [f"sub{i}"] if i in subs else []
            for b in members[vn]:
                if b == dropper:
                    continue
                senders = [] if prev is None else [s for s in members[names[prev]] if s != dropper]
                rng.shuffle(senders)
                record: dict[str, Any] = {
                    "k": "pub",
                    "t": hop_t,
                    "p": publisher,
                    "s": seq,
                    "prev": publisher if prev is None else names[prev],
                    "pc": prev is None,
                    "from": publisher if prev is None else senders[0],
                    "next": [names[j] for j in nxt],
                    "loc": local,
                    "drop": [],
                    "n": size,
                    "conf": conf,
                    "dig": None if prev is None else digest + (senders[0] == corrupter),
                }
                if local and rng.random() < 0.01:
                    record["loc"], record["drop"] = [], local
                if prev is not None and senders:
                    write(b, record)
                    for k, sender in enumerate(senders[1:], 1):
                        is_late = rng.random() < late
                        when = hop_t + (window * 0.75 if is_late else 0.0002 * k)
                        write(
                            b,
                            {
                                "k": "copy",
                                "t": when,
                                "p": publisher,
                                "s": seq,
                                "prev": names[prev],
                                "from": sender,
                                "dig": digest + (sender == corrupter),
                            },
                            delayed=is_late,
                        )
                    if conf:
                        for sender in senders:
                            ok = sender != corrupter
                            write(
                                b,
                                {
                                    "k": "share",
                                    "t": hop_t + 0.0005,
                                    "p": publisher,
                                    "s": seq,
                                    "from": sender,
                                    "ok": ok,
                                    "cul": None if ok else sender,
                                    "why": None if ok else "commitment mismatch",
                                },
                            )
                elif prev is None:
                    write(b, record)
    for b, writer in files.items():
        writer.flush()
        for record in late_records.get(b, ()):
            writer.add(record)
    if torn:
        files[sorted(files)[-1]].tear()
    for writer in files.values():
        writer.close()
    return count
