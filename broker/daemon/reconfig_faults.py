"""A Byzantine reconfiguration coordinator on demand, for tests: what it can and cannot do.

``byzantine = misplan`` or ``mistable`` in a broker's config makes the daemon build its
reconfiguration agent from :class:`MisplanningAgent` or :class:`MistablingAgent`, which
override the agent's proposal hooks. An honest broker never runs a line of this module.

A misplanning coordinator takes its master turns like an honest one (lock, plan from its
traffic) and then proposes, round after round, one of four wrong plans:

* ``cycle``: the honest tree plus one more link, closing a cycle;
* ``drop``: a tree over the neighbourhood without one of the master's neighbour VNs;
* ``stranger``: the honest tree plus a link from the master to a VN outside the
  neighbourhood (one of its directory, or a made-up one);
* ``equivocate``: the honest plan to every member but one sibling replica, which gets the
  current star (both are sound trees, so each member accepts what it got).

It also sends every member empty tables at install. It accepts its own plans (it does not
check them, as an honest member would). Every honest member checks a plan against its own
view and refuses the first three (:func:`reconfig.live.plan_problem`); the equivocation
shows in the drain markers, which carry each member's plan digest, so the freeze fails.
Either way the round aborts.

A mistabling coordinator proposes the honest plan and sends every member wrong tables at
install: each VN's subscriptions all held from one neighbour (or none, with one), which would
route publications away from their subscribers; it vouches for those tables too. Members
never install tables only the coordinator sent (replicas of the master VN compute their own;
the others take what f + 1 of them vouched for), so the round applies the plan with the
right tables. It also never sends ``install`` or ``resume`` to one member of another VN (the
largest id of the neighbourhood); that member, drained, installs what f + 1 replicas of the
master VN vouched for when its lease ends, instead of going back alone. The next largest
hears ``install`` but never ``resume``: installed, it goes forward when its lease ends.

A replica that goes back (``byzantine = goes-back``, :class:`GoingBackAgent`) is not a
coordinator but a member that fails every round's install and goes back at its end, as a
replica restarted a moment before a round (its new links not all up yet) does, or one whose
lease ran out before the vouches came. Its siblings switch without it; what brings it back
in line is the honest repair every replica runs (:meth:`ReconfigAgent.repair_from_siblings`):
it takes the links and tables f + 1 of its siblings keep.

A slow replica of the master VN (``byzantine = slow-install``, :class:`SlowInstallAgent`) is
honest but computes its tables at install for longer than its lease: the lease ends, it goes
back, and it must then neither vouch for the tables nor switch to them when they are ready
(it did: members switched on its vouches while it stayed, and it switched after going back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from broker.daemon.config import BrokerConfig
from broker.daemon.reconfig_agent import ControlChannel, Neighbourhood, ReconfigAgent, WireTables
from overlay.tree import Link, link
from reconfig.live import OK, Install, Pending, Prepare, Reply, Step, plan_digest

MISPLANS = ("cycle", "drop", "stranger", "equivocate")


class MisplanningAgent(ReconfigAgent):
    """A coordinator that proposes wrong plans and wrong tables (``byzantine = misplan``)."""

    def __init__(self, hood: Neighbourhood, config: BrokerConfig) -> None:
        super().__init__(hood, config.reconfig)
        self.proposals = 0
        self._other_plan: Prepare | None = None

    def propose_plan(self, hood: list[str], planned: list[Link]) -> tuple[list[str], list[Link]]:
        kind = MISPLANS[self.proposals % len(MISPLANS)]
        self.proposals += 1
        master = self.hood.vn
        self._other_plan = None
        if kind == "equivocate":
            star = [link(master, vn) for vn in hood if vn != master]
            round_id = self.coordinating or ""
            self._other_plan = Prepare("prepare", round_id, master, tuple(hood), tuple(star))
            return hood, planned
        if kind == "cycle":
            present = {link(a, b) for a, b in planned}
            extra = next(
                link(a, b) for a in hood for b in hood if a < b and link(a, b) not in present
            )
            return hood, [*planned, extra]
        if kind == "drop":
            kept = hood[:-1]
            return kept, [link(master, vn) for vn in kept if vn != master]
        strangers = sorted(
            n.vn_id for n in self.hood.directory.values() if n.vn_id not in set(hood)
        )
        far = strangers[0] if strangers else f"{master}-elsewhere"
        return hood, [*planned, link(master, far)]

    def propose_tables(self, tables: WireTables) -> WireTables:
        return {vn: ({}, {}) for vn in tables}

    async def _all(self, channels: list[ControlChannel], step: Step) -> list[Reply]:
        other = self._other_plan
        if not isinstance(step, Prepare) or other is None or not channels:
            return await super()._all(channels, step)
        # A sibling replica gets the other plan when there is one: neighbours' links line up
        # either way, so only the plan digests in the drain markers can tell.
        siblings = [c for c in channels if self.hood.directory[c.peer].vn_id == self.hood.vn]
        odd = (siblings or channels)[-1]
        rest = [c for c in channels if c is not odd]
        return [*await super()._all(rest, step), await self._call(odd, other)]

    def _prepare(self, step: Prepare) -> Reply:
        if step.round != self.coordinating:
            return super()._prepare(step)
        # Its own plan: taken without the check an honest member makes.
        h = self.hood
        vn = h.vn
        new = {b for a, b in step.links if a == vn} | {a for a, b in step.links if b == vn}
        old = set(h.neighbour_vns()) & set(step.hood)
        self.member.pending = Pending(
            step.round,
            step.master,
            set(step.hood),
            new,
            new - old,
            old - new,
            links=step.links,
            digest=plan_digest(step),
        )
        self.markers.forget(step.round)
        return OK


class MistablingAgent(ReconfigAgent):
    """A coordinator that sends tables routing subscriptions away (``byzantine =
    mistable``), and vouches for them as a replica of the master VN."""

    _left_out = ""
    _unresumed = ""

    def _vouch(self, pending: Pending, tables: WireTables) -> None:
        super()._vouch(pending, self.propose_tables(tables))

    async def _install_on(self, channel: ControlChannel, step: Install) -> Reply:
        # One member of another VN never hears install or resume (left frozen and drained),
        # the next one never hears resume (left frozen, installed). (Here, not in _call:
        # tables in parts are installed by requests of their own.)
        pending = self.member.pending
        hood = pending.hood - {self.hood.vn} if pending is not None else set()
        members = sorted(p for p, n in self.hood.directory.items() if n.vn_id in hood)
        self._left_out = members[-1] if members else ""
        self._unresumed = members[-2] if len(members) > 1 else ""
        if channel.peer == self._left_out:
            return OK
        return await super()._install_on(channel, step)

    async def _call(self, channel: ControlChannel, step: Step) -> Reply:
        if step.op == "resume" and channel.peer in (self._left_out, self._unresumed):
            return OK
        return await super()._call(channel, step)

    def propose_tables(self, tables: WireTables) -> WireTables:
        wrong: WireTables = {}
        for vn, (held, sent) in tables.items():
            subs = {k: f for entry in held.values() for k, f in entry["sub"].items()}
            sides = sorted(held)
            moved = {
                x: {"adv": entry["adv"], "sub": subs if x == sides[0] and len(sides) > 1 else {}}
                for x, entry in held.items()
            }
            wrong[vn] = (moved, {y: {} for y in sent})
        return wrong


class GoingBackAgent(ReconfigAgent):
    """A member that fails every install and never goes forward (``byzantine = goes-back``)."""

    async def handle(self, step: Step) -> Reply:
        if isinstance(step, Install):
            return Reply(False, f"{self.hood.broker_id}: install failed (goes-back)")
        return await super().handle(step)

    def _go_forward(self, pending: Pending) -> bool:
        return False


class SlowInstallAgent(ReconfigAgent):
    """A replica of the master VN whose install computes its tables for one lease and a
    second (``byzantine = slow-install``), as on a machine so loaded that the thread pool
    answered that late: its lease ends meanwhile and it goes back."""

    async def tables(self, new_links: Sequence[Link]) -> WireTables:
        if self.coordinating is None:  # a member's install, not its own round's plan
            await asyncio.sleep(self.settings.lock_lease + 1.0)
        return await super().tables(new_links)


def reconfig_agent(hood: Neighbourhood, config: BrokerConfig) -> ReconfigAgent:
    """The broker's reconfiguration agent: honest, or faulty for ``byzantine = misplan``,
    ``mistable``, ``goes-back`` or ``slow-install``."""
    if config.byzantine == "goes-back":
        return GoingBackAgent(hood, config.reconfig)
    if config.byzantine == "slow-install":
        return SlowInstallAgent(hood, config.reconfig)
    if config.byzantine == "misplan":
        return MisplanningAgent(hood, config)
    if config.byzantine == "mistable":
        return MistablingAgent(hood, config.reconfig)
    return ReconfigAgent(hood, config.reconfig)
