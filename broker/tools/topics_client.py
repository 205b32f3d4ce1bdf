"""The SDK side of SPEC §8: locate TDNs, create and discover topics, collections, and answer
discovery floods for the topics one owns.

Example::

    async with Client(endpoints, client_id="alice") as c, TopicsClient(c, alice, trusted) as t:
        ad = await t.create_topic("weather/paris", lifetime=3600, descriptors={"kind": "weather"})
        found = await t.discover("regex", r"weather/.*")

Every answer is checked here: a TDN's answer must be signed by a trusted TDN and sealed to
the one-off reply key of the request it answers; a created topic's advertisement must verify
and answer *this* request (:func:`security.topics.check_response`); every discovered
advertisement must verify. **Discovery without TDNs**: when no TDN answers ``locate``,
:meth:`TopicsClient.discover` publishes the query on ``Services/Discovery/Flood`` with a TTL
in seconds; every entity running a ``TopicsClient`` (``answer_floods``, the default) receives
it (the overlay routes it to every subscriber of that class, as it does any publication) and
answers, before the TTL ends, with the advertisements *it owns* that match and that the
requester may discover, signing the answer with the owner key. The requester keeps only
advertisements that verify and whose owner key signed the answer: nobody can answer for a
topic it does not own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import msgpack

from broker.client import Client, Subscription
from broker.errors import SlowConsumerError, TrellisError, TrellisTimeout
from broker.tools.tdn_query import Query, run_query
from broker.tools.tdn_wire import (
    CHANGES_CLASS,
    DISCOVERY_PREFIX,
    FLOOD_CLASS,
    REPLY_CLASS,
    TDN_CLASS,
    TOPICS_CLASS,
    error_from_wire,
    open_answer,
    seal_answer,
)
from security.envelope import Signer, public_key_to_bytes
from security.topics import (
    AdvertisementError,
    HierarchySpec,
    TopicAdvertisement,
    TrustedTdns,
    Value,
    check_response,
    make_request,
    tdn_trusted,
    verify_advertisement,
)
from security.topics_channel import ReplyKey, open_request, sign_request
from security.topics_delegations import Delegation, delegate
from security.topics_hierarchy import TopicRegistry, may_discover
from security.topics_identity import own_copy, principal_of

__all__ = ["Change", "TdnInfo", "TopicsClient"]

log = logging.getLogger("trellis.topics")


@dataclass(frozen=True)
class TdnInfo:
    id: str
    key: bytes
    topics: int


@dataclass(frozen=True)
class Change:
    """A change of a watched collection or topic hierarchy: ``op`` is ``add`` or
    ``remove`` (collections), ``add`` or ``expire`` (hierarchies) of ``member``, a
    ``kind`` ("topic" or "collection") under ``subject``."""

    subject: str
    op: str
    kind: str
    member: str


class _Call:
    """One request in flight: its reply key and the answers that arrived."""

    def __init__(self, many: bool) -> None:
        self.key = ReplyKey()
        self.many = many
        # (signer id, signer key, body, signer certificate or empty)
        self.answers: asyncio.Queue[tuple[str, bytes, dict[str, Any], bytes]] = asyncio.Queue(256)


class TopicsClient:
    """Topics for one entity over a connected SDK :class:`Client`.

    Args:
        client: connected (or to be connected) SDK client; its ``client_id`` routes answers.
        signer: the entity's identity (owner key of the topics it creates).
        trusted: TDN id -> raw Ed25519 public key.
        answer_floods: answer TDN-less discovery floods for the topics this entity owns.
        timeout: default bound on each request, seconds.
    """

    def __init__(
        self,
        client: Client,
        signer: Signer,
        trusted: TrustedTdns,
        *,
        answer_floods: bool = True,
        timeout: float = 3.0,
    ) -> None:
        self.client = client
        self.signer = signer
        self.trusted = own_copy(trusted)
        self.answer_floods = answer_floods
        self.timeout = timeout
        self.owned = TopicRegistry()
        """Advertisements of the topics this entity created (answers floods from them)."""
        self._calls: dict[str, _Call] = {}
        self._watches: dict[str, tuple[ReplyKey, asyncio.Queue[Change]]] = {}
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._tdns: list[TdnInfo] = []
        self.rejected: list[str] = []
        """Why answers were discarded (forged, replayed, claims of others' topics)."""

    @property
    def key(self) -> bytes:
        return public_key_to_bytes(self.signer.public_key)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Advertise the discovery classes and subscribe to answers (and floods)."""
        me = self.client.client_id
        await self.client.advertise(f"class prefix '{DISCOVERY_PREFIX}'")
        replies = await self._stack.enter_async_context(
            self.client.subscribe(f"class = '{REPLY_CLASS}' and to = '{me}'")
        )
        notes = await self._stack.enter_async_context(
            self.client.subscribe(f"class = '{CHANGES_CLASS}' and to = '{me}'")
        )
        self._tasks = [
            asyncio.create_task(self._pump(replies, self._on_reply)),
            asyncio.create_task(self._pump(notes, self._on_note)),
        ]
        if self.answer_floods:
            floods = await self._stack.enter_async_context(
                self.client.subscribe(f"class = '{FLOOD_CLASS}'")
            )
            self._tasks.append(asyncio.create_task(self._pump(floods, self._on_flood)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        with contextlib.suppress(TrellisError):
            await self._stack.aclose()

    # -- incoming ---------------------------------------------------------------------

    async def _pump(self, sub: Subscription, handle: Any) -> None:
        while True:
            try:
                msg = await sub.get()
            except SlowConsumerError as exc:
                log.warning("%s", exc)
                continue
            except StopAsyncIteration:
                return
            try:
                await handle(msg.attrs, msg.payload)
            except TrellisError as exc:  # a malformed or forged message from someone
                log.warning("dropped a %s publication: %s", msg.attrs.get("class"), exc)
            except Exception:  # one bad message must not stop the others
                log.exception("failed to handle a %s publication", msg.attrs.get("class"))

    async def _on_reply(self, attrs: Mapping[str, Value], payload: bytes) -> None:
        call = self._calls.get(str(attrs.get("rid")))
        if call is None:
            return
        try:
            signer_id, key, body, certificate = open_answer(call.key, payload)
        except TrellisError as exc:
            self.rejected.append(f"answer from {attrs.get('from')}: {exc}")
            return
        if body.get("rid") != attrs.get("rid"):
            self.rejected.append(f"answer from {signer_id} names another request")
            return
        with contextlib.suppress(asyncio.QueueFull):
            call.answers.put_nowait((signer_id, key, body, certificate))

    async def _on_note(self, attrs: Mapping[str, Value], payload: bytes) -> None:
        watch = self._watches.get(str(attrs.get("subject")))
        if watch is None:
            return
        try:
            signer_id, key, body, certificate = open_answer(watch[0], payload)
        except TrellisError as exc:
            self.rejected.append(f"notification: {exc}")
            return
        if not tdn_trusted(self.trusted, signer_id, key, certificate, time.time()):
            self.rejected.append(f"notification signed by {signer_id!r}, not a trusted TDN")
            return
        cid, op, kind, member = body["result"]["change"]
        with contextlib.suppress(asyncio.QueueFull):
            watch[1].put_nowait(Change(cid, op, kind, member))

    async def _on_flood(self, attrs: Mapping[str, Value], payload: bytes) -> None:
        if attrs.get("from") == self.client.client_id:
            return
        key, body = open_request(payload)
        now = time.time()
        deadline = float(body.get("time", 0)) + min(float(body.get("ttl", 0)), 60.0)
        if now > deadline:
            return  # its time to live is over: nobody waits for the answer
        principal = principal_of(key)
        self.owned.expire(now)
        found = run_query(
            Query.from_wire(body.get("query")),
            self.owned,
            lambda ad: ad.live(now) and may_discover(self.owned.chain(ad.uuid), principal),
        )
        if not found:
            return
        answer = {
            "rid": body.get("rid"),
            "ok": True,
            "result": {"ads": [a.to_wire() for a in found]},
        }
        reply = body.get("reply")
        if not isinstance(reply, bytes):
            return
        attrs_out: dict[str, Value] = {
            "class": REPLY_CLASS,
            "to": str(attrs.get("from")),
            "rid": str(body.get("rid")),
            "from": self.client.client_id,
        }
        await self.client.publish(attrs_out, seal_answer(self.signer, reply, answer))

    # -- requests ---------------------------------------------------------------------

    async def _ask(
        self,
        op: str,
        args: dict[str, Any],
        *,
        tdn: str | None = None,
        many: float | None = None,
        cls: str | None = None,
        call: _Call | None = None,
    ) -> list[tuple[str, bytes, dict[str, Any]]]:
        """Publish a request; the first answer (or, with ``many`` seconds, every answer
        within them) from a trusted TDN (or, for floods, from anyone: checked by caller)."""
        rid = uuid.uuid4().hex
        call = self._calls[rid] = call or _Call(many is not None)
        body = {"op": op, "rid": rid, "time": time.time(), "reply": call.key.public, **args}
        target = cls or (TDN_CLASS if tdn is None else f"{TDN_CLASS}/{tdn}")
        attrs: dict[str, Value] = {
            "class": target,
            "op": op,
            "rid": rid,
            "from": self.client.client_id,
        }
        answers: list[tuple[str, bytes, dict[str, Any]]] = []
        try:
            await self.client.publish(attrs, sign_request(self.signer, body))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (many if many is not None else self.timeout)
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    answer = await asyncio.wait_for(call.answers.get(), left)
                except TimeoutError:
                    break
                signer_id, key, body, certificate = answer
                if cls is None and not tdn_trusted(
                    self.trusted, signer_id, key, certificate, time.time()
                ):
                    self.rejected.append(f"answer signed by {signer_id!r}, not a trusted TDN")
                    continue
                answers.append((signer_id, key, body))
                if many is None:
                    break
        finally:
            self._calls.pop(rid, None)
        if many is None and not answers:
            raise TrellisTimeout(f"no TDN answered {op} within {self.timeout:g} s")
        return answers

    @staticmethod
    def _result(answer: tuple[str, bytes, dict[str, Any]]) -> Any:
        body = answer[2]
        if not body.get("ok"):
            raise error_from_wire(body.get("error"))
        return body.get("result")

    async def request(self, op: str, tdn: str | None = None, **args: Any) -> Any:
        """One request to a TDN (any, or ``tdn``); its result.

        Raises:
            TrellisTimeout: no trusted TDN answered within ``timeout``.
            TrellisError: the TDN's refusal, as its class (e.g. ``MaxDepthExceeded``).
        """
        (answer,) = await self._ask(op, args, tdn=tdn)
        return self._result(answer)

    async def locate(self, wait: float = 0.5) -> list[TdnInfo]:
        """The trusted TDNs that answer within ``wait`` seconds."""
        found = []
        for signer_id, key, body in await self._ask("locate", {}, many=wait):
            result = body.get("result") or {}
            found.append(TdnInfo(signer_id, key, int(result.get("topics", 0))))
        self._tdns = sorted(found, key=lambda t: t.id)
        return self._tdns

    async def pick_tdn(self) -> str:
        """A TDN for state-changing requests (creations, collections), which must go to one
        TDN: the first that answered ``locate`` (asked now if none is known).

        Raises:
            TrellisTimeout: no trusted TDN answers.
        """
        if not self._tdns:
            await self.locate()
        if not self._tdns:
            raise TrellisTimeout("no trusted TDN answered locate")
        return self._tdns[0].id

    async def create_topic(
        self,
        synopsis: str,
        *,
        lifetime: float,
        descriptors: Mapping[str, Value] | None = None,
        hierarchy: HierarchySpec | None = None,
        discoverers: list[str] | tuple[str, ...] | None = None,
        tdn: str | None = None,
    ) -> TopicAdvertisement:
        """Ask a TDN to create a topic, check its advertisement, disseminate it to every TDN.

        Raises:
            AdvertisementError: the answer does not verify or answers another request.
            HierarchyError (its subclasses), NotAuthorized: the TDN refused.
            TrellisTimeout: no trusted TDN answered.
        """
        request = make_request(
            self.signer,
            synopsis,
            nonce=os.urandom(16),
            now=time.time(),
            lifetime=lifetime,
            descriptors=descriptors,
            hierarchy=hierarchy,
            discoverers=discoverers,
        )
        tdn = tdn or await self.pick_tdn()
        result = await self.request("create", tdn=tdn, request=request.to_wire())
        ad = self.accept_creation(result.get("ad"), request)
        await self.disseminate(ad)
        return ad

    def accept_creation(self, wire: object, request: Any) -> TopicAdvertisement:
        """Check a creation answer against the request sent; hold the topic as owned."""
        ad = TopicAdvertisement.from_wire(wire)
        check_response(ad, request, self.trusted, time.time())
        with contextlib.suppress(AdvertisementError):
            self.owned.add(ad)
        return ad

    async def disseminate(self, ad: TopicAdvertisement) -> None:
        """Send an advertisement to every TDN (``Services/Discovery/Topics``)."""
        await self.client.publish(
            {"class": TOPICS_CLASS, "uuid": ad.uuid, "from": self.client.client_id},
            msgpack.packb(ad.to_wire(), use_bin_type=True),
        )

    async def discover(
        self, kind: str, text: str, *, ttl: float = 1.0, tdn: str | None = None
    ) -> list[TopicAdvertisement]:
        """Topics matching a query (``exact``, ``regex``, ``properties``) that this entity
        may discover: from a TDN, or by a flood answered by owners when no TDN answers."""
        query = Query(kind, text)
        try:
            result = await self.request("query", tdn=tdn, query=query.to_wire())
        except TrellisTimeout:
            log.info("no TDN answered; flooding the query with a TTL of %g s", ttl)
            return await self.flood_discover(kind, text, ttl=ttl)
        return self._verified([TopicAdvertisement.from_wire(w) for w in result["ads"]])

    async def flood_discover(
        self, kind: str, text: str, *, ttl: float = 1.0
    ) -> list[TopicAdvertisement]:
        """Discovery without TDNs: topic owners answer within ``ttl`` seconds."""
        query = Query(kind, text)
        answers = await self._ask(
            "flood", {"query": query.to_wire(), "ttl": ttl}, many=ttl, cls=FLOOD_CLASS
        )
        found: dict[str, TopicAdvertisement] = {}
        for signer_id, key, body in answers:
            for wire in (body.get("result") or {}).get("ads", []):
                ad = TopicAdvertisement.from_wire(wire)
                if bytes(ad.request.creator_key) != key:
                    self.rejected.append(
                        f"{signer_id} answered for topic {ad.uuid}, which it does not own"
                    )
                    continue
                found.update((a.uuid, a) for a in self._verified([ad]))
        return sorted(found.values(), key=lambda a: a.uuid)

    def _verified(self, ads: list[TopicAdvertisement]) -> list[TopicAdvertisement]:
        now = time.time()
        good = []
        for ad in ads:
            try:
                verify_advertisement(ad, self.trusted, now)
            except AdvertisementError as exc:
                self.rejected.append(str(exc))
                continue
            good.append(ad)
        return good

    def delegate(
        self,
        ad: TopicAdvertisement,
        holder_key: bytes,
        right: str,
        *,
        expires: float | None = None,
    ) -> Delegation:
        """Sign a delegation of ``right`` on one of this entity's topics."""
        return delegate(self.signer, ad, holder_key, right, now=time.time(), expires=expires)

    # -- collections ------------------------------------------------------------------

    async def create_collection(
        self,
        name: str,
        *,
        max_breadth: int | None = None,
        max_depth: int | None = None,
        max_topics: int | None = None,
        fixed: bool = False,
        editors: list[str] | None = None,
        discoverers: list[str] | None = None,
        subcollections: list[str] | None = None,
        tdn: str | None = None,
    ) -> str:
        """A new collection at a TDN; its id."""
        result = await self.request(
            "collection.create",
            tdn=tdn or await self.pick_tdn(),
            name=name,
            limits=[max_breadth, max_depth, max_topics, fixed],
            editors=editors or [],
            discoverers=discoverers,
            subcollections=subcollections or [],
        )
        return str(result["id"])

    async def add_to_collection(
        self, collection: str, member: str, kind: str = "topic", *, tdn: str | None = None
    ) -> None:
        await self.request(
            "collection.add", tdn=tdn, collection=collection, member=member, kind=kind
        )

    async def remove_from_collection(
        self, collection: str, member: str, kind: str = "topic", *, tdn: str | None = None
    ) -> None:
        await self.request(
            "collection.remove", tdn=tdn, collection=collection, member=member, kind=kind
        )

    async def collection_topics(
        self, collection: str, *, recursive: bool = False, tdn: str | None = None
    ) -> list[str]:
        result = await self.request(
            "collection.topics", tdn=tdn, collection=collection, recursive=recursive
        )
        return list(result["topics"])

    async def subcollections(self, collection: str, *, tdn: str | None = None) -> list[str]:
        result = await self.request("collection.subcollections", tdn=tdn, collection=collection)
        return list(result["collections"])

    async def collections_of(self, member: str, *, tdn: str | None = None) -> list[str]:
        result = await self.request("collection.of", tdn=tdn, collection=member)
        return list(result["collections"])

    async def watch_collection(self, collection: str, *, tdn: str) -> AsyncIterator[Change]:
        """Register for a collection's change notifications at ``tdn`` (refused with
        ``NotAuthorized`` unless this entity may discover it); iterate the changes."""
        return await self._watch("collection.watch", collection, tdn, collection=collection)

    async def watch_topic(self, topic: str, *, tdn: str) -> AsyncIterator[Change]:
        """Register for a topic hierarchy's change notifications at ``tdn``: a child
        registered below ``topic``, a topic at or below it expired (refused with
        ``NotAuthorized`` unless this entity may discover ``topic``); iterate the changes."""
        return await self._watch("watch", topic, tdn, topic=topic)

    async def _watch(self, op: str, subject: str, tdn: str, **args: Any) -> AsyncIterator[Change]:
        call = _Call(False)
        queue: asyncio.Queue[Change] = asyncio.Queue(1024)
        self._watches[subject] = (call.key, queue)
        try:
            (answer,) = await self._ask(op, args, tdn=tdn, call=call)
            self._result(answer)
        except BaseException:
            self._watches.pop(subject, None)
            raise
        return _changes(queue)


async def _changes(queue: asyncio.Queue[Change]) -> AsyncIterator[Change]:
    while True:
        yield await queue.get()
