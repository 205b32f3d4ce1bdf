"""Byzantine brokers on demand, for tests and demos: what a faulty replica can and cannot do.

``byzantine = drop | corrupt | equivocate | collude`` in a broker's config (or ``trellis up
--byzantine b1.2=corrupt``) makes the daemon build its forwarder and share relay from the
subclasses here, which override their hooks. An honest broker never runs a line of this
module: the hot path has no fault branches.

* ``drop``: routes nothing and passes no key share on (a silent replica).
* ``corrupt``: flips the bytes of every payload it routes and of every sub-share it sends.
* ``equivocate``: splits each share twice and sends half the next VN's replicas each split.
* ``collude``: the seed's attack; sends every sub-share to replica 0 of the next VN and
  records every share it sees in ``collude_log`` (so tests can try to rebuild a key).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace

from broker.daemon.config import BrokerConfig, NeighbourConfig
from broker.daemon.forwarding import Forwarder
from broker.daemon.hops import Hop
from broker.daemon.shares import SecureForwarding
from broker.daemon.stats import BrokerStats
from broker.daemon.traffic_log import open_traffic_log
from broker.language.filters import Value
from broker.routing.router import Router
from security.propagation import ShareRecord
from security.publication import SecBlock


class _DroppingForwarder(Forwarder):
    def route(
        self,
        source: Hop,
        publisher: str,
        seq: int,
        attrs: Mapping[str, Value],
        payload: bytes,
        sec: SecBlock | None = None,
        *,
        sender: str | None = None,
        digest: int | None = None,
    ) -> None:
        return


class _DroppingShares(SecureForwarding):
    def routed(self, publisher: str, epoch: int, targets: Iterable[Hop], sec: SecBlock) -> None:
        return

    def share_arrived(
        self, publisher: str, epoch: int, raw: bytes, sender: str | None = None
    ) -> None:
        self.stats.shares_in += 1


class _CorruptingForwarder(Forwarder):
    def route(
        self,
        source: Hop,
        publisher: str,
        seq: int,
        attrs: Mapping[str, Value],
        payload: bytes,
        sec: SecBlock | None = None,
        *,
        sender: str | None = None,
        digest: int | None = None,
    ) -> None:
        corrupted = bytes(b ^ 0x5A for b in payload)
        super().route(source, publisher, seq, attrs, corrupted, sec, sender=sender, digest=digest)


class _CorruptingShares(SecureForwarding):
    def recipients_of(self, subs: list[ShareRecord], replica: int) -> list[ShareRecord]:
        sub = subs[replica]
        return [replace(sub, data=bytes(b ^ 0xA5 for b in sub.data))]


class _EquivocatingShares(SecureForwarding):
    def split(self, record: ShareRecord, r: int) -> list[ShareRecord]:
        first, second = super().split(record, r), super().split(record, r)
        return [second[j] if j % 2 else first[j] for j in range(r)]


class _ColludingShares(SecureForwarding):
    def recipients_of(self, subs: list[ShareRecord], replica: int) -> list[ShareRecord]:
        return list(subs) if replica == 0 else []

    def share_arrived(
        self, publisher: str, epoch: int, raw: bytes, sender: str | None = None
    ) -> None:
        if self.config.collude_log is not None:
            with self.config.collude_log.open("a", encoding="utf-8") as out:
                out.write(json.dumps({"broker": self.broker_id, "record": raw.hex()}) + "\n")
        super().share_arrived(publisher, epoch, raw, sender)


_FORWARDERS: dict[str | None, type[Forwarder]] = {
    "drop": _DroppingForwarder,
    "corrupt": _CorruptingForwarder,
}
_SHARES: dict[str | None, type[SecureForwarding]] = {
    "drop": _DroppingShares,
    "corrupt": _CorruptingShares,
    "equivocate": _EquivocatingShares,
    "collude": _ColludingShares,
}


def build_forwarding(
    config: BrokerConfig,
    vn: str,
    router: Router[Hop],
    stats: BrokerStats,
    neighbours: Mapping[str, NeighbourConfig],
) -> Forwarder:
    """The broker's forwarder and share relay, faulty in the way ``config.byzantine`` says
    (honest when it is unset)."""
    mode = config.byzantine
    tlog = open_traffic_log(config)
    shares = _SHARES.get(mode, SecureForwarding)(config, vn, stats, neighbours, tlog)
    return _FORWARDERS.get(mode, Forwarder)(router, stats, shares, tlog)
