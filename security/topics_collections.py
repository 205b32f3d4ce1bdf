"""Collections: owner-limited trees of collections with topics as leaves.

A collection holds topics (by UUID) and sub-collections; a topic or a collection may
belong to several collections, so the structure is a directed acyclic graph and every
collection sees the tree below it. The owner sets limits that hold for everything below:

- ``max_breadth``: members (topics and sub-collections) of one collection;
- ``max_depth``: levels of sub-collections below it (0: topics only);
- ``max_topics``: distinct topics anywhere below it;
- ``fixed``: its sub-collections are given at creation and never change (topics may).

Adding anything checks the limits of the collection *and of every collection above it*, so
no addition deep down can break a limit set higher up. The owner and the editors it names
may add and remove; who may discover a collection (and so watch its change notifications)
is its ``discoverers`` list (None: anyone). Collections are named by UUIDs a TDN assigns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from security.errors import InvalidRequest, NotAuthorized
from security.topics import ANYONE

__all__ = [
    "Change",
    "Collection",
    "CollectionError",
    "CollectionLimitExceeded",
    "CollectionLimits",
    "CollectionRegistry",
    "NotAllowedToEdit",
]


class CollectionError(InvalidRequest):
    """A collection operation is impossible (unknown collection, cycle, fixed structure).

    Attributes:
        collection: the collection the rule belongs to.
    """

    code = "collection"

    def __init__(self, message: str, collection: str = "") -> None:
        super().__init__(message)
        self.collection = collection


class CollectionLimitExceeded(CollectionError):
    """An addition breaks an owner's limit.

    Attributes:
        limit: ``max_breadth``, ``max_depth`` or ``max_topics``; value: the limit.
    """

    def __init__(self, message: str, collection: str, limit: str, value: int) -> None:
        super().__init__(message, collection)
        self.limit = limit
        self.value = value


class NotAllowedToEdit(NotAuthorized):
    """The requester is neither the collection's owner nor one of its editors."""


@dataclass(frozen=True)
class CollectionLimits:
    max_breadth: int | None = None
    max_depth: int | None = None
    max_topics: int | None = None
    fixed: bool = False


@dataclass
class Collection:
    id: str
    owner: str
    name: str
    limits: CollectionLimits = field(default_factory=CollectionLimits)
    editors: tuple[str, ...] = ()
    discoverers: tuple[str, ...] | None = None
    topics: set[str] = field(default_factory=set)
    subcollections: set[str] = field(default_factory=set)

    def may_edit(self, principal: str) -> bool:
        return principal == self.owner or ANYONE in self.editors or principal in self.editors

    def may_discover(self, principal: str) -> bool:
        return (
            principal == self.owner
            or self.discoverers is None
            or ANYONE in self.discoverers
            or principal in self.discoverers
        )


@dataclass(frozen=True)
class Change:
    """One change of a collection, as its notification topic carries it."""

    collection: str
    op: str  # "add" or "remove"
    kind: str  # "topic" or "collection"
    member: str


