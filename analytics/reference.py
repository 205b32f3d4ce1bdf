"""The job's semantics in plain Python: the reference the Spark job is tested against.

Windows are tumbling, in event time, aligned to the Unix epoch: window ``w`` holds
``[w, w + Δ)``. Everything about a publication (its class, the local views it adds to, the
failures seen while it travelled, the shares of its key epoch) counts in the window of its
earliest record anywhere in the overlay (``t0``, normally its edge broker routing it), however
late a record about it was written or read: a replica's copy that arrives after the window
closed, a file another broker flushed later, a share verdict. Link failures count at their own
time. Records are read with torn last lines skipped (:func:`analytics.schema.read_records`).

Tables (one row per window and key; ``w`` is the window start in Unix seconds):

* ``classes``: ``w, src, dsts, demand`` - global traffic classes, publisher edge VN → sorted
  subscriber edge VNs (VNs with a local subscriber the publication matched), with demand.
* ``local_views``: ``w, broker, members, demand`` - each broker's local view (SPEC §5): for
  every publication it routed, the set {previous hop} ∪ next-hop VNs ∪ local subscribers;
  sets of one are ignored, equal sets merged. It is what the broker's live OCBR counters
  (``Forwarder.traffic``, ``GET /reconfig``) count.
* ``trust_feedback``: ``w, evaluator, broker, broker_vn, expected, received, missing,
  conflicting, bad_signatures, timely, shares_ok, bad_shares, failures, events,
  failure_ratio, delivery_ratio, share_integrity, timeliness`` - per (evaluator, broker):
  every publication the evaluator routed from VN U should have reached it from every
  replica of U (``expected``); a copy is ``conflicting`` when its payload digest differs
  from the evaluator's majority digest for that publication (ties: the smaller digest),
  ``bad_signatures`` when it was discarded for the publisher's signature, ``timely`` when
  it arrived within ``timely`` seconds of the first copy; ``shares_ok`` are the broker's
  shares that verified at the evaluator, ``bad_shares`` the shares the evaluator rejected
  blaming this broker. failures = missing + conflicting + bad_signatures + bad_shares;
  events = expected + shares_ok + bad_shares; delivery_ratio = (received - conflicting -
  bad_signatures) / expected; share_integrity = shares_ok / (shares_ok + bad_shares);
  timeliness = timely / (received - bad_signatures); ratios are None without evidence.
* ``broker_failures``: ``w, broker, expected, failures, events, failure_ratio,
  dropped_deliveries`` - the pair counts summed over evaluators (γ of the broker), and the
  deliveries the broker itself dropped for slow consumers.
* ``link_failures``: ``w, src_vn, dst_vn, expected, failures, events, failure_ratio,
  links_down`` - the same sums per directed VN link (copies and shares from ``src_vn`` to
  ``dst_vn``), with the broker links between the two VNs reported down.
* ``path_failures``: ``w, src, dst, publications, failed, failure_ratio`` - per end-to-end
  path (publisher edge VN → subscriber edge VN): the publications that met any failure
  anywhere (a missing, conflicting or badly signed copy, a bad share of their epoch), even
  when replication masked it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

Row = dict[str, Any]

COPY_COUNTS: tuple[str, ...] = (
    "expected",
    "received",
    "missing",
    "conflicting",
    "bad_signatures",
    "timely",
)
"""Per (evaluator, broker): what the evaluator expected of the broker's copies and got."""
FEEDBACK_COUNTS: tuple[str, ...] = (*COPY_COUNTS, "shares_ok", "bad_shares")
"""Every count of a trust-feedback row (copies, then key shares)."""

TABLES: dict[str, tuple[str, ...]] = {
    "classes": ("w", "src", "dsts", "demand"),
    "local_views": ("w", "broker", "members", "demand"),
    "trust_feedback": (
        "w",
        "evaluator",
        "broker",
        "broker_vn",
        *FEEDBACK_COUNTS,
        "failures",
        "events",
        "failure_ratio",
        "delivery_ratio",
        "share_integrity",
        "timeliness",
    ),
    "broker_failures": (
        "w",
        "broker",
        "expected",
        "failures",
        "events",
        "failure_ratio",
        "dropped_deliveries",
    ),
    "link_failures": (
        "w",
        "src_vn",
        "dst_vn",
        "expected",
        "failures",
        "events",
        "failure_ratio",
        "links_down",
    ),
    "path_failures": ("w", "src", "dst", "publications", "failed", "failure_ratio"),
}


