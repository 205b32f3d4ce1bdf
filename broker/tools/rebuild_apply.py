"""Applying a trust-aware rebuild plan to a running local overlay, one live move at a time.

A plan (:func:`reconfig.rebuild.plan_rebuild`) is a sequence of neighbourhood moves: at master
VN m, replace link m–y by x–y. Each becomes one round of the live OCBR protocol (SPEC §5:
lock, standby links, drain, install, resume; :mod:`broker.daemon.reconfig_agent`), which the
master VN's coordinator (its lowest-numbered live replica) runs when asked with a ``RECONF
move`` request on a control connection. The request is made under that broker's own id: the
operator holds the overlay's configuration, and a broker takes moves from nobody else.

Moves run strictly one after the other. Before the first, the live tree must be the plan's
starting tree; after each, it must be the tree the plan expects, or the plan stops. A refused
or aborted round changes nothing (the protocol undoes a round that did not install), so the
report of a failed move names the move, the reason and the tree the overlay is in, which
this module reads back from the brokers rather than assume.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.daemon.reconfig_agent import ControlChannel
from broker.tools.local import fetch_json, own_link_tls, vn_links
from overlay.tree import TopologyError, Tree
from reconfig.live import RequestedMove
from reconfig.rebuild import Move, apply_moves
from security.errors import TrellisError

__all__ = ["ApplyReport", "MoveOutcome", "apply_moves_live", "live_tree"]


def live_tree(info: Mapping[str, Any], timeout: float = 5.0) -> Tree | None:
    """The VN tree as the running brokers' links say it is (None when no broker answers or
    the links do not form a tree within ``timeout``, e.g. a round's standby link)."""
    vn_of = {b: vn for vn, members in info["vns"].items() for b in members}
    deadline = time.monotonic() + timeout
    while True:
        health = {}
        for broker in info.get("brokers", []):
            try:
                health[broker["id"]] = fetch_json(broker["admin"] + "/healthz")
            except OSError:
                continue
        if not health:
            return None
        try:
            return Tree(info["vns"], vn_links(health, vn_of))
        except (TopologyError, ValueError):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


@dataclass(frozen=True)
class MoveOutcome:
    """What became of one move: applied or not, why, by whom, how long it took."""

    number: int
    move: Move
    ok: bool
    error: str = ""
    coordinator: str = ""
    seconds: float = 0.0
    attempts: int = 1

    def describe(self) -> str:
        m = self.move
        (a, b), (c, d) = m.remove, m.add
        what = f"move {self.number} at {m.master}: {a}-{b} -> {c}-{d}"
        if self.ok:
            return f"{what}: applied by {self.coordinator} in {self.seconds:.2f} s"
        return f"{what}: FAILED after {self.attempts} attempt(s): {self.error}"


@dataclass
class ApplyReport:
    """The result of applying a plan: each move's outcome and the tree the overlay is in."""

    outcomes: list[MoveOutcome] = field(default_factory=list)
    planned: int = 0
    tree_now: Tree | None = None
    as_expected: bool = True
    state: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.as_expected
            and all(o.ok for o in self.outcomes)
            and (len(self.outcomes) == self.planned)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "planned": self.planned,
            "applied": sum(o.ok for o in self.outcomes),
            "seconds": self.seconds,
            "moves": [
                {
                    "number": o.number,
                    **o.move.to_dict(),
                    "ok": o.ok,
                    "error": o.error,
                    "coordinator": o.coordinator,
                    "seconds": o.seconds,
                    "attempts": o.attempts,
                }
                for o in self.outcomes
            ],
            "state": self.state,
            "links_now": (
                [list(lk) for lk in sorted(self.tree_now.links)] if self.tree_now else None
            ),
        }

    def describe(self) -> str:
        lines = [o.describe() for o in self.outcomes]
        applied = sum(o.ok for o in self.outcomes)
        lines.append(
            f"{applied}/{self.planned} move(s) applied in {self.seconds:.2f} s; {self.state}"
        )
        return "\n".join(lines)


