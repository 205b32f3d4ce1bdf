"""Advertisement-based content routing of one broker, sans-I/O (SPEC §2).

The subscription routing table (SRT) holds ``[advertisement, last hop]``; the publication
routing table (PRT) holds ``[subscription, last hop]``. A *hop* is whatever object the
server uses for a connection (a local client or a neighbour broker); the router only asks
``hop.is_broker`` and ``hop.peer_id``. Every state change returns the control messages to
send as ``(hop, message)`` pairs, so the whole routing logic is tested without sockets.

Rules:

* advertisements flood the tree;
* a subscription goes only toward the last hops of advertisements it intersects, and not
  on a link where a subscription already forwarded covers it; forwarding a subscription
  retracts the ones it strictly covers on that link, and removing a coverer re-forwards
  what it had been hiding;
* a publication goes only toward last hops of subscriptions it matches, never back;
* losing a neighbour withdraws everything learned through it, as if it had unadvertised
  and unsubscribed; a returning neighbour is resynchronised from scratch;
* announcing an entry again, unchanged, from the same hop changes nothing (after a live
  reconfiguration a neighbour may re-send what this broker already installed);
* a live reconfiguration (SPEC §5) replaces the state of the neighbourhood's links wholesale:
  :func:`hood_routing` computes it at the master, :meth:`Router.install_hood` installs it at
  every member without a message to the links that did not change, except where the set of
  entries the member holds really changed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from broker.language.filters import Filter, Value
from broker.routing.covering import ForwardedFilters
from broker.routing.matching import MatchIndex
from broker.wire.protocol import Advertise, Message, Subscribe, Unadvertise, Unsubscribe


class HopLike(Hashable, Protocol):
    @property
    def is_broker(self) -> bool: ...

    @property
    def peer_id(self) -> str | None: ...


H = TypeVar("H", bound=HopLike)
Actions = list[tuple[H, Message]]
Owned = dict[str, tuple[Filter, str]]
"""Entries by overlay-wide key, with the neighbourhood node whose region they come from."""
LinkState = tuple[dict[str, Filter], dict[str, Filter]]
"""What one directed link carries: (advertisements, subscriptions) by overlay-wide key."""
LinkTables = dict[str, tuple[LinkState, dict[str, Filter]]]
"""Per neighbour: what the broker holds from it, and the subscriptions forwarded to it."""


@dataclass(slots=True)
class HopState:
    """What one hop has advertised and subscribed, by the keys the hop used."""

    advertisements: dict[str, Filter] = field(default_factory=dict)
    subscriptions: dict[str, Filter] = field(default_factory=dict)
    # Subscriptions (by global key) this broker has forwarded to the hop.
    forwarded: ForwardedFilters = field(default_factory=ForwardedFilters)
    last_match: Filter | None = None


class Router(Generic[H]):
    """SRT, PRT and per-link forwarding state of one broker."""

    def __init__(self, broker_id: str, covering: bool = True) -> None:
        self.broker_id = broker_id
        self.covering = covering
        self._prt: MatchIndex[tuple[H, str]] = MatchIndex()
        self._hops: dict[H, HopState] = {}
        self._neighbours: list[H] = []

    # -- naming ---------------------------------------------------------------------------

    def global_key(self, hop: H, key: str) -> str:
        """Overlay-wide name of an advertisement or subscription made by a local client."""
        return key if hop.is_broker else f"{self.broker_id}/{hop.peer_id}/{key}"

    def _state(self, hop: H) -> HopState:
        state = self._hops.get(hop)
        if state is None:
            state = self._hops[hop] = HopState()
        return state

    # -- neighbours -----------------------------------------------------------------------

    @property
    def neighbours(self) -> list[H]:
        return list(self._neighbours)

    def add_neighbour(self, hop: H) -> Actions[H]:
        """A link came up: tell the neighbour every advertisement we know of."""
        if hop in self._neighbours:
            return []
        self._neighbours.append(hop)
        self._state(hop)
        actions: Actions[H] = []
        for src, state in self._hops.items():
            if src is not hop:
                for key, flt in state.advertisements.items():
                    actions.append((hop, Advertise(0, self.global_key(src, key), flt)))
        return actions

    def state_for(self, hop: H) -> list[Message]:
        """What a neighbour should hold from us: every advertisement not learned from it,
        and the subscriptions forwarded to it (sent to a replica that joins late)."""
        messages: list[Message] = []
        for src, state in self._hops.items():
            if src is not hop:
                for key, flt in state.advertisements.items():
                    messages.append(Advertise(0, self.global_key(src, key), flt))
        for gkey, flt in self._state(hop).forwarded.items():
            messages.append(Subscribe(0, gkey, flt))
        return messages

    def remove_hop(self, hop: H) -> Actions[H]:
        """A client left or a link went down: withdraw everything learned through it."""
        state = self._hops.get(hop)
        if hop in self._neighbours:
            self._neighbours.remove(hop)
        if state is None:
            return []
        actions: Actions[H] = []
        # Withdraw them all, then re-forward once per link what they covered (per
        # subscription, a client leaving with n of them would cost n passes over the PRT).
        withdrawn_on: set[H] = set()
        for key in list(state.subscriptions):
            actions += self._unsubscribe(hop, key, withdrawn_on)
        for n in self._neighbours:
            if n in withdrawn_on:
                actions += self._forward_pending(n)
        for key in list(state.advertisements):
            actions += self.unadvertise(hop, key)
        del self._hops[hop]
        return actions

    # -- advertisements (SRT) -------------------------------------------------------------

    def advertise(self, hop: H, key: str, flt: Filter) -> Actions[H]:
        """Record an advertisement, flood it, and pull subscriptions toward it."""
        state = self._state(hop)
        actions: Actions[H] = []
        if key in state.advertisements:
            if state.advertisements[key] == flt:
                return actions
            actions += self.unadvertise(hop, key)
        state.advertisements[key] = flt
        gkey = self.global_key(hop, key)
        for n in self._neighbours:
            if n is not hop:
                actions.append((n, Advertise(0, gkey, flt)))
        if hop.is_broker:
            actions += self._forward_pending(hop)
        return actions

    def unadvertise(self, hop: H, key: str) -> Actions[H]:
        """Remove an advertisement and flood the removal; [] when it was unknown."""
        state = self._hops.get(hop)
        if state is None or state.advertisements.pop(key, None) is None:
            return []
        state.last_match = None
        gkey = self.global_key(hop, key)
        actions: Actions[H] = [(n, Unadvertise(0, gkey)) for n in self._neighbours if n is not hop]
        if hop.is_broker:
            actions += self._retract_unneeded(hop)
        return actions

    def knows_advertisement(self, hop: H, key: str) -> bool:
        return self.advertisement(hop, key) is not None

    def advertisement(self, hop: H, key: str) -> Filter | None:
        """The filter of ``hop``'s advertisement ``key``, if it holds one."""
        state = self._hops.get(hop)
        return None if state is None else state.advertisements.get(key)

    def is_advertised(self, hop: H, attrs: Mapping[str, Value]) -> bool:
        """Whether a publication from ``hop`` falls inside one of its advertisements."""
        state = self._hops.get(hop)
        if state is None:
            return False
        # Publishers mostly publish within the advertisement they used last: try it first.
        last = state.last_match
        if last is not None and last.matches(attrs):
            return True
        for adv in state.advertisements.values():
            if adv.matches(attrs):
                state.last_match = adv
                return True
        return False

    # -- subscriptions (PRT) --------------------------------------------------------------

    def subscribe(self, hop: H, key: str, flt: Filter) -> Actions[H]:
        """Record a subscription and forward it toward intersecting advertisements."""
        state = self._state(hop)
        actions: Actions[H] = []
        if key in state.subscriptions:
            if state.subscriptions[key] == flt:
                return actions
            actions += self.unsubscribe(hop, key)
        state.subscriptions[key] = flt
        self._prt.add((hop, key), flt)
        gkey = self.global_key(hop, key)
        for n in self._neighbours:
            if n is not hop and self._wanted_by(n, flt):
                actions += self._forward(n, gkey, flt)
        return actions

    def unsubscribe(self, hop: H, key: str) -> Actions[H]:
        """Remove a subscription, withdraw it where forwarded, re-forward what it covered."""
        withdrawn_on: set[H] = set()
        actions = self._unsubscribe(hop, key, withdrawn_on)
        for n in self._neighbours:
            if n in withdrawn_on:
                actions += self._forward_pending(n)
        return actions

    def _unsubscribe(self, hop: H, key: str, withdrawn_on: set[H]) -> Actions[H]:
        """Remove a subscription and withdraw it where forwarded; adds those neighbours to
        ``withdrawn_on`` (what it covered there must be re-forwarded)."""
        state = self._hops.get(hop)
        if state is None or state.subscriptions.pop(key, None) is None:
            return []
        self._prt.remove((hop, key))
        gkey = self.global_key(hop, key)
        actions: Actions[H] = []
        for n in self._neighbours:
            if n is not hop and self._hops[n].forwarded.pop(gkey, None) is not None:
                actions.append((n, Unsubscribe(0, gkey)))
                withdrawn_on.add(n)
        return actions

    def held_by(self, hop: H) -> tuple[int, int]:
        """How many (advertisements, subscriptions) ``hop`` holds (for per-client limits)."""
        state = self._hops.get(hop)
        return (0, 0) if state is None else (len(state.advertisements), len(state.subscriptions))

    def held_keys(self, hop: H) -> tuple[list[str], list[str]]:
        """The ids of the advertisements and of the subscriptions ``hop`` holds."""
        state = self._hops.get(hop)
        if state is None:
            return [], []
        return list(state.advertisements), list(state.subscriptions)

    def knows_subscription(self, hop: H, key: str) -> bool:
        state = self._hops.get(hop)
        return state is not None and key in state.subscriptions

    # -- forwarding decisions -------------------------------------------------------------

    def _wanted_by(self, n: H, flt: Filter) -> bool:
        """Whether neighbour ``n`` has advertised anything ``flt`` could match."""
        return any(adv.intersects(flt) for adv in self._hops[n].advertisements.values())

    def _forward(self, n: H, gkey: str, flt: Filter) -> Actions[H]:
        forwarded = self._hops[n].forwarded
        if gkey in forwarded:
            return []
        if self.covering and any(f.covers(flt) for f in forwarded.coverers(flt)):
            return []
        actions: Actions[H] = [(n, Subscribe(0, gkey, flt))]
        if self.covering:
            for other, g in forwarded.covered(flt):
                if flt.covers(g) and not g.covers(flt):
                    del forwarded[other]
                    actions.append((n, Unsubscribe(0, other)))
        forwarded[gkey] = flt
        return actions

    def _subscriptions_not_from(self, n: H) -> Iterator[tuple[str, Filter]]:
        for hop, state in self._hops.items():
            if hop is not n:
                for key, flt in state.subscriptions.items():
                    yield self.global_key(hop, key), flt

    def _forward_pending(self, n: H) -> Actions[H]:
        """Forward to ``n`` every subscription it now needs and has not got (nor a coverer)."""
        if n not in self._neighbours:
            return []
        actions: Actions[H] = []
        forwarded = self._hops[n].forwarded
        # Coverers first, so the subscriptions they cover need not travel at all.
        candidates = [
            (g, f)
            for g, f in self._subscriptions_not_from(n)
            if g not in forwarded and self._wanted_by(n, f)
        ]
        candidates.sort(key=lambda item: len(item[1].predicates))
        for gkey, flt in candidates:
            actions += self._forward(n, gkey, flt)
        return actions

    def _retract_unneeded(self, n: H) -> Actions[H]:
        """Withdraw subscriptions from ``n`` that no longer meet any of its advertisements."""
        forwarded = self._hops[n].forwarded
        actions: Actions[H] = []
        for gkey, flt in list(forwarded.items()):
            if not self._wanted_by(n, flt):
                del forwarded[gkey]
                actions.append((n, Unsubscribe(0, gkey)))
        return actions

    # -- publications ---------------------------------------------------------------------

    def route(self, attrs: Mapping[str, Value], source: H) -> dict[H, list[str]]:
        """Hops a publication goes to, with their matching subscription keys; never back."""
        targets: dict[H, list[str]] = {}
        for hop, key in self._prt.match(attrs):
            if hop is source and hop.is_broker:
                continue
            keys = targets.get(hop)
            if keys is None:
                targets[hop] = [key]
            else:
                keys.append(key)
        return targets

    # -- live reconfiguration -------------------------------------------------------------

    def owned_entries(self, me: str) -> tuple[Owned, Owned]:
        """Every advertisement and subscription held, by overlay-wide key, with the node
        it comes from: the neighbour it was learned from, or ``me`` for local clients.

        At the master of a neighbourhood these are exactly the entries that cross the
        neighbourhood (its star), which is what :func:`hood_routing` needs.
        """
        adverts: Owned = {}
        subs: Owned = {}
        for hop, state in self._hops.items():
            owner = hop.peer_id if hop.is_broker and hop.peer_id is not None else me
            for key, flt in state.advertisements.items():
                adverts[self.global_key(hop, key)] = (flt, owner)
            for key, flt in state.subscriptions.items():
                subs[self.global_key(hop, key)] = (flt, owner)
        return adverts, subs

    def install_hood(
        self,
        hood: Iterable[str],
        hops: Mapping[str, H],
        held: Mapping[str, LinkState],
        sent: Mapping[str, dict[str, Filter]],
    ) -> Actions[H]:
        """Replace the state of every neighbourhood link by the planned one.

        Args:
            hood: the VNs of the neighbourhood being rearranged.
            hops: this broker's neighbourhood neighbours after the change, by VN.
            held: per new neighbour, what this broker holds from it.
            sent: per new neighbour, the subscriptions this broker has forwarded to it.

        Links outside the neighbourhood hear only of entries this broker gained or lost
        as a whole (additions first, so no publication meets a gap); the neighbourhood's
        own links need no message: both ends install the same plan.
        """
        hood = set(hood)
        old_adv: dict[str, Filter] = {}
        old_sub: dict[str, Filter] = {}
        for hop in [n for n in self._neighbours if n.peer_id in hood]:
            state = self._hops.pop(hop, None)
            self._neighbours.remove(hop)
            if state is None:
                continue
            old_adv.update(state.advertisements)
            old_sub.update(state.subscriptions)
            for key in state.subscriptions:
                self._prt.remove((hop, key))
        new_adv: dict[str, Filter] = {}
        new_sub: dict[str, Filter] = {}
        for vn, hop in hops.items():
            adverts, subs = held.get(vn, ({}, {}))
            forwarded = ForwardedFilters(sent.get(vn, {}))
            self._hops[hop] = HopState(dict(adverts), dict(subs), forwarded)
            self._neighbours.append(hop)
            for key, flt in subs.items():
                self._prt.add((hop, key), flt)
            new_adv.update(adverts)
            new_sub.update(subs)
        outside = [n for n in self._neighbours if n.peer_id not in hood]
        actions: Actions[H] = []
        for key, flt in new_adv.items():
            if old_adv.get(key) != flt:
                actions += [(n, Advertise(0, key, flt)) for n in outside]
        for key, flt in new_sub.items():
            if old_sub.get(key) != flt:
                for n in outside:
                    if self._wanted_by(n, flt):
                        actions += self._forward(n, key, flt)
        for n in outside:
            withdrawn = False
            for key in old_sub.keys() - new_sub.keys():
                if self._hops[n].forwarded.pop(key, None) is not None:
                    actions.append((n, Unsubscribe(0, key)))
                    withdrawn = True
            if withdrawn:
                actions += self._forward_pending(n)
            actions += [(n, Unadvertise(0, key)) for key in old_adv.keys() - new_adv.keys()]
        return actions

    def link_tables(self) -> LinkTables:
        """Per neighbour (by peer id): what this broker holds from it and the subscriptions
        it has forwarded to it, in the form :meth:`install_hood` takes: a replica that
        missed a round installs what its siblings hold (they share one router state)."""
        return {
            str(hop.peer_id): (
                (dict(state.advertisements), dict(state.subscriptions)),
                dict(state.forwarded),
            )
            for hop, state in self._hops.items()
            if hop in self._neighbours
        }

    # -- introspection --------------------------------------------------------------------

    @property
    def prt_size(self) -> int:
        return len(self._prt)

    @property
    def srt_size(self) -> int:
        return sum(len(s.advertisements) for s in self._hops.values())

    def forwarded_to(self, n: H) -> dict[str, Filter]:
        return dict(self._hops[n].forwarded) if n in self._hops else {}


