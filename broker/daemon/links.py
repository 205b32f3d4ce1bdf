"""What a broker knows of the overlay's links: link-state announcements and saved links.

Every broker floods its current neighbour set (``LINKSTATE``, versioned by wall clock so a
restarted broker's announcements supersede its earlier ones). A link counts only when both
ends announce it, so a dead broker's stale claims do not; from those links a broker refuses
a new link that would close a cycle in the tree of VNs (:func:`overlay.tree.path_between`).
The neighbours a reconfiguration left are saved in ``links_file`` so a restarted broker
rejoins the tree as it was left.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from broker.wire.protocol import LinkState
from overlay.tree import path_between
from reconfig.live import tables_digest

log = logging.getLogger("trellis.overlay")

MAX_STATES = 8192
"""Brokers whose link state a broker keeps: announcements of new brokers past it are not
kept nor flooded on (a replica announcing under a new id in every frame grew every broker's
table until 2026-11-29). Far above any overlay this runs."""

MAX_NEIGHBOURS = 4096
"""Neighbours one announcement may name; a longer one is ignored."""


class LinkStates:
    """The latest link-state announcement of every broker this one has heard of."""

    def __init__(self, broker_id: str, vn: str) -> None:
        self.broker_id = broker_id
        self.vn = vn
        # broker id -> (version, its VN, its live links)
        self.states: dict[str, tuple[int, str, frozenset[str]]] = {}

    def announce(self, neighbours: Collection[str]) -> LinkState:
        """Record this broker's own neighbour set; the announcement to flood."""
        version = max(time.time_ns(), self.states.get(self.broker_id, (0,))[0] + 1)
        mine = frozenset(neighbours)
        self.states[self.broker_id] = (version, self.vn, mine)
        return LinkState(self.broker_id, self.vn, version, sorted(mine))

    def learn(self, msg: LinkState) -> bool:
        """Record another broker's announcement; True when it is news (flood it on)."""
        known = self.states.get(msg.broker_id)
        if msg.broker_id == self.broker_id or (known and known[0] >= msg.version):
            return False
        if len(msg.neighbours) > MAX_NEIGHBOURS or (
            known is None and len(self.states) >= MAX_STATES
        ):
            log.debug("link state of %r not kept (bounds)", msg.broker_id)
            return False
        self.states[msg.broker_id] = (msg.version, msg.vn, frozenset(msg.neighbours))
        return True

    def replay(self) -> list[LinkState]:
        """Every known announcement, for a link that just came up."""
        return [
            LinkState(broker_id, vn, version, sorted(neighbours))
            for broker_id, (version, vn, neighbours) in self.states.items()
        ]

    def vn_edges(self) -> set[frozenset[str]]:
        """VN links whose replicas both announce them (the overlay is a tree of VNs,
        replicas of neighbouring VNs all linked)."""
        edges = set()
        for a, (_, vn_a, neighbours) in self.states.items():
            for b in neighbours:
                other = self.states.get(b)
                if other is not None and a in other[2] and vn_a != other[1]:
                    edges.add(frozenset((vn_a, other[1])))
        return edges

    def cycle_through(self, peer_vn: str) -> list[str]:
        """The VN path from this broker's VN to ``peer_vn`` in the known overlay, not using
        a direct link between them: a link to ``peer_vn`` would close it into a cycle.
        Empty when there is none."""
        ends = {self.vn, peer_vn}
        links = [(a, b) for a, b in (tuple(e) for e in self.vn_edges()) if {a, b} != ends]
        if self.vn == peer_vn:
            return []
        return path_between(links, self.vn, peer_vn)


def load_saved_links(
    path: Path | None, configured: list[str], directory: Mapping[str, object]
) -> list[str]:
    """The neighbours to start with: those in ``path`` when it exists (the tree as the last
    reconfiguration left it), else the ``configured`` ones."""
    if path is None or not path.exists():
        return configured
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["neighbours"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring links file %s: %s", path, exc)
        return configured
    if not isinstance(saved, list) or not all(isinstance(p, str) for p in saved):
        log.warning("ignoring links file %s: 'neighbours' is not a list of ids", path)
        return configured
    unknown = [p for p in saved if p not in directory]
    if unknown:
        log.warning("ignoring links file %s: unknown brokers %s", path, unknown)
        return configured
    return saved


def save_links(path: Path | None, neighbours: Collection[str]) -> None:
    """Record the current neighbours in ``path`` (atomically); blocking file I/O, so call
    it off the event loop."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"neighbours": sorted(neighbours)}) + "\n", encoding="utf-8")
    tmp.replace(path)


def sibling_agreement(
    mine: Collection[str], answers: Collection[Collection[str]], quorum: int
) -> frozenset[str] | None:
    """The neighbour VNs a restarted replica takes from its siblings' ``answers``: a set
    other than ``mine`` that ``quorum`` (f + 1) siblings reported, so that f Byzantine
    siblings cannot move its links; None to keep its own. Its own saved set does not vote:
    it is the one that may have missed a round. (With at most 2f + 2 replicas no two sets
    reach f + 1 among the others; a tie would go to the smallest, for determinism.)"""
    counts: dict[frozenset[str], int] = {}
    for answer in answers:
        vns = frozenset(answer)
        counts[vns] = counts.get(vns, 0) + 1
    agreed = sorted(sorted(vns) for vns, n in counts.items() if n >= quorum)
    if not agreed or frozenset(agreed[0]) == frozenset(mine):
        return None
    return frozenset(agreed[0])


def sibling_tables(
    agreed: Collection[str], answers: Collection[Mapping[str, Any] | None], quorum: int
) -> Mapping[str, Any] | None:
    """The routing tables (``{"held": ..., "sent": ...}`` by neighbour VN, in wire form)
    a replica that missed a round takes: tables for exactly the ``agreed`` neighbour VNs
    that ``quorum`` (f + 1) siblings sent identically, so that f Byzantine siblings cannot
    choose them; None if no such tables (siblings mid-change: ask again later)."""
    wanted = set(agreed)
    votes: dict[str, list[Mapping[str, Any]]] = {}
    for tables in answers:
        if tables is None:
            continue
        held, sent = tables.get("held"), tables.get("sent")
        if not isinstance(held, dict) or not isinstance(sent, dict):
            continue
        if set(held) != wanted or set(sent) != wanted:
            continue
        votes.setdefault(tables_digest("", held, sent), []).append(tables)
    return next((v[0] for _, v in sorted(votes.items()) if len(v) >= quorum), None)
