"""``trellis tdn``: a topic discovery node, an overlay client that serves SPEC §8.

It connects to one VN through the SDK, advertises ``class prefix 'Services/Discovery/'`` and
subscribes to the well-known topics (:mod:`broker.tools.tdn_wire`). What it does with each
request is in :meth:`TopicDiscoveryNode.handle`, and every rule it applies is pure code in
``security/topics*.py`` and :mod:`broker.tools.tdn_query`:

- ``locate``: answer with its id and key (entities check them against their trusted TDNs);
- ``create``: check the creator's signature (the request must come from the key it names),
  freshness and replay (:class:`security.topics.ReplayGuard`), the hierarchy rules, then
  assign a UUID, sign the advertisement and answer with it;
- advertisements on ``Services/Discovery/Topics``: verified against the trusted TDNs and
  held (a second claim of a held UUID is refused and logged);
- ``query``: exact, regex or property queries, answered with what the requester's key may
  discover;
- ``collection.*``: create, add, remove, the four discovery operations, and ``watch``;
- ``watch``: change notifications of a topic hierarchy (a child registered below the topic,
  a topic below it expired), for entities that may discover the topic; like a collection's,
  each is sealed to each watcher that may still discover what changed.

State is in memory: a restarted TDN re-learns topics from advertisements disseminated after
it started (persisting the registry is not built).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.daemon.config import beside
from broker.errors import (
    ConnectionLost,
    InvalidRequest,
    SlowConsumerError,
    TrellisError,
    TrellisTimeout,
)
from broker.tools.tdn_query import Query, run_query
from broker.tools.tdn_wire import (
    CHANGES_CLASS,
    DISCOVERY_PREFIX,
    REPLY_CLASS,
    TDN_CLASS,
    TOPICS_CLASS,
    error_to_wire,
    seal_answer,
)
from security.envelope import Signer, public_key_to_bytes
from security.errors import NotAuthorized
from security.topics import (
    AdvertisementError,
    ReplayGuard,
    TdnAuthority,
    TopicAdvertisement,
    TopicRequest,
    TrustedTdns,
    issue_advertisement,
    tdn_trusted,
    verify_advertisement,
)
from security.topics_channel import open_request
from security.topics_collections import CollectionLimits, CollectionRegistry
from security.topics_hierarchy import TopicRegistry, may_discover
from security.topics_identity import (
    load_identity,
    own_copy,
    principal_of,
    save_identity,
)
from security.topics_identity import load_trusted_tdns as load_trusted

if TYPE_CHECKING:
    from broker.client import Client

log = logging.getLogger("trellis.tdn")

__all__ = [
    "TdnConfig",
    "TopicDiscoveryNode",
    "cmd_tdn",
    "load_trusted",
    "start_tdn_process",
]

_KEYS = {
    "id",
    "endpoint",
    "identity",
    "certificate",
    "trusted",
    "max_skew",
    "max_results",
    "ready_file",
}


@dataclass
class TdnConfig:
    """A TDN's settings: the ``[tdn]`` table of its TOML file (unknown keys are errors).

    Attributes:
        id: the TDN's id (its identity file's id when not given).
        endpoints: the VN it attaches to (replicas of one VN, or alternatives).
        identity: its identity file (``security.topics_identity``).
        trusted: the trusted TDNs file (TDN keys, or the project CA's certificate);
            advertisements of other TDNs are accepted only from TDNs it trusts.
        certificate: this TDN's certificate (PEM, ``trellis ca issue --tdn --key IDENTITY``),
            sent with its advertisements and answers, for entities that trust the CA.
        max_skew: seconds a creation request's time may differ from the TDN's clock.
        max_results: most topics one query answers with.
    """

    endpoints: list[str]
    identity: Path
    trusted: Path
    id: str | None = None
    max_skew: float = 300.0
    max_results: int = 1000
    ready_file: Path | None = None
    certificate: Path | None = None

    @classmethod
    def load(cls, path: str | Path, ready_file: str | None = None) -> TdnConfig:
        """Read ``[tdn]`` from a TOML file; relative paths are relative to the file.

        Raises:
            InvalidRequest: naming the file and the key.
        """
        where = Path(path)
        try:
            table = tomllib.loads(where.read_text(encoding="utf-8")).get("tdn")
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidRequest(f"{where}: {exc}") from None
        if not isinstance(table, dict):
            raise InvalidRequest(f"{where}: needs a [tdn] table")
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise InvalidRequest(f"{where}: unknown key {unknown[0]!r} in [tdn]")
        for key in ("endpoint", "identity", "trusted"):
            if not isinstance(table.get(key), str) or not table[key]:
                raise InvalidRequest(f"{where}: [tdn] {key} is required (a string)")

        try:
            max_skew = float(table.get("max_skew", 300.0))
            max_results = int(table.get("max_results", 1000))
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"{where}: [tdn] {exc}") from None
        ready = ready_file or table.get("ready_file")
        return cls(
            endpoints=[e.strip() for e in table["endpoint"].split(",") if e.strip()],
            identity=beside(where, table["identity"]),
            trusted=beside(where, table["trusted"]),
            id=table.get("id"),
            max_skew=max_skew,
            max_results=max_results,
            ready_file=Path(ready) if ready else None,
            certificate=beside(where, table["certificate"]) if table.get("certificate") else None,
        )


def _strings(name: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest(f"{name} must be a list of strings")
    return tuple(value)


@dataclass
class _Watcher:
    client_id: str
    principal: str
    reply: bytes


@dataclass
class TdnStats:
    created: int = 0
    replayed: int = 0
    held: int = 0
    queries: int = 0
    refused: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class TopicDiscoveryNode:
    """One TDN. ``handle`` is the whole protocol; ``run`` is the overlay I/O around it."""

    def __init__(
        self,
        signer: Signer,
        trusted: TrustedTdns,
        *,
        max_skew: float = 300.0,
        max_results: int = 1000,
        certificate: bytes = b"",
    ) -> None:
        self.signer = signer
        self.certificate = bytes(certificate)
        self.id = signer.id
        self.trusted = own_copy(trusted)
        self.topics = TopicRegistry()
        self.collections = CollectionRegistry()
        self.guard = ReplayGuard(max_skew)
        self.max_results = max_results
        self.watchers: dict[str, dict[str, _Watcher]] = {}
        self.stats = TdnStats()
        # (attributes, payload) to publish; the I/O loop drains it.
        self.outbox: asyncio.Queue[tuple[dict[str, Any], bytes]] = asyncio.Queue(10_000)
        if not tdn_trusted(
            self.trusted, self.id, public_key_to_bytes(signer.public_key), self.certificate
        ):
            log.warning(
                "this TDN (%s) is not trusted by its own trusted TDNs file (or its certificate "
                "is not the CA's for this id and key): entities that use the same file will "
                "refuse its advertisements",
                self.id,
            )

    # -- protocol (no I/O but the outbox) ----------------------------------------------

    def handle(self, attrs: Mapping[str, Any], payload: bytes, now: float) -> None:
        """Act on one delivered publication of a well-known class."""
        cls = attrs.get("class")
        try:
            if cls == TOPICS_CLASS:
                self._disseminated(payload, now)
                return
            key, body = open_request(payload)
        except TrellisError as exc:
            self.stats.errors[type(exc).__name__] = self.stats.errors.get(type(exc).__name__, 0) + 1
            log.warning("dropped a %s publication from %s: %s", cls, attrs.get("from"), exc)
            return
        rid, reply, sender = body.get("rid"), body.get("reply"), attrs.get("from")
        if not isinstance(rid, str) or not isinstance(reply, bytes) or not isinstance(sender, str):
            log.warning("dropped a request without rid, reply key or sender")
            return
        try:
            result = self._dispatch(str(body.get("op")), key, sender, reply, body, now)
            answer: dict[str, Any] = {"rid": rid, "ok": True, "result": result}
        except TrellisError as exc:
            self.stats.refused += 1
            log.info("refused %s from %s: %s", body.get("op"), sender, exc)
            answer = {"rid": rid, "ok": False, "error": error_to_wire(exc)}
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # an argument of the wrong shape that no check above named: still an answer
            self.stats.refused += 1
            log.info("malformed %s from %s: %r", body.get("op"), sender, exc)
            bad = InvalidRequest(f"malformed {body.get('op')} request: {exc!r}")
            answer = {"rid": rid, "ok": False, "error": error_to_wire(bad)}
        self._reply(sender, rid, reply, answer)

    def _reply(self, to: str, rid: str, reply: bytes, body: dict[str, Any]) -> None:
        attrs = {"class": REPLY_CLASS, "to": to, "rid": rid, "from": self.id}
        self._send(attrs, seal_answer(self.signer, reply, body, self.certificate))

    def _send(self, attrs: dict[str, Any], payload: bytes) -> None:
        try:
            self.outbox.put_nowait((attrs, payload))
        except asyncio.QueueFull:
            log.warning("outbox full: dropped an answer to %s", attrs.get("to"))

    def _dispatch(
        self, op: str, key: bytes, sender: str, reply: bytes, body: dict[str, Any], now: float
    ) -> Any:
        principal = principal_of(key)
        if op == "locate":
            return {
                "id": self.id,
                "key": public_key_to_bytes(self.signer.public_key),
                "topics": len(self.topics),
            }
        if op == "create":
            return self._create(key, body, now)
        if op == "query":
            self.stats.queries += 1
            query = Query.from_wire(body.get("query"))
            found = run_query(
                query,
                self.topics,
                lambda ad: self.topics.visible(ad.uuid, principal, now),
                limit=self.max_results,
            )
            return {"ads": [ad.to_wire() for ad in found]}
        if op == "watch":
            return self._watch_topic(principal, sender, reply, body, now)
        if op.startswith("collection."):
            return self._collection(op.partition(".")[2], principal, sender, reply, body)
        raise InvalidRequest(f"unknown TDN operation {op!r}")

    def _create(self, key: bytes, body: dict[str, Any], now: float) -> Any:
        request = TopicRequest.from_wire(body.get("request"))
        if bytes(request.creator_key) != bytes(key):
            raise NotAuthorized("a topic request must be sent by the key that creates the topic")
        if not request.signed_correctly():
            raise AdvertisementError(
                "the creator's signature over the request does not verify", "request-forged"
            )
        issued = self.guard.check(request, now)
        if issued is not None and (held := self.topics.get(issued)) is not None:
            self.stats.replayed += 1
            return {"ad": held.to_wire()}
        expires = now + request.lifetime
        depth = self.topics.check(request, now, expires)
        ad = issue_advertisement(
            self.signer,
            request,
            uuid=str(uuid.uuid4()),
            now=now,
            depth=depth,
            expires=expires,
            certificate=self.certificate,
        )
        self.topics.add(ad)
        self.guard.remember(request, ad.uuid, now)
        self._hierarchy_changed("add", ad, self.topics.chain(ad.uuid)[1:])
        self.stats.created += 1
        log.info("created topic %s for %s (depth %d)", ad.uuid, request.creator, depth)
        return {"ad": ad.to_wire()}

    def _disseminated(self, payload: bytes, now: float) -> None:
        import msgpack

        try:
            ad = TopicAdvertisement.from_wire(msgpack.unpackb(payload, raw=False))
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise InvalidRequest(f"malformed advertisement: {exc}") from None
        verify_advertisement(ad, self.trusted, now)
        if self.topics.add(ad):
            self.stats.held += 1
            self._hierarchy_changed("add", ad, self.topics.chain(ad.uuid)[1:])

    def _collection(
        self, op: str, principal: str, sender: str, reply: bytes, body: dict[str, Any]
    ) -> Any:
        reg = self.collections
        cid = body.get("collection")
        if op == "create":
            limits = body.get("limits") or [None, None, None, False]
            if (
                not isinstance(limits, list)
                or len(limits) != 4
                or not all(x is None or type(x) is int for x in limits[:3])
                or type(limits[3]) is not bool
            ):
                raise InvalidRequest(
                    "collection limits must be [max_breadth, max_depth, max_topics, fixed]: "
                    "three integers or nil, then a boolean"
                )
            made = reg.create(
                str(uuid.uuid4()),
                principal,
                str(body.get("name", "")),
                CollectionLimits(*limits),
                editors=_strings("editors", body.get("editors") or []),
                discoverers=None
                if body.get("discoverers") is None
                else _strings("discoverers", body["discoverers"]),
                subcollections=_strings("subcollections", body.get("subcollections") or []),
            )
            return {"id": made.id}
        if not isinstance(cid, str):
            raise InvalidRequest("collection id missing")
        if op in ("add", "remove"):
            member, kind = str(body.get("member")), str(body.get("kind", "topic"))
            if kind == "topic" and self.topics.get(member) is None:
                raise InvalidRequest(f"no topic {member} at this TDN")
            change = (reg.add if op == "add" else reg.remove)(cid, member, kind, principal)
            self._notify(cid, [change.collection, change.op, change.kind, change.member])
            return {"change": [change.collection, change.op, change.kind, change.member]}
        if op == "topics":
            return {"topics": reg.topics_of(cid, principal, recursive=bool(body.get("recursive")))}
        if op == "subcollections":
            return {"collections": reg.subcollections_of(cid, principal)}
        if op == "of":
            return {"collections": reg.collections_of(cid, principal)}
        if op == "watch":
            if not reg.get(cid).may_discover(principal):
                raise NotAuthorized(f"not allowed to discover collection {cid}, so not to watch it")
            self.watchers.setdefault(cid, {})[sender] = _Watcher(sender, principal, reply)
            return {"watching": cid}
        raise InvalidRequest(f"unknown collection operation {op!r}")

    def _notify(self, cid: str, change: list[str]) -> None:
        collection = self.collections.get(cid)
        for watcher in list(self.watchers.get(cid, {}).values()):
            if collection.may_discover(watcher.principal):  # permissions may have changed
                self._send_change(watcher, cid, change)

    def _send_change(self, watcher: _Watcher, subject: str, change: list[str]) -> None:
        attrs = {
            "class": CHANGES_CLASS,
            "subject": subject,
            "to": watcher.client_id,
            "from": self.id,
        }
        body = {"rid": "", "ok": True, "result": {"change": change}}
        self._send(attrs, seal_answer(self.signer, watcher.reply, body, self.certificate))

    def _watch_topic(
        self, principal: str, sender: str, reply: bytes, body: dict[str, Any], now: float
    ) -> Any:
        topic = body.get("topic")
        if not isinstance(topic, str) or not self.topics.visible(topic, principal, now):
            raise NotAuthorized(
                f"no topic {topic} this requester may discover here, so nothing to watch"
            )
        self.watchers.setdefault(topic, {})[sender] = _Watcher(sender, principal, reply)
        return {"watching": topic}

    def _hierarchy_changed(
        self, op: str, ad: TopicAdvertisement, chain: list[TopicAdvertisement]
    ) -> None:
        """Tell the watchers of each topic of ``chain`` (``ad``'s ancestors, and for an
        expiry ``ad`` itself) that ``ad`` was registered (``add``) or expired (``expire``),
        if they may discover it."""
        path = chain if chain and chain[0].uuid == ad.uuid else [ad, *chain]
        for subject in chain:
            for watcher in list(self.watchers.get(subject.uuid, {}).values()):
                if may_discover(path, watcher.principal):
                    self._send_change(watcher, subject.uuid, [subject.uuid, op, "topic", ad.uuid])

    # -- overlay I/O --------------------------------------------------------------------

    async def run(
        self, client: Client, stop: asyncio.Event, ready_file: Path | None = None
    ) -> None:
        """Serve over ``client`` (connected) until ``stop`` is set."""
        await client.advertise(f"class prefix '{DISCOVERY_PREFIX}'")
        filters = [
            f"class = '{TDN_CLASS}'",
            f"class = '{TDN_CLASS}/{self.id}'",
            f"class = '{TOPICS_CLASS}'",
        ]
        async with contextlib.AsyncExitStack() as stack:
            subs = [await stack.enter_async_context(client.subscribe(f)) for f in filters]
            if ready_file is not None:
                await asyncio.to_thread(ready_file.write_text, f"id={self.id}\n")
            trust = (
                "TDNs certified by the project CA"
                if isinstance(self.trusted, TdnAuthority)
                else f"{len(self.trusted)} trusted TDNs"
            )
            log.info("TDN %s serving (%s)", self.id, trust)
            async with asyncio.TaskGroup() as tasks:
                workers = [tasks.create_task(self._read(sub)) for sub in subs]
                workers.append(tasks.create_task(self._write(client)))
                workers.append(tasks.create_task(self._expire()))
                await stop.wait()
                for task in workers:
                    task.cancel()

    async def _read(self, sub: Any) -> None:
        while True:
            try:
                msg = await sub.get()
            except SlowConsumerError as exc:
                log.warning("requests dropped while the TDN was busy: %s", exc)
                continue
            except StopAsyncIteration:
                return
            try:
                self.handle(msg.attrs, msg.payload, time.time())
            except Exception:  # a bug must not stop the TDN serving everyone else
                log.exception("failed to handle a %s publication", msg.attrs.get("class"))

    async def _write(self, client: Client) -> None:
        while True:
            attrs, payload = await self.outbox.get()
            try:
                await client.publish(attrs, payload)
            except (ConnectionLost, TrellisTimeout) as exc:
                log.warning("answer to %s lost: %s", attrs.get("to"), exc)

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.expire(time.time())

    def expire(self, now: float) -> None:
        """Drop expired topics; tell the watchers of each one and of its ancestors."""
        chains: dict[str, list[TopicAdvertisement]] = {}
        if self.watchers:  # the chains as they were, for the notifications
            for ad in self.topics:
                chain = self.topics.chain(ad.uuid)
                if not all(a.live(now) for a in chain):
                    chains[ad.uuid] = chain
        gone = self.topics.expire(now)
        for ad in gone:
            self._hierarchy_changed("expire", ad, chains.get(ad.uuid, [ad]))
        for ad in gone:
            self.watchers.pop(ad.uuid, None)
        if gone:
            log.info("%d topic(s) expired", len(gone))


def start_tdn_process(
    workdir: Path,
    signer: Signer,
    endpoint: str,
    trusted: Path,
    timeout: float = 30.0,
    certificate: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Write ``signer``'s identity and a config in ``workdir``, start ``trellis tdn`` as a
    process (log in ``workdir/<id>.log``) and return once it serves; tests and benchmarks use
    it. A TDN that exits or is not ready within ``timeout`` is killed and named.

    Raises:
        TrellisError: the TDN did not come up (its last log line says why).
    """
    identity = workdir / f"{signer.id}.identity.json"
    save_identity(signer, identity)
    config = workdir / f"{signer.id}.tdn.toml"
    config.write_text(
        f'[tdn]\nendpoint = "{endpoint}"\nidentity = "{identity}"\ntrusted = "{trusted}"\n'
        + (f'certificate = "{certificate}"\n' if certificate is not None else ""),
        encoding="utf-8",
    )
    ready = workdir / f"{signer.id}.ready"
    ready.unlink(missing_ok=True)
    log_path = workdir / f"{signer.id}.log"
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker",
                "tdn",
                "--config",
                str(config),
                "--ready-file",
                str(ready),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(5)
            lines = log_path.read_text(errors="replace").strip().splitlines() or ["no output"]
            raise TrellisError(f"TDN {signer.id} did not start: {lines[-1]} ({log_path})")
        time.sleep(0.05)
    return proc


# -- command line ---------------------------------------------------------------------------


def cmd_tdn(args: argparse.Namespace) -> int:
    """Run a TDN until SIGTERM or SIGINT; print its counters as one JSON line."""
    from broker.tools.launcher import run_async

    config = TdnConfig.load(args.config, args.ready_file)
    if args.new_identity:
        if config.identity.exists():
            raise InvalidRequest(f"{config.identity} exists already; not overwriting it")
        signer = Signer.generate(args.new_identity)
        save_identity(signer, config.identity)
        print(json.dumps({signer.id: public_key_to_bytes(signer.public_key).hex()}))
        return 0
    logging.getLogger().setLevel(getattr(logging, args.log_level.upper()))
    stats = run_async(_serve(config))
    print(json.dumps(vars(stats), sort_keys=True), flush=True)
    return 0


def _certificate_der(path: Path | None) -> bytes:
    """The TDN's certificate as DER (empty without one).

    Raises:
        InvalidRequest: unreadable or not a PEM certificate.
    """
    if path is None:
        return b""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"[tdn] certificate {str(path)!r}: {exc}") from None
    return cert.public_bytes(Encoding.DER)


async def _serve(config: TdnConfig) -> TdnStats:
    from broker.client import Client

    signer = load_identity(config.identity)
    if config.id and config.id != signer.id:
        raise InvalidRequest(
            f"[tdn] id {config.id!r} differs from the identity file's id {signer.id!r}"
        )
    node = TopicDiscoveryNode(
        signer,
        load_trusted(config.trusted),
        max_skew=config.max_skew,
        max_results=config.max_results,
        certificate=_certificate_der(config.certificate),
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if stop.is_set() and main is not None:
            main.cancel()
        log.info("signal %d: stopping", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    client = Client(config.endpoints, client_id=signer.id, first_seq=time.time_ns() // 1000)
    try:
        async with client:
            await node.run(client, stop, config.ready_file)
    except asyncio.CancelledError:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return node.stats
