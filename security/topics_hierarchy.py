"""Topic hierarchies: the rules a TDN applies before it registers a child topic.

A hierarchy starts at a root topic (RootTopic) that allows children (AllowChildTopics);
each child names its parent (ParentTopic). Limits are set from above and only tighten
downwards:

- MaxDepth ``m`` at topic A: no topic more than ``m`` levels below A.
- MaxWidth ``w`` at topic A: no topic at or below A has more than ``w`` live children.
- registrars: who may register a child under a topic; a registration needs the
  permission of the parent *and of every ancestor* (the owner of each level, or its list).
- discoverers: who may discover; a topic is visible to a principal only when it and every
  ancestor allow it, so a child can never be more visible than its ancestors.
- lifetime: a child expires no later than its parent, and a topic whose ancestor expired
  is expired too.

A child that sets a limit looser than its ancestors allow is refused (:class:`LimitLoosened`)
rather than silently tightened: the owner learns what the hierarchy allows. Width is counted
at the TDN that registers the child, over the advertisements it holds; two TDNs registering
children of one parent at the same moment can overshoot MaxWidth until they see each other's
advertisements (stated in the README).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from security.errors import InvalidRequest, NotAuthorized
from security.topics import ANYONE, AdvertisementError, TopicAdvertisement, TopicRequest

__all__ = [
    "ChildrenNotAllowed",
    "HierarchyError",
    "LifetimeExceedsParent",
    "LimitLoosened",
    "MaxDepthExceeded",
    "MaxWidthExceeded",
    "NotAllowedToRegister",
    "ParentUnavailable",
    "TopicRegistry",
    "may_discover",
]


class HierarchyError(InvalidRequest):
    """A registration breaks a rule of its hierarchy.

    Attributes:
        topic: the UUID of the ancestor whose rule it breaks (or the parent's).
    """

    code = "hierarchy"

    def __init__(self, message: str, topic: str = "") -> None:
        super().__init__(message)
        self.topic = topic


class ParentUnavailable(HierarchyError):
    """The parent topic is unknown to this TDN, or expired."""


class ChildrenNotAllowed(HierarchyError):
    """The parent does not allow child topics (AllowChildTopics is off)."""


class MaxDepthExceeded(HierarchyError):
    """The child would sit deeper below an ancestor than its MaxDepth allows.

    Attributes:
        limit: the ancestor's MaxDepth; depth: levels below that ancestor.
    """

    def __init__(self, message: str, topic: str, limit: int, depth: int) -> None:
        super().__init__(message, topic)
        self.limit = limit
        self.depth = depth


class MaxWidthExceeded(HierarchyError):
    """The parent already has as many live children as an ancestor's MaxWidth allows.

    Attributes:
        limit: the MaxWidth in force; children: the parent's live children now.
    """

    def __init__(self, message: str, topic: str, limit: int, children: int) -> None:
        super().__init__(message, topic)
        self.limit = limit
        self.children = children


class LimitLoosened(HierarchyError):
    """The child sets MaxDepth or MaxWidth looser than its ancestors allow.

    Attributes:
        limit: ``max_depth`` or ``max_width``; allowed: the loosest value allowed.
    """

    def __init__(self, message: str, topic: str, limit: str, allowed: int) -> None:
        super().__init__(message, topic)
        self.limit = limit
        self.allowed = allowed


class LifetimeExceedsParent(HierarchyError):
    """The child would outlive its parent."""


class NotAllowedToRegister(NotAuthorized):
    """The requester may not register a child here (parent's or an ancestor's registrars)."""


def _allowed(principal: str, owner: str, listed: tuple[str, ...] | None) -> bool:
    if principal == owner:
        return True
    return listed is not None and (ANYONE in listed or principal in listed)


def may_discover(chain: Sequence[TopicAdvertisement], principal: str) -> bool:
    """Whether every topic of ``chain`` (a topic and its ancestors) lets ``principal``
    discover it: its owner, anyone when ``discoverers`` is None, else those listed."""
    return all(
        ad.request.discoverers is None or _allowed(principal, ad.owner, ad.request.discoverers)
        for ad in chain
    )


class TopicRegistry:
    """The advertisements a TDN (or a client's cache) holds, with the hierarchy rules."""

    def __init__(self) -> None:
        self._ads: dict[str, TopicAdvertisement] = {}
        self._children: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._ads)

    def __iter__(self) -> Iterator[TopicAdvertisement]:
        return iter(self._ads.values())

    def get(self, uuid: str) -> TopicAdvertisement | None:
        return self._ads.get(uuid)

    def chain(self, uuid: str) -> list[TopicAdvertisement]:
        """The topic and its ancestors this registry holds, the topic first."""
        out: list[TopicAdvertisement] = []
        current = self._ads.get(uuid)
        while current is not None and len(out) <= len(self._ads):
            out.append(current)
            parent = current.parent
            current = None if parent is None else self._ads.get(parent)
        return out

    def live(self, uuid: str, now: float) -> bool:
        """Whether the topic and every ancestor are held and unexpired."""
        chain = self.chain(uuid)
        if not chain or chain[-1].parent is not None:
            return False  # an ancestor is missing: treat the branch as gone
        return all(ad.live(now) for ad in chain)

    def children(self, uuid: str, now: float) -> list[str]:
        return sorted(c for c in self._children.get(uuid, ()) if self.live(c, now))

    def visible(self, uuid: str, principal: str, now: float) -> bool:
        """Whether ``principal`` may discover the topic: it is live, and the topic and every
        ancestor allow ``principal`` (their owner always may)."""
        return self.live(uuid, now) and may_discover(self.chain(uuid), principal)

    def check(self, request: TopicRequest, now: float, lifetime_end: float) -> int:
        """Check a registration against the hierarchy; returns the new topic's depth.

        Args:
            request: the verified creation request (its creator is the registrant).
            lifetime_end: when the new topic would expire.

        Raises:
            ParentUnavailable, ChildrenNotAllowed, NotAllowedToRegister, MaxDepthExceeded,
            MaxWidthExceeded, LimitLoosened, LifetimeExceedsParent.
        """
        spec = request.hierarchy
        if spec.parent is None:
            return 0
        parent = self._ads.get(spec.parent)
        if parent is None or not self.live(spec.parent, now):
            raise ParentUnavailable(
                f"parent topic {spec.parent} is unknown to this TDN or expired", spec.parent
            )
        if not parent.request.hierarchy.allow_children:
            raise ChildrenNotAllowed(
                f"parent topic {parent.uuid} does not allow child topics", parent.uuid
            )
        chain = self.chain(parent.uuid)
        principal = request.owner
        for ad in chain:
            if not _allowed(principal, ad.owner, ad.request.hierarchy.registrars):
                raise NotAllowedToRegister(
                    f"{request.creator} may not register children under topic {ad.uuid}"
                    + ("" if ad is parent else f" (an ancestor of parent {parent.uuid})")
                )
        depth = parent.depth + 1
        loosest_depth: int | None = None
        width: int | None = None
        width_at = parent.uuid
        for ad in chain:
            h = ad.request.hierarchy
            below = depth - ad.depth
            if h.max_depth is not None:
                if below > h.max_depth:
                    raise MaxDepthExceeded(
                        f"topic {ad.uuid} allows {h.max_depth} level(s) below it; the new "
                        f"topic would be {below} below it",
                        ad.uuid,
                        h.max_depth,
                        below,
                    )
                left = h.max_depth - below
                loosest_depth = left if loosest_depth is None else min(loosest_depth, left)
            if h.max_width is not None and (width is None or h.max_width < width):
                width, width_at = h.max_width, ad.uuid
        siblings = len(self.children(parent.uuid, now))
        if width is not None and siblings >= width:
            raise MaxWidthExceeded(
                f"topic {parent.uuid} already has {siblings} child topic(s); MaxWidth of "
                f"topic {width_at} allows {width}",
                width_at,
                width,
                siblings,
            )
        if (
            loosest_depth is not None
            and spec.max_depth is not None
            and spec.max_depth > loosest_depth
        ):
            raise LimitLoosened(
                f"MaxDepth {spec.max_depth} is looser than the {loosest_depth} level(s) "
                f"the ancestors leave below this topic",
                parent.uuid,
                "max_depth",
                loosest_depth,
            )
        if width is not None and spec.max_width is not None and spec.max_width > width:
            raise LimitLoosened(
                f"MaxWidth {spec.max_width} is looser than MaxWidth {width} of topic {width_at}",
                width_at,
                "max_width",
                width,
            )
        if lifetime_end > parent.expires:
            raise LifetimeExceedsParent(
                f"the topic would expire at {lifetime_end:.3f}, after its parent {parent.uuid} "
                f"(expires {parent.expires:.3f}); ask for a lifetime of at most "
                f"{max(0.0, parent.expires - now):.3f} s",
                parent.uuid,
            )
        return depth

    def add(self, ad: TopicAdvertisement) -> bool:
        """Hold a (verified) advertisement; False when it is already held.

        Raises:
            AdvertisementError: ``conflict``, another topic already holds this UUID.
        """
        held = self._ads.get(ad.uuid)
        if held is not None:
            if held.digest != ad.digest or held.signature != ad.signature:
                raise AdvertisementError(
                    f"topic {ad.uuid} is already registered by {held.request.creator} "
                    f"(another request): refusing a second claim of that UUID",
                    "conflict",
                )
            return False
        self._ads[ad.uuid] = ad
        if ad.parent is not None:
            self._children.setdefault(ad.parent, set()).add(ad.uuid)
        return True

    def expire(self, now: float) -> list[TopicAdvertisement]:
        """Drop every topic that expired, or whose ancestor did; returns them."""
        gone = [ad for uuid, ad in self._ads.items() if not self._live_or_orphan(uuid, now)]
        for ad in gone:
            del self._ads[ad.uuid]
            if ad.parent is not None:
                self._children.get(ad.parent, set()).discard(ad.uuid)
            self._children.pop(ad.uuid, None)
        return gone

    def _live_or_orphan(self, uuid: str, now: float) -> bool:
        # A child whose parent this registry never held (dissemination order) is kept
        # until its own expiry; one whose held ancestor expired goes with it.
        return all(ad.live(now) for ad in self.chain(uuid))