class CollectionRegistry:
    """Every collection a TDN holds, with the limit and permission rules."""

    def __init__(self) -> None:
        self._by_id: dict[str, Collection] = {}
        self._parents: dict[str, set[str]] = {}  # member (topic or collection) -> collections

    def get(self, cid: str) -> Collection:
        try:
            return self._by_id[cid]
        except KeyError:
            raise CollectionError(f"no collection {cid}", cid) from None

    def create(
        self,
        cid: str,
        owner: str,
        name: str,
        limits: CollectionLimits,
        *,
        editors: tuple[str, ...] = (),
        discoverers: tuple[str, ...] | None = None,
        subcollections: tuple[str, ...] = (),
    ) -> Collection:
        """A new collection (for a fixed one, with its sub-collections).

        Raises:
            CollectionError: the id is taken, or a sub-collection is unknown.
            CollectionLimitExceeded: the sub-collections break a limit.
            NotAllowedToEdit: ``owner`` may not add one of the sub-collections.
        """
        if cid in self._by_id:
            raise CollectionError(f"collection {cid} exists already", cid)
        for limit in (limits.max_breadth, limits.max_depth, limits.max_topics):
            if limit is not None and (isinstance(limit, bool) or limit < 0):
                raise InvalidRequest("collection limits must be non-negative integers")
        made = Collection(cid, owner, name, limits, tuple(editors), discoverers)
        self._by_id[cid] = made
        try:
            for sub in subcollections:
                self._add(cid, sub, "collection", owner, creating=True)
        except BaseException:
            self._drop(cid)
            raise
        return made

    def _drop(self, cid: str) -> None:
        gone = self._by_id.pop(cid)
        for sub in gone.subcollections:
            self._parents.get(sub, set()).discard(cid)

    def above(self, cid: str) -> list[tuple[str, int]]:
        """``cid`` and every collection above it, each with its distance (0 for ``cid``),
        the longest distance when several paths lead up."""
        dist: dict[str, int] = {cid: 0}
        frontier = [cid]
        while frontier:
            nxt = []
            for c in frontier:
                for parent in self._parents.get(c, ()):
                    if dist.get(parent, -1) < dist[c] + 1:
                        dist[parent] = dist[c] + 1
                        nxt.append(parent)
            frontier = nxt
        return sorted(dist.items(), key=lambda item: item[1])

    def height(self, cid: str) -> int:
        """Levels of sub-collections below ``cid``."""
        subs = self._by_id[cid].subcollections
        return 1 + max(self.height(s) for s in subs) if subs else 0

    def all_topics(self, cid: str) -> set[str]:
        col = self.get(cid)
        found = set(col.topics)
        for sub in col.subcollections:
            found |= self.all_topics(sub)
        return found

    def add(self, cid: str, member: str, kind: str, requester: str) -> Change:
        """Add a topic (``kind`` "topic") or a sub-collection ("collection") to ``cid``.

        Raises:
            NotAllowedToEdit, CollectionError, CollectionLimitExceeded.
        """
        return self._add(cid, member, kind, requester)

    def _add(
        self, cid: str, member: str, kind: str, requester: str, *, creating: bool = False
    ) -> Change:
        col = self.get(cid)
        if not col.may_edit(requester):
            raise NotAllowedToEdit(f"only the owner or an editor may change collection {cid}")
        if kind not in ("topic", "collection"):
            raise InvalidRequest(f"kind must be 'topic' or 'collection', got {kind!r}")
        into = col.topics if kind == "topic" else col.subcollections
        if member in into:
            return Change(cid, "add", kind, member)
        above = self.above(cid)
        if kind == "collection":
            if col.limits.fixed and not creating:
                raise CollectionError(
                    f"collection {cid} has a fixed structure: its sub-collections are set "
                    "at creation",
                    cid,
                )
            self.get(member)
            if member == cid or any(c == member for c, _ in above):
                raise CollectionError(
                    f"adding {member} to {cid} would make a cycle of collections", cid
                )
            added_height = 1 + self.height(member)
            added_topics = self.all_topics(member)
        else:
            added_height = 0
            added_topics = {member}
        members = len(col.topics) + len(col.subcollections)
        if col.limits.max_breadth is not None and members >= col.limits.max_breadth:
            raise CollectionLimitExceeded(
                f"collection {cid} holds {members} member(s); its max_breadth is "
                f"{col.limits.max_breadth}",
                cid,
                "max_breadth",
                col.limits.max_breadth,
            )
        for upper, distance in above:
            limits = self._by_id[upper].limits
            if limits.max_depth is not None and distance + added_height > limits.max_depth:
                raise CollectionLimitExceeded(
                    f"collection {upper} allows {limits.max_depth} level(s) of "
                    f"sub-collections; this would make {distance + added_height}",
                    upper,
                    "max_depth",
                    limits.max_depth,
                )
            if limits.max_topics is not None:
                total = len(self.all_topics(upper) | added_topics)
                if total > limits.max_topics:
                    raise CollectionLimitExceeded(
                        f"collection {upper} allows {limits.max_topics} topic(s) below it; "
                        f"this would make {total}",
                        upper,
                        "max_topics",
                        limits.max_topics,
                    )
        into.add(member)
        self._parents.setdefault(member, set()).add(cid)
        return Change(cid, "add", kind, member)

    def remove(self, cid: str, member: str, kind: str, requester: str) -> Change:
        """Remove a member of ``cid``.

        Raises:
            NotAllowedToEdit, CollectionError (not a member, or a fixed structure).
        """
        col = self.get(cid)
        if not col.may_edit(requester):
            raise NotAllowedToEdit(f"only the owner or an editor may change collection {cid}")
        if kind == "collection" and col.limits.fixed:
            raise CollectionError(f"collection {cid} has a fixed structure", cid)
        into = col.topics if kind == "topic" else col.subcollections
        if member not in into:
            raise CollectionError(f"{member} is not a {kind} of collection {cid}", cid)
        into.discard(member)
        self._parents.get(member, set()).discard(cid)
        return Change(cid, "remove", kind, member)

    # -- the four discovery operations ----------------------------------------------

    def topics_of(self, cid: str, requester: str, *, recursive: bool = False) -> list[str]:
        """The topics of a collection (``recursive``: of its whole tree)."""
        self._check_discover(cid, requester)
        return sorted(self.all_topics(cid) if recursive else self.get(cid).topics)

    def subcollections_of(self, cid: str, requester: str) -> list[str]:
        """Its sub-collections that ``requester`` may discover."""
        self._check_discover(cid, requester)
        return sorted(
            s for s in self.get(cid).subcollections if self._by_id[s].may_discover(requester)
        )

    def collections_of(self, member: str, requester: str) -> list[str]:
        """The collections (that ``requester`` may discover) a topic or collection is in."""
        return sorted(
            c for c in self._parents.get(member, ()) if self._by_id[c].may_discover(requester)
        )

    def _check_discover(self, cid: str, requester: str) -> None:
        if not self.get(cid).may_discover(requester):
            raise NotAuthorized(f"not allowed to discover collection {cid}")
