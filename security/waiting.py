"""Shares that wait, bounded per sender (:class:`WaitingShares`).

Pure bookkeeping over plain data, used by brokers (:mod:`broker.daemon.passes`,
:mod:`broker.daemon.shares`) and by the SDK's reconstruction (:mod:`security.pass_shares`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Weight = tuple[str, bytes | None, int, int]
"""What one waiting share costs its sender: (sender, the reference of the statement it came
under or None, that statement's bytes, the share's own bytes)."""

WAITING_BUDGET = 16 << 20
"""Bytes of waiting shares one sender may have by default (a broker's
``max_waiting_share_bytes``, a subscriber's leaves per relay)."""

WAITING_OVERHEAD = 256
"""Bytes a waiting share is charged beyond its data (its tuple, lineage and references)."""


class WaitingShares(Generic[K, V]):
    """Key shares waiting for something that has not come, by key: at a broker per key
    epoch (for the epoch's content, or a path a majority of the sending VN vouches for), at
    a subscriber per statement (the leaves a relay handed it under a statement not seen
    yet).

    Bounded per sender, in bytes: a share is charged its own bytes and, once while any share
    of it waits, the statement it came under; past ``budget`` the sender's further shares are
    refused (the caller drops them). A sender that floods shares for what never comes (a
    client's root passes for publications it never sends, a Byzantine replica's splits or
    leaves) fills its own allowance only, so it never evicts another sender's shares; an
    honest sender's shares wait milliseconds. At most ``keys`` keys are kept, as in every
    per-epoch table: the oldest go, and their charges with them.
    """

    def __init__(self, weigh: Callable[[V], Weight], budget: int, keys: int) -> None:
        self._weigh = weigh
        self.budget = budget
        self.keys = keys
        self._epochs: OrderedDict[K, list[V]] = OrderedDict()
        self._charged: dict[str, int] = {}
        # (sender, statement reference) -> that sender's shares waiting under it
        self._statements: dict[tuple[str, bytes], int] = {}

    def __len__(self) -> int:
        return len(self._epochs)

    def get(self, key: K) -> list[V] | None:
        """``key``'s waiting shares, in arrival order (to read, not to change)."""
        return self._epochs.get(key)

    def charged(self, sender: str) -> int:
        """Bytes ``sender``'s waiting shares are charged."""
        return self._charged.get(sender, 0)

    def add(self, key: K, item: V) -> bool:
        """Keep ``item`` under ``key``; False (nothing kept) when its sender's waiting
        shares would be charged more than the budget."""
        sender, ref, statement_bytes, own = self._weigh(item)
        cost = self._cost(sender, ref, statement_bytes, own)
        if self._charged.get(sender, 0) + cost > self.budget:
            return False
        items = self._epochs.get(key)
        if items is None:
            if len(self._epochs) >= self.keys:
                self._release(self._epochs.popitem(last=False)[1])
                # (it may have let go of this sender's statement: charged less, not more)
                cost = self._cost(sender, ref, statement_bytes, own)
            items = self._epochs[key] = []
        items.append(item)
        self._charged[sender] = self._charged.get(sender, 0) + cost
        if ref is not None:
            self._statements[sender, ref] = self._statements.get((sender, ref), 0) + 1
        return True

    def _cost(self, sender: str, ref: bytes | None, statement_bytes: int, own: int) -> int:
        cost = own + WAITING_OVERHEAD
        if ref is not None and (sender, ref) not in self._statements:
            cost += statement_bytes
        return cost

    def pop(self, key: K) -> list[V]:
        """``key``'s waiting shares, no longer kept (nor charged)."""
        items = self._epochs.pop(key, None)
        if items is None:
            return []
        self._release(items)
        return items

    def _release(self, items: Iterable[V]) -> None:
        charged, statements = self._charged, self._statements
        for item in items:
            sender, ref, statement_bytes, own = self._weigh(item)
            cost = own + WAITING_OVERHEAD
            if ref is not None:
                left = statements[sender, ref] - 1
                if left:
                    statements[sender, ref] = left
                else:
                    del statements[sender, ref]
                    cost += statement_bytes
            rest = charged[sender] - cost
            if rest > 0:
                charged[sender] = rest
            else:
                del charged[sender]
