"""The live OCBR protocol's steps and a member's state, as plain data and pure transitions.

A round (SPEC §5) locks a neighbourhood, opens the plan's new links in standby, freezes and
drains the old links with in-band markers, installs the new routing tables and resumes.
This module holds what those steps *are* and how a member broker's state moves between
them, with no sockets, no clocks and no tasks: callers pass ``now`` and act on what the
transitions return. The daemon's agent (``broker.daemon.reconfig_agent``) drives it with
events and timers and does the I/O.

Steps travel in ``RECONF [op, data]`` frames: :func:`parse_step` turns one into a typed
step (every field checked, errors naming the field), :meth:`Step.to_data` back. Every step
is answered by a :class:`Reply`.

The coordinator is not trusted (see ``broker.daemon.reconfig_agent``): :func:`plan_problem`
is a member's check of a plan against its own view, :func:`plan_digest` and
:func:`tables_digest` are what replicas compare through the drain markers, and
:func:`vouch_quorum` is how many replicas of the master VN must vouch for a table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from overlay.tree import Link, link
from security.errors import InvalidRequest

STEPS: Final = (
    "lock",
    "unlock",
    "prepare",
    "connect",
    "freeze",
    "install",
    "resume",
    "abort",
)


@dataclass(frozen=True, slots=True)
class Reply:
    """A member's answer to one step: done, or why not (and, to a ``neighbours`` request
    from a sibling replica, the neighbour VNs this broker keeps, with its routing tables
    for them in wire form when asked: ``{"held": ..., "sent": ...}`` as a round installs)."""

    ok: bool
    error: str = ""
    neighbours: tuple[str, ...] | None = None
    tables: Mapping[str, Any] | None = None

    def to_data(self) -> dict[str, Any]:
        if not self.ok:
            return {"ok": False, "error": self.error}
        data: dict[str, Any] = {"ok": True}
        if self.neighbours is not None:
            data["neighbours"] = list(self.neighbours)
        if self.tables is not None:
            data["tables"] = dict(self.tables)
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Reply:
        if data.get("ok") is True:
            vns = data.get("neighbours")
            if isinstance(vns, list) and all(isinstance(v, str) for v in vns):
                tables = data.get("tables")
                if not (
                    isinstance(tables, dict)
                    and isinstance(tables.get("held"), dict)
                    and isinstance(tables.get("sent"), dict)
                ):
                    tables = None
                return cls(True, neighbours=tuple(vns), tables=tables)
            return cls(True)
        return cls(False, str(data.get("error", "no reason given")))


OK: Final = Reply(True)


@dataclass(frozen=True, slots=True)
class Step:
    """A step that names only its round: unlock, connect, freeze, resume, abort."""

    op: str
    round: str

    def to_data(self) -> dict[str, Any]:
        return {"round": self.round}


@dataclass(frozen=True, slots=True)
class Lock(Step):
    """Ask a member for a lease on behalf of ``master`` (a VN id) for ``lease`` seconds."""

    master: str
    lease: float

    def to_data(self) -> dict[str, Any]:
        return {"round": self.round, "master": self.master, "lease": self.lease}


@dataclass(frozen=True, slots=True)
class Prepare(Step):
    """The plan: the neighbourhood's VNs and the links of its new local tree."""

    master: str
    hood: tuple[str, ...]
    links: tuple[Link, ...]

    def to_data(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "master": self.master,
            "hood": list(self.hood),
            "links": [list(lk) for lk in self.links],
        }


@dataclass(frozen=True, slots=True)
class Install(Step):
    """One VN's tables on the new tree, filters in wire form: ``held[vn]`` is what it holds
    from neighbour ``vn`` (``{"adv": {...}, "sub": {...}}``), ``sent[vn]`` the
    subscriptions it has sent to ``vn``."""

    held: Mapping[str, Mapping[str, Mapping[str, Any]]]
    sent: Mapping[str, Mapping[str, Any]]

    def to_data(self) -> dict[str, Any]:
        return {"round": self.round, "held": dict(self.held), "sent": dict(self.sent)}