def window_of(t: float, width: float) -> float:
    """The start of the window holding time ``t`` (the job uses the same expression)."""
    return math.floor(t / width) * width


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def compute(
    records: Iterable[Mapping[str, Any]], width: float, timely: float = 1.0
) -> dict[str, list[Row]]:
    """Every output table from traffic-log records (any order)."""
    recs = list(records)
    members: dict[str, set[str]] = defaultdict(set)
    vn_of: dict[str, str] = {}
    for r in recs:
        if r["k"] == "meta":
            members[r["vn"]].add(r["b"])
            vn_of[r["b"]] = r["vn"]
            for n in r.get("nb") or ():
                members[n["vn"]].add(n["id"])
                vn_of[n["id"]] = n["vn"]

    # Publications: earliest time, edge VN, subscriber edge VNs.
    t0: dict[tuple[str, int], float] = {}
    src: dict[tuple[str, int], str] = {}
    dsts: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in recs:
        if r["k"] != "pub":
            continue
        key = (r["p"], r["s"])
        t0[key] = min(t0.get(key, r["t"]), r["t"])
        if r["pc"]:
            src[key] = min(src.get(key, r["vn"]), r["vn"])
        if r.get("loc") or r.get("drop"):
            dsts[key].add(r["vn"])
        dsts.setdefault(key, set())
    win = {key: window_of(t, width) for key, t in t0.items()}

    def w_of(r: Mapping[str, Any]) -> float:
        return win.get((r["p"], r["s"]), window_of(r["t"], width))

    classes: Counter[tuple[float, str, tuple[str, ...]]] = Counter()
    for key, w in win.items():
        if key in src and dsts[key]:
            classes[(w, src[key], tuple(sorted(dsts[key])))] += 1

    views: Counter[tuple[float, str, tuple[str, ...]]] = Counter()
    dropped: Counter[tuple[float, str]] = Counter()
    for r in recs:
        if r["k"] != "pub":
            continue
        names = {r["prev"], *(r.get("next") or ()), *(r.get("loc") or ()), *(r.get("drop") or ())}
        if len(names) > 1:
            views[(w_of(r), r["b"], tuple(sorted(names)))] += 1
        if r.get("drop"):
            dropped[(w_of(r), r["b"])] += len(r["drop"])

    # Copies seen by each evaluator, per publication.
    copies: dict[tuple[str, str, int], list[tuple[str, int, float]]] = defaultdict(list)
    expected_from: dict[tuple[str, str, int], str] = {}
    badsig: set[tuple[str, str, int, str]] = set()
    for r in recs:
        k = r["k"]
        if (k == "pub" and not r["pc"]) or k == "copy":
            copies[(r["b"], r["p"], r["s"])].append((r["from"], r["dig"], r["t"]))
        if k == "pub" and not r["pc"]:
            expected_from[(r["b"], r["p"], r["s"])] = r["prev"]
        if k == "sig":
            badsig.add((r["b"], r["p"], r["s"], r["from"]))

    pair: dict[tuple[float, str, str], Counter[str]] = defaultdict(Counter)
    failed_pubs: set[tuple[str, int]] = set()
    for (e, p, s), prev in expected_from.items():
        seen = copies[(e, p, s)]
        counts = Counter(d for _f, d, _t in seen)
        majority = min(counts, key=lambda d: (-counts[d], d))
        first = min(t for _f, _d, t in seen)
        w = win[(p, s)]
        for b in members.get(prev, ()):
            c = pair[(w, e, b)]
            c["expected"] += 1
            mine = [(d, t) for f, d, t in seen if f == b]
            sig = (e, p, s, b) in badsig
            if mine or sig:
                c["received"] += 1
            else:
                c["missing"] += 1
                failed_pubs.add((p, s))
            if any(d != majority for d, _t in mine):
                c["conflicting"] += 1
                failed_pubs.add((p, s))
            if sig:
                c["bad_signatures"] += 1
                failed_pubs.add((p, s))
            if mine and min(t for _d, t in mine) - first <= timely:
                c["timely"] += 1
    for r in recs:
        if r["k"] != "share":
            continue
        w = w_of(r)
        if r["ok"]:
            pair[(w, r["b"], r["from"])]["shares_ok"] += 1
        elif r.get("cul") is not None:
            pair[(w, r["b"], r["cul"])]["bad_shares"] += 1
            failed_pubs.add((r["p"], r["s"]))

    trust: list[Row] = []
    for (w, e, b), c in sorted(pair.items()):
        failures = c["missing"] + c["conflicting"] + c["bad_signatures"] + c["bad_shares"]
        events = c["expected"] + c["shares_ok"] + c["bad_shares"]
        copies_in = c["received"] - c["bad_signatures"]
        trust.append(
            {
                "w": w,
                "evaluator": e,
                "broker": b,
                "broker_vn": vn_of.get(b),
                **{name: c[name] for name in FEEDBACK_COUNTS},
                "failures": failures,
                "events": events,
                "failure_ratio": _ratio(failures, events),
                "delivery_ratio": _ratio(
                    c["received"] - c["conflicting"] - c["bad_signatures"], c["expected"]
                ),
                "share_integrity": _ratio(c["shares_ok"], c["shares_ok"] + c["bad_shares"]),
                "timeliness": _ratio(c["timely"], copies_in),
            }
        )

    per_broker: dict[tuple[float, str], Counter[str]] = defaultdict(Counter)
    per_link: dict[tuple[float, str, str], Counter[str]] = defaultdict(Counter)
    for row in trust:
        if row["broker_vn"] is None:
            continue  # a publisher's shares: clients are not brokers
        link = (row["w"], row["broker_vn"], vn_of.get(row["evaluator"], "?"))
        for name in ("expected", "failures", "events"):
            per_broker[(row["w"], row["broker"])][name] += row[name]
            per_link[link][name] += row[name]
    for (w, b), n in dropped.items():
        per_broker[(w, b)]["dropped_deliveries"] += n
    for r in recs:
        if r["k"] == "link":
            peer_vn = vn_of.get(r["peer"], "?")
            per_link[(window_of(r["t"], width), r["vn"], peer_vn)]["links_down"] += 1

    paths: dict[tuple[float, str, str], Counter[str]] = defaultdict(Counter)
    for key, w in win.items():
        if key not in src:
            continue
        for d in dsts[key]:
            c = paths[(w, src[key], d)]
            c["publications"] += 1
            c["failed"] += key in failed_pubs

    return {
        "classes": [
            {"w": w, "src": s, "dsts": list(d), "demand": n}
            for (w, s, d), n in sorted(classes.items())
        ],
        "local_views": [
            {"w": w, "broker": b, "members": list(m), "demand": n}
            for (w, b, m), n in sorted(views.items())
        ],
        "trust_feedback": trust,
        "broker_failures": [
            {
                "w": w,
                "broker": b,
                "expected": c["expected"],
                "failures": c["failures"],
                "events": c["events"],
                "failure_ratio": _ratio(c["failures"], c["events"]),
                "dropped_deliveries": c["dropped_deliveries"],
            }
            for (w, b), c in sorted(per_broker.items())
        ],
        "link_failures": [
            {
                "w": w,
                "src_vn": a,
                "dst_vn": z,
                "expected": c["expected"],
                "failures": c["failures"],
                "events": c["events"],
                "failure_ratio": _ratio(c["failures"], c["events"]),
                "links_down": c["links_down"],
            }
            for (w, a, z), c in sorted(per_link.items())
        ],
        "path_failures": [
            {
                "w": w,
                "src": a,
                "dst": z,
                "publications": c["publications"],
                "failed": c["failed"],
                "failure_ratio": _ratio(c["failed"], c["publications"]),
            }
            for (w, a, z), c in sorted(paths.items())
        ],
    }
