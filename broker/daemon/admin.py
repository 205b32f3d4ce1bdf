"""The admin endpoint of a broker: ``/metrics`` (Prometheus) and ``/healthz`` (JSON).

A deliberately tiny HTTP/1.0 responder on asyncio streams: two GET routes need no web
framework, and it shares the broker's event loop without blocking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from broker.daemon.stats import MATCH_BUCKETS, BrokerStats
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

    def connection_counts(self) -> tuple[int, int]:
        """(connected clients, overlay links up)."""

    def health(self) -> dict[str, object]:
        """The ``/healthz`` document."""

    def reconfig_state(self) -> dict[str, Any]:
        """The ``/reconfig`` document."""


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
            "Confidential publications discarded: publisher signature did not verify",
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
        r = b.round_stats
        rounds = CounterMetricFamily(
            "trellis_reconfig_rounds",
            "Reconfiguration rounds this broker led as master, by outcome",
            labels=["broker", "outcome"],
        )
        for outcome, count in (
            ("applied", r.applied),
            ("no_plan", r.no_plan),
            ("refused", r.refused),
            ("aborted", r.aborted),
        ):
            rounds.add_metric([me, outcome], count)
        yield rounds
        yield counter(
            "trellis_reconfig_links_changed", "Links added by applied plans", r.links_changed
        )
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


async def start_admin(broker: Observed, host: str, port: int) -> asyncio.Server:
    """Serve ``/metrics``, ``/healthz`` and ``/reconfig`` for ``broker``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
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
            else:
                status, ctype = "404 Not Found", "text/plain"
                body = b"try /metrics, /healthz or /reconfig\n"
            head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            await asyncio.wait_for(writer.drain(), 5)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            log.debug("admin request failed: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)