def parse_step(op: str, data: Mapping[str, Any]) -> Step:
    """The typed step of a ``RECONF`` request.

    Raises:
        InvalidRequest: an unknown step, or a field missing or of the wrong type.
    """
    if op not in STEPS:
        raise InvalidRequest(f"unknown step {op!r}")
    round_id = data.get("round")
    if not isinstance(round_id, str) or not round_id:
        raise InvalidRequest(f"RECONF {op} field 'round' must be a non-empty string")
    if op == "lock":
        master, lease = data.get("master"), data.get("lease")
        if not isinstance(master, str):
            raise InvalidRequest("RECONF lock field 'master' must be a VN id")
        if not isinstance(lease, int | float) or isinstance(lease, bool) or not 0 < lease < 3600:
            raise InvalidRequest("RECONF lock field 'lease' must be seconds in (0, 3600)")
        return Lock(op, round_id, master, float(lease))
    if op == "prepare":
        return _parse_prepare(round_id, data)
    if op == "install":
        held, sent = data.get("held", {}), data.get("sent", {})
        if not isinstance(held, dict) or not all(
            isinstance(v, dict)
            and isinstance(v.get("adv"), dict)
            and isinstance(v.get("sub"), dict)
            for v in held.values()
        ):
            raise InvalidRequest("RECONF install field 'held' must map VNs to {adv, sub} maps")
        if not isinstance(sent, dict) or not all(isinstance(v, dict) for v in sent.values()):
            raise InvalidRequest("RECONF install field 'sent' must map VNs to subscription maps")
        return Install(op, round_id, held, sent)
    return Step(op, round_id)


def _parse_prepare(round_id: str, data: Mapping[str, Any]) -> Prepare:
    hood, links, master = data.get("hood"), data.get("links"), data.get("master")
    if not isinstance(hood, list) or not all(isinstance(v, str) for v in hood):
        raise InvalidRequest("RECONF prepare field 'hood' must be a list of VN ids")
    if not isinstance(links, list) or not all(
        isinstance(lk, list | tuple) and len(lk) == 2 and all(isinstance(v, str) for v in lk)
        for lk in links
    ):
        raise InvalidRequest("RECONF prepare field 'links' must be a list of VN id pairs")
    if master not in hood:
        raise InvalidRequest("RECONF prepare field 'master' must be one of 'hood'")
    assert isinstance(master, str)
    return Prepare(
        "prepare", round_id, master, tuple(hood), tuple((str(a), str(b)) for a, b in links)
    )


@dataclass(frozen=True, slots=True)
class RequestedMove:
    """A neighbourhood move an operator asks a master VN to run as one round (``trellis
    rebuild``): replace the link master–``vn`` by ``via``–``vn``, where ``via`` is another
    neighbour of the master. ``tag`` names who asked (e.g. a rebuild cycle and move number),
    for the round's record."""

    vn: str
    via: str
    tag: str = ""
    op: ClassVar[str] = "move"

    def to_data(self) -> dict[str, Any]:
        return {"vn": self.vn, "via": self.via, "tag": self.tag}

    def problem(self, master: str, neighbours: Iterable[str]) -> str | None:
        """Why master VN ``master`` with neighbour VNs ``neighbours`` cannot run it now."""
        mine = set(neighbours)
        if self.vn == self.via:
            return f"move {self.vn} via itself"
        missing = [v for v in (self.vn, self.via) if v not in mine]
        if missing:
            return (
                f"VN {', '.join(missing)} is not a neighbour of master {master} "
                f"(its neighbours: {', '.join(sorted(mine)) or 'none'})"
            )
        return None

    def local_links(self, master: str, neighbours: Iterable[str]) -> list[Link]:
        """The neighbourhood's new local tree: the star with master–vn replaced by via–vn."""
        star = {link(master, n) for n in neighbours}
        return sorted((star - {link(master, self.vn)}) | {link(self.via, self.vn)})


