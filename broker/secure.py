"""Secret forwarding inside one broker (SPEC §3): re-split every key share per next hop.

Every share this replica holds for a publication is split again with (k', r') for each
next-hop virtual node, sub-share j going to replica j; a local subscriber receives the
shares themselves. Content travels separately (FORWARD/DELIVER), deduplicated per hop.
Fault injection (``byzantine``) lives here too, so tests and demos can show what a
Byzantine minority can and cannot do.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.confidential import publication_id, signature_valid
from broker.protocol import Publish, Share
from overlay.manifest import Manifest
from security.envelope import Signer, private_key_from_bytes
from security.propagation import (
    PropagationError,
    ShareRecord,
    pack_record,
    resplit,
    threshold_for,
    unpack_record,
)

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger("trellis.security")

_ROUTE_MEMORY = 8192
_EARLY_SHARES = 4096


class SecureForwarding:
    """Per-broker state of confidential publications: routes, keys, early shares."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        config = broker.config
        self.mode = config.byzantine
        self.manifest = Manifest.load(config.manifest) if config.manifest else None
        self.signer: Signer | None = None
        if config.key_file is not None:
            raw = bytes.fromhex(Path(config.key_file).read_text(encoding="utf-8").strip())
            self.signer = Signer(config.id, private_key_from_bytes(raw))
        # (publisher, seq) -> the hops this broker routed the publication to.
        self.routes: OrderedDict[tuple[str, int], dict[Any, list[str]]] = OrderedDict()
        # Shares that overtook their content (from another upstream replica).
        self.early: OrderedDict[tuple[str, int], list[bytes]] = OrderedDict()
        self.collude_log = config.collude_log if self.mode == "collude" else None

    @property
    def enabled(self) -> bool:
        return self.signer is not None and self.manifest is not None

    def check_publish(self, publisher: str, msg: Publish) -> str | None:
        """Why a client's confidential PUBLISH is unacceptable here, or None."""
        if not self.enabled:
            return "this broker has no key or manifest: confidential forwarding is disabled"
        sec = msg.sec
        assert sec is not None
        if sec["vn"] != self.broker.vn:
            return f"sec.vn is {sec['vn']!r} but this broker belongs to {self.broker.vn!r}"
        if not signature_valid(publisher, msg.seq, msg.attrs, msg.payload, sec):
            return "the publisher signature does not verify"
        try:
            record = unpack_record(sec["share"])
        except PropagationError as exc:
            return f"malformed key share: {exc}"
        if record.pub_id != publication_id(publisher, msg.seq):
            return "the key share belongs to another publication"
        if record.lineage != (self.broker.config.replica,):
            return f"share {record.lineage} is not for replica {self.broker.config.replica}"
        return None

    def route_known(self, publisher: str, seq: int, targets: dict[Any, list[str]]) -> None:
        """Remember where a confidential publication went; release shares that waited."""
        key = (publisher, seq)
        self.routes[key] = targets
        if len(self.routes) > _ROUTE_MEMORY:
            self.routes.popitem(last=False)
        for raw in self.early.pop(key, ()):
            self.share_arrived(publisher, seq, raw)

    def share_arrived(self, publisher: str, seq: int, raw: bytes, source: Any = None) -> None:
        """Handle one share this replica now holds: re-split it toward every next hop."""
        stats = self.broker.stats
        stats.shares_in += 1
        if self.mode == "drop" or not self.enabled:
            return
        key = (publisher, seq)
        targets = self.routes.get(key)
        if targets is None:
            waiting = self.early.setdefault(key, [])
            waiting.append(raw)
            if len(self.early) > _EARLY_SHARES:
                self.early.popitem(last=False)
            return
        try:
            record = unpack_record(raw)
        except PropagationError as exc:
            stats.bad_shares += 1
            log.warning("malformed share of %s/%d from %s: %s", publisher, seq, source, exc)
            return
        if record.pub_id != publication_id(publisher, seq):
            stats.bad_shares += 1
            return
        if self.collude_log is not None:
            self._record_collusion(raw)
        for hop, _ in targets.items():
            if hop.is_broker:
                self._split_toward(hop, publisher, seq, record)
            elif not hop.closing:
                hop.send(Share(publisher, seq, raw))
                stats.shares_delivered += 1

    def _split_toward(self, hop: Any, publisher: str, seq: int, record: ShareRecord) -> None:
        assert self.signer is not None
        r = hop.size
        subs = resplit(record, threshold_for(r), r, self.signer)
        self.broker.stats.shares_split += 1
        if self.mode == "equivocate":
            # Two different splits of the same share, half the replicas get each.
            other = resplit(record, threshold_for(r), r, self.signer)
            subs = [other[j] if j % 2 else subs[j] for j in range(r)]
        neighbours = self.broker.neighbours
        for broker_id, conn in hop.members.items():
            if conn.closing:
                continue
            j = neighbours[broker_id].replica
            sub = subs[j]
            if self.mode == "corrupt":
                sub = replace(sub, data=bytes(b ^ 0xA5 for b in sub.data))
            elif self.mode == "collude":
                # The seed's attack: every sub-share to a single receiver, replica 0.
                if j != 0:
                    continue
                for leaked in subs:
                    conn.send(Share(publisher, seq, pack_record(leaked)))
                continue
            conn.send(Share(publisher, seq, pack_record(sub)))
            self.broker.stats.shares_forwarded += 1

    def _record_collusion(self, raw: bytes) -> None:
        assert self.collude_log is not None
        with self.collude_log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"broker": self.broker.config.id, "record": raw.hex()}) + "\n")
