"""Broker counters kept as plain integers on the hot path.

Prometheus client objects take a lock per increment; the broker instead bumps plain
attributes and a custom collector turns them into metrics only when ``/metrics`` is scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from security.agreement import LogRate

MATCH_BUCKETS: tuple[float, ...] = (
    1e-6,
    2.5e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    1e-2,
)


@dataclass(slots=True)
class BrokerStats:
    """Everything the broker counts."""

    connections_opened: int = 0
    protocol_errors: int = 0
    requests_rejected: int = 0
    publications_in: int = 0
    deliveries: int = 0
    deliveries_dropped: int = 0
    congestion_events: int = 0
    slow_consumers_closed: int = 0  # clients closed by slow_consumer = "disconnect"
    sessions_parked: int = 0  # client connections lost (not closed) whose session was kept
    sessions_resumed: int = 0  # client sessions a reconnection claimed (broker.daemon.sessions)
    sessions_ended: int = 0  # parked sessions not claimed in time, or over their buffer
    over_limit: dict[str, int] = field(default_factory=dict)  # requests refused, by limit key
    forwards_in: int = 0
    routed: int = 0
    bad_signatures: int = 0
    shares_in: int = 0
    shares_split: int = 0
    shares_forwarded: int = 0
    shares_delivered: int = 0
    bad_shares: int = 0
    lagging_links_closed: int = 0  # a replica's link over LAG_FACTOR x send_buffer_limit
    shares_over_budget: int = 0  # dropped: their sender had max_waiting_share_bytes waiting
    blamed: dict[str, int] = field(default_factory=dict)
    # (culprit, fault) -> copies of publications blamed on an upstream replica
    copy_blamed: dict[tuple[str, str], int] = field(default_factory=dict)
    # warnings about what each neighbour or client sent (for the log's rate only)
    warnings: LogRate = field(default_factory=LogRate)
    forwarded: dict[str, int] = field(default_factory=dict)
    messages_in: dict[str, int] = field(default_factory=dict)
    match_buckets: list[int] = field(default_factory=lambda: [0] * (len(MATCH_BUCKETS) + 1))
    match_sum: float = 0.0
    match_count: int = 0

    def count_in(self, kind: str) -> None:
        self.messages_in[kind] = self.messages_in.get(kind, 0) + 1

    def count_forward(self, link: str | None) -> None:
        key = link or "?"
        self.forwarded[key] = self.forwarded.get(key, 0) + 1

    def observe_match(self, seconds: float) -> None:
        """Record one matching latency in the histogram."""
        self.match_buckets[bisect_left(MATCH_BUCKETS, seconds)] += 1
        self.match_sum += seconds
        self.match_count += 1

    def blame_copy(self, culprit: str, fault: str) -> int:
        """Count a publication copy blamed on ``culprit`` (altered, silent, ...); the copies
        blamed on it for that fault so far."""
        key = (culprit, fault)
        count = self.copy_blamed[key] = self.copy_blamed.get(key, 0) + 1
        return count