async def ask_move(
    info: Mapping[str, Any], move: Move, tag: str, timeout: float
) -> tuple[bool, str, str]:
    """Ask the master VN's coordinator to run ``move``: (applied, error, who answered).

    Replicas are asked in replica order; one that does not answer, or says it is not the
    coordinator (a lower replica is alive), passes the request to the next."""
    endpoints = {b["id"]: b["endpoint"] for b in info["brokers"]}
    request = RequestedMove(move.vn, move.via, tag)
    errors: list[str] = []
    for broker_id in info["vns"].get(move.master, []):
        endpoint = endpoints.get(broker_id)
        if endpoint is None:
            continue
        channel = ControlChannel(broker_id, broker_id, endpoint, own_link_tls(info, broker_id))
        try:
            await channel.open(min(timeout, 2.0))
            reply = await channel.call(request, timeout)
        except (OSError, TrellisError, TimeoutError, asyncio.IncompleteReadError) as exc:
            errors.append(f"{broker_id}: {exc or type(exc).__name__}")
            continue
        finally:
            await channel.close()
        if reply.ok:
            return True, "", broker_id
        if "not the coordinator" in reply.error:
            errors.append(reply.error)
            continue
        return False, reply.error, broker_id
    return False, "; ".join(errors) or f"no broker of VN {move.master} is known", ""


def _transient(error: str) -> bool:
    """A refusal worth one more try: a lock held by another round, a busy coordinator."""
    return "locked by" in error or "busy with" in error or "master of its own round" in error


async def apply_moves_live(
    info: Mapping[str, Any],
    before: Tree,
    moves: Sequence[Move],
    *,
    tag: str = "rebuild",
    timeout: float = 30.0,
    retries: int = 2,
    settle: float = 5.0,
) -> ApplyReport:
    """Run ``moves`` on the overlay ``info`` (``overlay.json``), one round each, in order.

    Stops at the first move that fails (after ``retries`` more tries of a transient
    refusal), or as soon as the live tree is not the one the plan expects. The report's
    ``state`` says where the overlay stands, as read back from the brokers."""
    started = time.monotonic()
    report = ApplyReport(planned=len(moves))
    expected = before
    now = await asyncio.to_thread(live_tree, info)
    if now is None or now.links != before.links:
        report.tree_now, report.as_expected = now, False
        report.state = (
            "nothing applied: the overlay's live tree is not the plan's starting tree "
            "(it changed since the plan was made, or brokers do not answer)"
        )
        report.seconds = time.monotonic() - started
        return report
    for number, move in enumerate(moves, 1):
        try:
            (target,) = apply_moves(expected, [move])
        except TopologyError as exc:
            report.outcomes.append(MoveOutcome(number, move, False, f"not asked: {exc}"))
            report.tree_now = expected
            report.state = (
                f"stopped at move {number}: it is not a neighbourhood move of the tree the "
                f"plan expects there; the overlay is as it was before it"
            )
            report.seconds = time.monotonic() - started
            return report
        attempt, t0 = 0, time.monotonic()
        while True:
            attempt += 1
            ok, error, who = await ask_move(
                info, move, f"{tag} move {number}/{len(moves)}", timeout
            )
            if ok or attempt > retries or not _transient(error):
                break
            await asyncio.sleep(0.5 * attempt)
        outcome = MoveOutcome(number, move, ok, error, who, time.monotonic() - t0, attempt)
        report.outcomes.append(outcome)
        now = await asyncio.to_thread(_settled_tree, info, target if ok else expected, settle)
        report.tree_now = now
        if ok and now is not None and now.links == target.links:
            expected = target
            continue
        if now is not None and now.links == expected.links:
            report.state = (
                f"stopped at move {number}; the overlay is as it was before that move "
                f"({number - 1} move(s) of the plan applied)"
            )
        else:
            report.as_expected = False
            report.state = (
                f"stopped at move {number}; the overlay's live tree is neither the tree "
                f"before nor after that move: "
                + (" ".join(f"{a}-{b}" for a, b in sorted(now.links)) if now else "unreadable")
            )
        report.seconds = time.monotonic() - started
        return report
    report.state = "the overlay is on the planned tree"
    report.seconds = time.monotonic() - started
    return report


def _settled_tree(info: Mapping[str, Any], want: Tree, settle: float) -> Tree | None:
    """The live tree, asked again for up to ``settle`` s until it is ``want`` (removed
    links close just after a round resumes)."""
    deadline = time.monotonic() + settle
    while True:
        now = live_tree(info)
        if (now is not None and now.links == want.links) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)