def parse_move(data: Mapping[str, Any]) -> RequestedMove:
    """The move of a ``RECONF move`` request.

    Raises:
        InvalidRequest: ``vn`` or ``via`` missing or not a VN id, ``tag`` not a string.
    """
    vn, via, tag = data.get("vn"), data.get("via"), data.get("tag", "")
    if not isinstance(vn, str) or not vn:
        raise InvalidRequest("RECONF move field 'vn' must be a VN id")
    if not isinstance(via, str) or not via:
        raise InvalidRequest("RECONF move field 'via' must be a VN id")
    if not isinstance(tag, str):
        raise InvalidRequest("RECONF move field 'tag' must be a string")
    return RequestedMove(vn, via, tag)


def plan_problem(step: Prepare, vn: str, neighbours: Iterable[str]) -> str | None:
    """Why the member VN ``vn``, whose neighbour VNs are ``neighbours`` now, must refuse the
    plan ``step``; None when the plan is sound as far as this member can see.

    Sound means: the neighbourhood is the master VN and VNs adjacent to it (at the master:
    exactly its neighbours, none dropped, none added; elsewhere: the master is a neighbour
    and no other VN of the neighbourhood is), and the links form one spanning tree over
    exactly those VNs (no link leaves it, none repeats, no cycle, nobody cut off).
    """
    hood = list(step.hood)
    members = set(hood)
    if len(members) != len(hood):
        twice = sorted({v for v in hood if hood.count(v) > 1})
        return f"the neighbourhood lists {', '.join(twice)} twice"
    if vn not in members:
        return f"VN {vn} is not in the neighbourhood {sorted(members)}"
    mine = set(neighbours)
    if vn == step.master:
        dropped, strangers = mine - members, members - mine - {vn}
        if dropped:
            return f"the plan drops neighbour VN {', '.join(sorted(dropped))} of master {vn}"
        if strangers:
            return f"VN {', '.join(sorted(strangers))} is not a neighbour of master {vn}"
    else:
        if step.master not in mine:
            return f"master {step.master} is not a neighbour of VN {vn}"
        also = (mine & members) - {step.master}
        if also:
            return (
                f"VN {', '.join(sorted(also))} is already a neighbour of {vn}: "
                f"the neighbourhood is not a star around {step.master}"
            )
    parent = {v: v for v in members}

    def root(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    seen: set[Link] = set()
    for a, b in step.links:
        name = f"{a}-{b}"
        if a == b:
            return f"link {name} joins VN {a} to itself"
        outside = [v for v in (a, b) if v not in members]
        if outside:
            return f"link {name} leaves the neighbourhood ({outside[0]} is not in it)"
        if link(a, b) in seen:
            return f"link {name} appears twice"
        seen.add(link(a, b))
        ra, rb = root(a), root(b)
        if ra == rb:
            return f"link {name} closes a cycle"
        parent[ra] = rb
    cut = sorted(v for v in members if root(v) != root(step.master))
    if cut:
        return f"VN {', '.join(cut)} is cut off from master {step.master}"
    return None


def plan_digest(step: Prepare) -> str:
    """A plan's fingerprint (round, master, neighbourhood, links; order does not count)."""
    links = sorted(link(a, b) for a, b in step.links)
    return _digest([step.round, step.master, sorted(step.hood), links])


def tables_digest(round_id: str, held: Mapping[str, Any], sent: Mapping[str, Any]) -> str:
    """The fingerprint of one VN's new tables in wire form (as :class:`Install` carries
    them): equal tables give equal digests in every process."""
    return _digest([round_id, held, sent])


def _digest(value: object) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()


def vouch_quorum(vn_size: int) -> int:
    """Replicas of a VN of ``vn_size`` that must vouch for a table: ``f + 1``, so at least
    one of them is honest."""
    return (vn_size - 1) // 2 + 1


MAX_HOLD_LEASES = 3
"""A lease a round's steps keep renewing still ends this many lease lengths after it was
granted: no master holds a member longer, however many steps it sends."""


@dataclass
class Lease:
    """A neighbourhood lock this broker granted: it ends ``length`` seconds after the
    master's latest step of the round (:meth:`MemberRounds.renew`), and never later than
    ``MAX_HOLD_LEASES`` lengths after ``granted``."""

    round: str
    master: str
    expires: float
    granted: float = 0.0
    length: float = 0.0


@dataclass
class Pending:
    """A round this broker takes part in, between ``prepare`` and ``resume``."""

    round: str
    master: str
    hood: set[str]
    new_neighbours: set[str]
    added: set[str]
    removed: set[str]
    links: tuple[Link, ...] = ()
    digest: str = ""
    frozen: bool = False
    drained: bool = False
    installed: bool = False


@dataclass
class RoundStats:
    """What a broker's master turns did (for ``/reconfig`` and ``/metrics``)."""

    turns: int = 0
    refused: int = 0
    no_plan: int = 0
    applied: int = 0
    partial: int = 0  # installed at some members only: some refused or missed the install
    aborted: int = 0
    requested: int = 0
    links_changed: int = 0
    repaired: int = 0  # times this broker took its siblings' links after missing a round
    marked: int = 0  # streams (publishers, links from outside) read up to a mark at a freeze
    unmarked: int = 0  # streams frozen where they were: no mark within the patience
    saving: float = 0.0
    last_cost_before: float = 0.0
    last_cost_after: float = 0.0


class MemberRounds:
    """One broker's part in other brokers' rounds: at most one lease, one prepared round.

    Locks are never waited for: a busy member refuses at once, so two masters cannot
    deadlock (the refused one retries at its next jittered turn), and a lease whose master
    went silent expires (:meth:`expired`) so the caller can undo what it left half-done.
    """

    def __init__(self, me: str) -> None:
        self.me = me
        self.lease: Lease | None = None
        self.pending: Pending | None = None

    def lock(self, step: Lock, now: float, *, enabled: bool, coordinating: str | None) -> Reply:
        """Grant ``step``'s lease, or refuse at once."""
        if not enabled:
            return Reply(False, f"{self.me} has reconfiguration disabled")
        if self.lease is not None and self.lease.round != step.round:
            return Reply(False, f"{self.me} is locked by master {self.lease.master}")
        if coordinating is not None and coordinating != step.round:
            return Reply(False, f"{self.me} is master of its own round")
        if self.lease is None:
            # Asked again, the lease is not extended: only the round's steps renew it.
            self.lease = Lease(step.round, step.master, now + step.lease, now, step.lease)
        return OK

    def renew(self, round_id: str, now: float) -> float | None:
        """A step of ``round_id`` arrived or ended here at ``now``: its master is alive, so
        the lease runs one length from now (capped; see :data:`MAX_HOLD_LEASES`). Returns
        the new expiry, or None when this broker holds no lease for that round."""
        lease = self.lease
        if lease is None or lease.round != round_id:
            return None
        cap = lease.granted + MAX_HOLD_LEASES * lease.length
        lease.expires = max(lease.expires, min(now + lease.length, cap))
        return lease.expires

    def expired(self, now: float) -> Lease | None:
        """The lease, if it ran out by ``now`` (the caller aborts its round)."""
        lease = self.lease
        return lease if lease is not None and now > lease.expires else None

    def locked_for(self, round_id: str) -> Reply | None:
        """None when this broker holds a lease for ``round_id``, else the refusal."""
        if self.lease is None or self.lease.round != round_id:
            return Reply(False, f"{self.me} holds no lock for round {round_id}")
        return None

    def prepare(self, step: Prepare, vn: str, current: Iterable[str]) -> Pending | Reply:
        """Accept the plan if it is sound from here (:func:`plan_problem`): which neighbour
        VNs this broker's VN gains and loses. Otherwise the refusal, naming why."""
        lease = self.lease
        if lease is not None and lease.master != step.master:
            return Reply(
                False,
                f"{self.me} refuses the plan: it names master {step.master}, "
                f"the lock was granted to {lease.master}",
            )
        current = set(current)
        problem = plan_problem(step, vn, current)
        if problem is not None:
            return Reply(False, f"{self.me} refuses the plan: {problem}")
        new = {y for x, y in step.links if x == vn} | {x for x, y in step.links if y == vn}
        old = current & set(step.hood)
        self.pending = Pending(
            step.round,
            step.master,
            set(step.hood),
            new,
            new - old,
            old - new,
            links=step.links,
            digest=plan_digest(step),
        )
        return self.pending

    def prepared(self, round_id: str) -> Pending | Reply:
        """The prepared round ``round_id``, or the refusal when there is none."""
        pending = self.pending
        if pending is None or pending.round != round_id:
            return Reply(False, f"{self.me} has no prepared round {round_id}")
        return pending

    def finish(self) -> None:
        """The round resumed or was undone: release everything."""
        self.pending = None
        self.lease = None


MARKED_ROUNDS = 8
"""Rounds one sender's markers are kept for at once (its latest)."""


@dataclass
class MarkerBook:
    """Markers received per round: ``(wave, sender)`` and the digest the marker carried
    (the plan's in drain waves 1 and 2, the receiver's tables' in wave 3, the vouch).

    Each sender's markers are kept for its latest :data:`MARKED_ROUNDS` rounds only: a
    round is forgotten when it ends here, but a marker that arrives later (a round that
    ended here first) or names a round that never comes (a faulty neighbour) would
    otherwise stay for good, one sender's flood evicting nobody else's."""

    seen: dict[str, dict[tuple[int, str], str]] = field(default_factory=dict)
    _rounds_of: dict[str, dict[str, None]] = field(default_factory=dict)

    def record(self, round_id: str, wave: int, sender: str, digest: str = "") -> None:
        self.seen.setdefault(round_id, {})[(wave, sender)] = digest
        rounds = self._rounds_of.setdefault(sender, {})
        rounds.pop(round_id, None)
        rounds[round_id] = None  # latest last
        while len(rounds) > MARKED_ROUNDS:
            oldest = next(iter(rounds))
            del rounds[oldest]
            markers = self.seen.get(oldest)
            if markers is None:
                continue
            for key in [k for k in markers if k[1] == sender]:
                del markers[key]
            if not markers:
                del self.seen[oldest]

    def missing(
        self, round_id: str, wave: int, peers: Iterable[str], live: Iterable[str]
    ) -> set[str]:
        """Peers whose link is still up and whose marker of ``wave`` has not come."""
        got = {p for w, p in self.seen.get(round_id, {}) if w == wave}
        up = set(live)
        return {p for p in peers if p not in got and p in up}

    def disagreeing(self, round_id: str, wave: int, digest: str) -> set[str]:
        """Senders whose marker of ``wave`` carried another digest than ``digest``."""
        got = self.seen.get(round_id, {})
        return {p for (w, p), d in got.items() if w == wave and d != digest}

    def vouched_digests(self, round_id: str, wave: int) -> set[str]:
        """The digests some sender's marker of ``wave`` carried last."""
        return {d for (w, _), d in self.seen.get(round_id, {}).items() if w == wave}

    def vouchers(self, round_id: str, wave: int, digest: str, among: Iterable[str]) -> set[str]:
        """Senders in ``among`` whose marker of ``wave`` carried ``digest``."""
        got = self.seen.get(round_id, {})
        return {p for p in among if got.get((wave, p)) == digest}

    def forget(self, round_id: str) -> None:
        self.seen.pop(round_id, None)