def reduce_covered(candidates: Iterable[tuple[str, Filter]]) -> dict[str, Filter]:
    """The subscriptions a link carries once covering has removed what others cover.

    Coverers are taken first (fewest predicates, then key, so the result is the same
    wherever it is computed); a subscription covered by one already kept is dropped.
    """
    kept: dict[str, Filter] = {}
    for key, flt in sorted(candidates, key=lambda kv: (len(kv[1].predicates), kv[0])):
        if not any(f.covers(flt) for f in kept.values()):
            kept[key] = flt
    return kept


def hood_routing(
    adverts: Owned,
    subs: Owned,
    links: Iterable[tuple[str, str]],
    *,
    covering: bool = True,
) -> dict[tuple[str, str], LinkState]:
    """What every directed link of a neighbourhood's new tree carries (SPEC §5).

    ``adverts`` and ``subs`` are the master's entries with their owners
    (:meth:`Router.owned_entries`): every entry that can cross the neighbourhood. Over the
    link x→y travel the advertisements owned on x's side, and the subscriptions owned on
    x's side that intersect an advertisement owned on y's side (reduced by covering).
    """
    adjacency: dict[str, set[str]] = {}
    for a, b in links:
        adjacency.setdefault(a, set()).add(b)
        adjacency.setdefault(b, set()).add(a)

    def side(start: str, away_from: str) -> set[str]:
        seen = {start}
        stack = [start]
        while stack:
            for nxt in adjacency[stack.pop()]:
                if nxt not in seen and nxt != away_from:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    result: dict[tuple[str, str], LinkState] = {}
    for a, b in links:
        for x, y in ((a, b), (b, a)):
            near, far = side(x, y), side(y, x)
            far_adverts = [f for f, owner in adverts.values() if owner in far]
            carried = {k: f for k, (f, owner) in adverts.items() if owner in near}
            wanted = [
                (k, f)
                for k, (f, owner) in subs.items()
                if owner in near and any(adv.intersects(f) for adv in far_adverts)
            ]
            result[(x, y)] = (carried, reduce_covered(wanted) if covering else dict(wanted))
    return result
