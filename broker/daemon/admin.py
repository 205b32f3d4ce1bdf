"""The admin endpoint of a broker: ``/metrics`` (Prometheus), ``/healthz`` and ``/reconfig``
(JSON), and the admin page (``/``) with the JSON documents behind it (``/api/topology``,
``/api/routing``, ``/api/reconfig``, ``/api/trace``).

A deliberately tiny HTTP/1.0 responder on asyncio streams: a few GET routes need no web
framework, and it shares the broker's event loop without blocking it. The page is static
HTML and JavaScript shipped in the package (``broker/daemon/static``); it polls the JSON
documents of every broker whose admin address it learns, so ``/api/*`` answers any origin
(read-only documents; the endpoint listens on the broker's ``host``, 127.0.0.1 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from broker.daemon.config import BrokerConfig
from broker.daemon.hops import Hop
from broker.daemon.links import LinkStates
from broker.daemon.memory_probe import MemoryProbe
from broker.daemon.stats import MATCH_BUCKETS, BrokerStats
from broker.daemon.trace import Logged, TraceRing, install
from broker.routing.router import Router
from reconfig.live import RoundStats

log = logging.getLogger("trellis.admin")


class Observed(Protocol):
    """What the admin endpoint reads of its broker (the daemon's ``Broker``)."""

    @property
    def broker_id(self) -> str: ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def round_stats(self) -> RoundStats: ...

    def table_sizes(self) -> tuple[int, int]:
        """(SRT entries, PRT entries)."""

    def publisher_streams(self) -> int:
        """Publishers whose copies from a neighbour VN the forwarder agrees on."""

    def connection_counts(self) -> tuple[int, int]:
        """(connected clients, overlay links up)."""

    def health(self) -> dict[str, object]:
        """The ``/healthz`` document."""

    def reconfig_state(self) -> dict[str, Any]:
        """The ``/reconfig`` document."""

    # What the admin page's documents read (attributes of the daemon's ``Broker``).

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def router(self) -> Router[Hop]: ...

    @property
    def linkstates(self) -> LinkStates: ...

    @property
    def forwarder(self) -> Logged: ...


class BrokerCollector:
    """Turns the broker's plain counters into Prometheus metrics at scrape time."""

    def __init__(self, broker: Observed) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        s = b.stats
        me = b.broker_id
        labels = {"broker": me}
        names = ["broker"]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            metric = CounterMetricFamily(name, doc, labels=names)
            metric.add_metric([labels["broker"]], value)
            return metric

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            metric = GaugeMetricFamily(name, doc, labels=names)
            metric.add_metric([labels["broker"]], value)
            return metric

        inbound = CounterMetricFamily(
            "trellis_messages_in", "Control messages received, by type", labels=["broker", "type"]
        )
        for kind, count in sorted(s.messages_in.items()):
            inbound.add_metric([me, kind], count)
        inbound.add_metric([me, "publish"], s.publications_in)
        inbound.add_metric([me, "forward"], s.forwards_in)
        yield inbound
        forwarded = CounterMetricFamily(
            "trellis_publications_forwarded",
            "Publications sent to each neighbour broker",
            labels=["broker", "link"],
        )
        for link, count in sorted(s.forwarded.items()):
            forwarded.add_metric([me, link], count)
        yield forwarded
        yield counter("trellis_deliveries", "Publications delivered to local clients", s.deliveries)
        yield counter(
            "trellis_deliveries_dropped",
            "Deliveries dropped because a subscriber's send buffer was full",
            s.deliveries_dropped,
        )
        yield counter(
            "trellis_protocol_errors", "Connections closed for bad input", s.protocol_errors
        )
        yield counter(
            "trellis_slow_consumers_closed",
            "Clients closed because their send buffer was full (slow_consumer = disconnect)",
            s.slow_consumers_closed,
        )
        yield gauge(
            "trellis_publisher_streams",
            "Publishers whose copies from a neighbour VN this broker agrees on (at most "
            "max_publishers)",
            b.publisher_streams(),
        )
        yield counter(
            "trellis_sessions_parked",
            "Client connections lost without a close (a reset, heartbeat silence) whose "
            "session was kept for session_linger",
            s.sessions_parked,
        )
        yield counter(
            "trellis_sessions_resumed",
            "Client sessions claimed by a reconnection after their connection was lost",
            s.sessions_resumed,
        )
        yield counter(
            "trellis_sessions_ended",
            "Parked client sessions that ended unclaimed (session_linger) or over session_buffer",
            s.sessions_ended,
        )
        over = CounterMetricFamily(
            "trellis_requests_over_limit",
            "Requests refused with ERROR limit_exceeded, by the limit's config key",
            labels=["broker", "limit"],
        )
        for limit, count in sorted(s.over_limit.items()):
            over.add_metric([me, limit], count)
        yield over
        yield counter("trellis_shares_received", "Key shares this broker received", s.shares_in)
        yield counter(
            "trellis_shares_split", "Key shares re-split toward a next-hop VN", s.shares_split
        )
        yield counter(
            "trellis_shares_forwarded", "Sub-shares sent to next-hop replicas", s.shares_forwarded
        )
        yield counter(
            "trellis_shares_delivered", "Key shares handed to local subscribers", s.shares_delivered
        )
        yield counter(
            "trellis_shares_over_budget",
            "Key shares dropped because their sender's shares waiting for content or a path "
            "were charged max_waiting_share_bytes already",
            s.shares_over_budget,
        )
        yield counter(
            "trellis_lagging_links_closed",
            "Links to a replica closed because more than 4 x send_buffer_limit was queued to "
            "it while the other replicas of its VN kept up",
            s.lagging_links_closed,
        )
        yield counter(
            "trellis_bad_shares",
            "Key shares rejected (malformed or failing verification)",
            s.bad_shares,
        )
        blame = CounterMetricFamily(
            "trellis_share_blame",
            "Bad key shares attributed to the broker that produced them",
            labels=["broker", "culprit"],
        )
        for culprit, count in sorted(s.blamed.items()):
            blame.add_metric([me, culprit], count)
        yield blame
        copy_blame = CounterMetricFamily(
            "trellis_copy_blame",
            "Publication copies from an upstream replica proven bad (altered, two versions, "
            "flooding) or missing (silent)",
            labels=["broker", "culprit", "fault"],
        )
        for (culprit, fault), count in sorted(s.copy_blamed.items()):
            copy_blame.add_metric([me, culprit, fault], count)
        yield copy_blame
        yield counter(
            "trellis_bad_signatures",
            "Confidential PUBLISH refused: the publisher signature did not verify",
            s.bad_signatures,
        )
        yield counter(
            "trellis_requests_rejected", "Requests refused with an error", s.requests_rejected
        )
        cumulative = []
        running = 0
        for bound, count in zip(MATCH_BUCKETS, s.match_buckets, strict=False):
            running += count
            cumulative.append((repr(bound), running))
        cumulative.append(("+Inf", s.match_count))
        hist = HistogramMetricFamily(
            "trellis_matching_latency_seconds", "Time to match one publication", labels=names
        )
        hist.add_metric([me], cumulative, s.match_sum)
        yield hist
        srt, prt = b.table_sizes()
        clients, links = b.connection_counts()
        yield gauge("trellis_srt_entries", "Advertisements in the SRT", srt)
        yield gauge("trellis_prt_entries", "Subscriptions in the PRT", prt)
        yield gauge("trellis_connected_clients", "Connected clients", clients)
        yield gauge("trellis_broker_links", "Overlay links up", links)
        # Scraped on the broker's own loop: a task leak shows as a rising line.
        yield gauge(
            "trellis_asyncio_tasks", "Tasks on the broker's event loop", len(asyncio.all_tasks())
        )
        r = b.round_stats
        rounds = CounterMetricFamily(
            "trellis_reconfig_rounds",
            "Reconfiguration rounds this broker led as master, by outcome",
            labels=["broker", "outcome"],
        )
        for outcome, count in (
            ("applied", r.applied),
            ("partial", r.partial),
            ("no_plan", r.no_plan),
            ("refused", r.refused),
            ("aborted", r.aborted),
        ):
            rounds.add_metric([me, outcome], count)
        yield rounds
        yield counter(
            "trellis_reconfig_requested_moves",
            "Moves an operator asked this broker to coordinate (trellis rebuild)",
            r.requested,
        )
        yield counter(
            "trellis_reconfig_links_changed", "Links added by applied plans", r.links_changed
        )
        # A live round's freeze reads each publisher's and outside link's stream up to a
        # mark; a stream with no mark within the patience is frozen where it is (the replay
        # at install covers it): a rising "unmarked" means clients or peers not answering.
        frozen = CounterMetricFamily(
            "trellis_reconfig_streams_frozen",
            "Streams a live round's freeze held, by whether they were read up to a mark",
            labels=["broker", "how"],
        )
        frozen.add_metric([me, "marked"], r.marked)
        frozen.add_metric([me, "unmarked"], r.unmarked)
        yield frozen
        yield counter(
            "trellis_reconfig_cost_saved",
            "Local (= global) routing cost saved by applied plans, in window demand units",
            r.saving,
        )
        yield gauge(
            "trellis_reconfig_last_cost_before",
            "Local cost before the last plan",
            r.last_cost_before,
        )
        yield gauge(
            "trellis_reconfig_last_cost_after", "Local cost after the last plan", r.last_cost_after
        )


STATIC = "static"
"""The directory of ``broker.daemon`` holding the admin page's files (package data)."""

PAGE_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

OVERLAY_FILE = "overlay.json"
"""Where a local overlay (``trellis up``) lists its brokers' admin addresses, beside the
brokers' links files; the page uses it to find the other brokers' admin endpoints."""


def _admin_peers(config: BrokerConfig) -> dict[str, str]:
    """Admin URLs of the other brokers, by id, from a local overlay's description."""
    if config.links_file is None:
        return {}
    path = Path(config.links_file).parent / OVERLAY_FILE
    try:
        if path.stat().st_size > 1 << 20:
            return {}
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {
            str(b["id"]): str(b["admin"])
            for b in doc.get("brokers", [])
            if isinstance(b, dict) and b.get("admin")
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _manifest(config: BrokerConfig) -> dict[str, Any] | None:
    """The overlay manifest's VNs and starting tree (its keys left out), if configured."""
    if config.manifest is None:
        return None
    try:
        doc = json.loads(Path(config.manifest).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {"error": f"{config.manifest}: {exc}"}
    if not isinstance(doc, dict):
        return {"error": f"{config.manifest}: not a JSON object"}
    return {k: v for k, v in doc.items() if k != "keys"}


def topology_doc(broker: Observed, admin_url: str) -> dict[str, Any]:
    """``/api/topology``: this broker, its links, and what it knows of the overlay."""
    config = broker.config
    health = broker.health()
    links = health.get("links", [])
    up = {str(b) for b in links} if isinstance(links, list) else set()
    s = broker.stats
    states = broker.linkstates.states
    return {
        "id": config.id,
        "vn": config.vn or config.id,
        "replica": config.replica,
        "vn_size": config.vn_size,
        "admin": admin_url,
        "status": health.get("status"),
        "links": sorted(up),
        "neighbours": [
            {"id": n.id, "vn": n.vn_id, "endpoint": n.endpoint, "up": n.id in up}
            for n in sorted(config.neighbours, key=lambda n: n.id)
        ],
        "overlay": {
            "brokers": {
                b: {"vn": vn, "links": sorted(links), "version": version}
                for b, (version, vn, links) in sorted(states.items())
            },
            "vn_links": sorted(sorted(edge) for edge in broker.linkstates.vn_edges()),
        },
        "manifest": _manifest(config),
        "admin_peers": _admin_peers(config),
        "traffic": {
            "forwarded": dict(sorted(s.forwarded.items())),
            "publications_in": s.publications_in,
            "copies_in": s.forwards_in,
            "routed": s.routed,
            "deliveries": s.deliveries,
            "deliveries_dropped": s.deliveries_dropped,
            "slow_consumers_closed": s.slow_consumers_closed,
            "over_limit": dict(sorted(s.over_limit.items())),
        },
        "blame": {
            "share": dict(sorted(s.blamed.items())),
            "copy": [
                {"culprit": culprit, "fault": fault, "count": count}
                for (culprit, fault), count in sorted(s.copy_blamed.items())
            ],
        },
        "tables": {"srt": broker.table_sizes()[0], "prt": broker.table_sizes()[1]},
    }


def routing_doc(broker: Observed) -> dict[str, Any]:
    """``/api/routing``: the SRT and PRT by overlay-wide key, and what went to each link."""
    router = broker.router
    me = broker.config.vn or broker.config.id
    adverts, subs = router.owned_entries(me)

    def rows(entries: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"key": key, "filter": str(flt), "from": owner, "local": owner == me}
            for key, (flt, owner) in sorted(entries.items())
        ]

    forwarded = {
        str(hop.peer_id): sorted(router.forwarded_to(hop))
        for hop in router.neighbours
        if hop.is_broker
    }
    return {
        "id": broker.config.id,
        "vn": me,
        "srt": rows(adverts),
        "prt": rows(subs),
        "subscriptions_forwarded": forwarded,
    }


def subscription_doc(broker: Observed, key: str) -> dict[str, Any]:
    """``/api/trace?subscription=KEY``: where this broker holds the subscription(s) whose
    overlay-wide key contains ``key``, whom they came from and which links they went on."""
    router = broker.router
    me = broker.config.vn or broker.config.id
    _, subs = router.owned_entries(me)
    held = {k: v for k, v in subs.items() if key and key in k}
    sent = {
        str(hop.peer_id): sorted(k for k in router.forwarded_to(hop) if k in held)
        for hop in router.neighbours
        if hop.is_broker
    }
    entries = [
        {"key": k, "filter": str(flt), "from": owner, "local": owner == me}
        for k, (flt, owner) in sorted(held.items())
    ]
    owners = sorted({owner for _, owner in held.values()})
    if not entries:
        verdict = "not held here: no advertisement behind this broker intersects it, or unknown"
    elif me in owners:
        verdict = "made here by a local client"
    else:
        verdict = "held for publications toward VN " + ", ".join(owners)
    return {
        "id": broker.config.id,
        "vn": me,
        "subscription": key,
        "held": entries,
        "forwarded_to": {vn: keys for vn, keys in sent.items() if keys},
        "verdict": verdict,
    }


def trace_doc(broker: Observed, ring: TraceRing, query: dict[str, list[str]]) -> dict[str, Any]:
    """``/api/trace``: this broker's part of a publication's or a subscription's path."""
    if "subscription" in query:
        return subscription_doc(broker, query["subscription"][0])
    base = {"id": broker.config.id, "vn": broker.config.vn or broker.config.id}
    if "publisher" not in query:
        return {**base, "recent": ring.recent()}
    seq = int(query.get("seq", ["-1"])[0])
    return {**base, **ring.publication(query["publisher"][0], seq)}


def _page_file(name: str) -> bytes:
    return files("broker.daemon").joinpath(STATIC, name).read_bytes()


async def start_admin(broker: Observed, host: str, port: int) -> asyncio.Server:
    """Serve ``/metrics``, ``/healthz``, ``/reconfig``, the admin page and ``/api/*`` for
    ``broker``; recent routing decisions go into a ring from now on (``/api/trace``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    ring = install(broker.forwarder)
    memory = MemoryProbe()
    where: list[str] = []

    def api(path: str, query: dict[str, list[str]]) -> dict[str, Any] | None:
        if path == "/api/topology":
            return topology_doc(broker, where[0] if where else "")
        if path == "/api/routing":
            return routing_doc(broker)
        if path == "/api/reconfig":
            return broker.reconfig_state()
        if path == "/api/trace":
            return trace_doc(broker, ring, query)
        return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, target, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            url = urlsplit(target)
            path = url.path
            extra = ""
            if method != "GET":
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path.startswith("/metrics"):
                status, ctype = "200 OK", "text/plain; version=0.0.4"
                body = generate_latest(registry)
            elif path.startswith("/healthz"):
                status, ctype = "200 OK", "application/json"
                body = json.dumps(broker.health()).encode()
            elif path.startswith("/reconfig"):
                status, ctype = "200 OK", "application/json"
                body = json.dumps(broker.reconfig_state()).encode()
            elif path == "/debug/memory":
                status, ctype = "200 OK", "application/json"
                body = json.dumps(await asyncio.to_thread(memory.report)).encode()
            elif path.startswith("/api/"):
                extra = "Access-Control-Allow-Origin: *\r\nCache-Control: no-store\r\n"
                try:
                    doc = api(path, parse_qs(url.query))
                except ValueError as exc:
                    status, ctype = "400 Bad Request", "application/json"
                    body = json.dumps({"error": str(exc)}).encode()
                else:
                    if doc is None:
                        status, ctype = "404 Not Found", "application/json"
                        body = json.dumps({"error": f"no document {path}"}).encode()
                    else:
                        status, ctype = "200 OK", "application/json"
                        body = json.dumps(doc, default=str).encode()
            elif path in ("/", "/index.html") or path.removeprefix("/static/") in PAGE_FILES:
                name = "index.html" if path in ("/", "/index.html") else path[len("/static/") :]
                status, ctype = "200 OK", PAGE_FILES[name]
                body = _page_file(name)
            else:
                status, ctype = "404 Not Found", "text/plain"
                body = b"try /, /metrics, /healthz, /reconfig or /api/topology\n"
            head = (
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n{extra}"
            )
            writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            await asyncio.wait_for(writer.drain(), 5)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            log.debug("admin request failed: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port)
    bound = server.sockets[0].getsockname()
    where.append(f"http://{bound[0]}:{bound[1]}")
    return server
