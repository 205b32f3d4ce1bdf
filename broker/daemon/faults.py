"""Byzantine brokers on demand, for tests and demos: what a faulty replica can and cannot do.

``byzantine = drop | corrupt | equivocate | collude`` in a broker's config (or ``trellis up
--byzantine b1.2=corrupt``) makes the daemon build its forwarder and share relay from the
subclasses here, which override their hooks. An honest broker never runs a line of this
module: the hot path has no fault branches. Each share mode acts on key shares by the pass
(:mod:`broker.daemon.passes`) as on records: a corrupt replica flips its blobs, an
equivocating one splits each pass twice, a colluding one sends every blob to replica 0.

* ``drop``: routes nothing and passes no key share on (a silent replica).
* ``corrupt``: flips the bytes of every payload it routes and of every sub-share it sends.
* ``equivocate``: sends the odd-numbered replicas of each next VN an altered payload and the
  others the genuine one, and splits each share twice, sending half the replicas each split.
* ``delay``: routes every publication and passes every share on ``FAULT_DELAY`` seconds late.
* ``replay``: routes every publication, then routes again the one it routed
  ``REPLAY_DISTANCE`` publications earlier (old copies, sent anew).
* ``reorder``: routes publications in swapped pairs (the second before the first).
* ``stall``: stops reading its links from a VN once a publication came over them, but
  keeps them alive (it PINGs them): its upstream neighbours' links to it fill and stay open.
* ``collude``: the seed's attack; sends every sub-share to replica 0 of the next VN and
  records every share it sees in ``collude_log`` (so tests can try to rebuild a key). The
  records are written by a thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker.daemon.config import BrokerConfig, NeighbourConfig
from broker.daemon.forwarding import Forwarder
from broker.daemon.hops import Hop, VNHop
from broker.daemon.passes import PassForwarding
from broker.daemon.shares import Incoming, SecureForwarding
from broker.daemon.stats import BrokerStats
from broker.daemon.traffic_log import open_traffic_log
from broker.language.filters import Value
from broker.routing.router import Router
from broker.wire.protocol import Pass, encode_forward
from security.pass_shares import Held, PassStatement, open_pass, parse_statement
from security.propagation import PropagationError, ShareRecord, pack_record
from security.publication import SecBlock

FAULT_DELAY = 0.5
REPLAY_DISTANCE = 3

Routed = tuple[Hop, str, int, Mapping[str, Value], bytes, SecBlock | None]
"""The arguments of one :meth:`Forwarder.route` call."""


def _altered(payload: bytes) -> bytes:
    """``payload`` with every byte XORed with 0x5A."""
    n = len(payload)
    return (int.from_bytes(payload, "little") ^ int.from_bytes(b"\x5a" * n, "little")).to_bytes(
        n, "little"
    )


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


class _DroppingPasses(PassForwarding):
    def pass_arrived(self, msg: Pass, sender: str) -> None:
        return


class _DroppingShares(SecureForwarding):
    pass_forwarding = _DroppingPasses

    def routed(self, publisher: str, epoch: int, targets: Iterable[Hop], sec: SecBlock) -> None:
        return

    def share_arrived(
        self, publisher: str, epoch: int, raw: Incoming, sender: str | None = None
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
        super().route(
            source, publisher, seq, attrs, _altered(payload), sec, sender=sender, digest=digest
        )


class _EquivocatingForwarder(Forwarder):
    def send_forward(
        self,
        hop: Hop,
        frame: bytes,
        publisher: str,
        seq: int,
        attrs: Mapping[str, Value],
        payload: bytes,
        sec: SecBlock | None,
    ) -> None:
        if not isinstance(hop, VNHop):
            hop.send_raw(frame)
            return
        altered = encode_forward(publisher, seq, attrs, _altered(payload), sec)
        for broker_id, conn in hop.members.items():
            if not conn.closing:
                odd = self.shares.neighbours[broker_id].replica % 2
                conn.send_raw(altered if odd else frame)


class _DelayingForwarder(Forwarder):
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
        late = super().route
        asyncio.get_running_loop().call_later(
            FAULT_DELAY, lambda: late(source, publisher, seq, attrs, payload, sec, sender=sender)
        )


class _ReplayingForwarder(Forwarder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.history: deque[Routed] = deque()

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
        super().route(source, publisher, seq, attrs, payload, sec, sender=sender, digest=digest)
        self.history.append((source, publisher, seq, attrs, payload, sec))
        if len(self.history) > REPLAY_DISTANCE:
            super().route(*self.history.popleft())


class _ReorderingForwarder(Forwarder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: Routed | None = None

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
        held, self.held = self.held, None
        if held is None:
            self.held = (source, publisher, seq, attrs, payload, sec)
            return
        super().route(source, publisher, seq, attrs, payload, sec, sender=sender, digest=digest)
        super().route(*held)


PassSends = list[tuple[int, PassStatement, bytes]]


class _CorruptingPasses(PassForwarding):
    def split(self, hop: VNHop, shares: list[Held]) -> PassSends:
        return [
            (j, st, bytes(b ^ 0xA5 for b in blob)) for j, st, blob in super().split(hop, shares)
        ]


class _EquivocatingPasses(PassForwarding):
    def split(self, hop: VNHop, shares: list[Held]) -> PassSends:
        first, second = super().split(hop, shares), super().split(hop, shares)
        return [second[j] if j % 2 else first[j] for j in range(len(first))]


class _DelayingPasses(PassForwarding):
    def pass_arrived(self, msg: Pass, sender: str) -> None:
        late = super().pass_arrived
        asyncio.get_running_loop().call_later(FAULT_DELAY, lambda: late(msg, sender))


class _CorruptingShares(SecureForwarding):
    pass_forwarding = _CorruptingPasses

    def recipients_of(self, subs: list[ShareRecord], replica: int) -> list[ShareRecord]:
        sub = subs[replica]
        return [replace(sub, data=bytes(b ^ 0xA5 for b in sub.data))]


class _EquivocatingShares(SecureForwarding):
    pass_forwarding = _EquivocatingPasses

    def split(self, record: ShareRecord, r: int) -> list[ShareRecord]:
        first, second = super().split(record, r), super().split(record, r)
        return [second[j] if j % 2 else first[j] for j in range(r)]


class _DelayingShares(SecureForwarding):
    pass_forwarding = _DelayingPasses

    def share_arrived(
        self, publisher: str, epoch: int, raw: Incoming, sender: str | None = None
    ) -> None:
        late = super().share_arrived
        asyncio.get_running_loop().call_later(
            FAULT_DELAY, lambda: late(publisher, epoch, raw, sender)
        )


class _Evidence:
    """Appends lines to a file from a thread, so the event loop never waits on the disk."""

    def __init__(self, path: Path) -> None:
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        threading.Thread(target=self._write, args=(path,), daemon=True).start()

    def _write(self, path: Path) -> None:
        with path.open("a", encoding="utf-8") as out:
            while True:
                out.write(self.lines.get())
                if self.lines.empty():
                    out.flush()


class _ColludingPasses(PassForwarding):
    """Every blob to replica 0 of the next VN; every share it opens on the evidence log."""

    def split(self, hop: VNHop, shares: list[Held]) -> PassSends:
        return [(0, st, blob) for _, st, blob in super().split(hop, shares)]

    def pass_arrived(self, msg: Pass, sender: str) -> None:
        evidence = self.owner.evidence if isinstance(self.owner, _ColludingShares) else None
        if evidence is not None:
            try:
                statement = parse_statement(msg.statement, msg.signature)
            except PropagationError:
                statement = None
            if statement is not None:
                held, _ = open_pass(statement, msg.blob, self.owner.replica)
                for share in held:
                    line = {
                        "broker": self.owner.broker_id,
                        "pub_id": share.pub_id.hex(),
                        "lineage": list(share.lineage),
                        "opening": share.opening.hex(),
                    }
                    evidence.lines.put(json.dumps(line) + "\n")
        super().pass_arrived(msg, sender)


class _ColludingShares(SecureForwarding):
    pass_forwarding = _ColludingPasses

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = self.config.collude_log
        self.evidence = None if path is None else _Evidence(path)

    def recipients_of(self, subs: list[ShareRecord], replica: int) -> list[ShareRecord]:
        return list(subs) if replica == 0 else []

    def share_arrived(
        self, publisher: str, epoch: int, raw: Incoming, sender: str | None = None
    ) -> None:
        if self.evidence is not None and not isinstance(raw, Exception):
            packed = raw if isinstance(raw, bytes) else pack_record(raw)
            line = json.dumps({"broker": self.broker_id, "record": packed.hex()})
            self.evidence.lines.put(line + "\n")
        super().share_arrived(publisher, epoch, raw, sender)


class _StallingForwarder(Forwarder):
    """Stops reading its links from a VN once a publication came over them, yet keeps
    them alive (PINGs, as during a freeze): what is sent to it piles up on the other side,
    whose link stays open and over its limit."""

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
        if isinstance(source, VNHop):
            for conn in source.members.values():
                broker = getattr(conn, "broker", None)
                if broker is not None and conn not in broker.paused:
                    conn.hold("stalled")  # type: ignore[attr-defined]
                    broker.paused.append(conn)
        super().route(source, publisher, seq, attrs, payload, sec, sender=sender, digest=digest)


_FORWARDERS: dict[str | None, type[Forwarder]] = {
    "drop": _DroppingForwarder,
    "corrupt": _CorruptingForwarder,
    "equivocate": _EquivocatingForwarder,
    "delay": _DelayingForwarder,
    "replay": _ReplayingForwarder,
    "reorder": _ReorderingForwarder,
    "stall": _StallingForwarder,
}
_SHARES: dict[str | None, type[SecureForwarding]] = {
    "drop": _DroppingShares,
    "corrupt": _CorruptingShares,
    "equivocate": _EquivocatingShares,
    "collude": _ColludingShares,
    "delay": _DelayingShares,
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
    return _FORWARDERS.get(mode, Forwarder)(
        router,
        stats,
        shares,
        tlog,
        patience=config.copy_patience,
        silence_deadline=config.silence_deadline,
        max_publishers=config.max_publishers,
        max_copy_bytes=config.max_copy_bytes_per_source,
    )
