"""Secret forwarding inside one broker (SPEC §3): re-split every key share per next hop.

Every share this replica holds for a key epoch is split again with (k', r') for each
next-hop virtual node, sub-share j going to replica j; a local subscriber receives the
shares themselves. Content travels separately (FORWARD/DELIVER), deduplicated per hop.

Key epochs: a publisher may encrypt several publications under one key. Shares then travel
once per epoch and per hop: the first time a publication of an epoch is routed to a hop,
this replica sends that hop every share it holds for the epoch, and every share that
arrives later goes to every hop already served. A subscriber or branch that appears
mid-epoch is therefore served from the shares its upstream replicas hold.

Signature work is amortised: the sub-shares split in one event-loop pass are sent at the end
of it, their certificates sealed together by one signature over a Merkle root
(:class:`~security.propagation.CertBatch`). An incoming share is checked at once by hashing
only (structure, digest links, its commitment); its sender's seal costs a signature
verification (once per batch root) only when this replica is about to split the share and so
vouch for it. A share only relayed to local subscribers has that seal checked by sample
(one in :data:`RELAY_CHECK_ONE_IN`, after the pass's write), and every share of a sender
once one of its seals failed: the subscriber's edge VN, which splits nothing, verifies no
signature on the critical path (see :mod:`security.propagation` for why blame stays sound).

Spare splits: once this replica split all but one of the shares its upstream VN sends it
for an epoch toward a hop, the last one waits for the next pass that writes shares anyway
(:data:`SPARE_DELAY` at most): the prompt ones already give every subscriber the key.

Silence: an upstream replica that sent no share of an epoch within :data:`SILENCE_DEADLINE`
seconds of its content being routed here is blamed (``stats.blamed``, the traffic log),
except for epochs routed here within that long of a change of this broker's routing (a live
round installed here, a membership version adopted): the upstream replicas switch to the new
tables one by one, so an honest one may already send that epoch's shares on its new path.

The publisher's signature over a client's confidential ``PUBLISH`` is checked here too.
Byzantine behaviour for tests and demos is not here: :mod:`broker.daemon.faults` wraps the
hooks :meth:`SecureForwarding.split` and :meth:`SecureForwarding.recipients_of`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from pathlib import Path

from broker.daemon.config import BrokerConfig, NeighbourConfig
from broker.daemon.hops import Hop, Member, VNHop
from broker.daemon.passes import EPOCH_MEMORY, PassForwarding, epoch_entry
from broker.daemon.stats import BrokerStats
from broker.daemon.traffic_log import TrafficLog
from broker.wire.protocol import Publish, Shares
from overlay.manifest import Manifest
from security.agreement import worth_logging
from security.envelope import Signer, private_key_from_bytes
from security.paths import PathVote, claimed_path, path_view
from security.propagation import (
    CertBatch,
    ChainVerifier,
    LinkCertsIn,
    LinkCertsOut,
    PropagationError,
    ShareInbox,
    ShareRecord,
    silent_senders,
    threshold_for,
    unpack_record,
)
from security.publication import SecBlock, publication_id, signature_valid
from security.waiting import WaitingShares, Weight

log = logging.getLogger("trellis.security")

DISABLED = "this broker has no key or manifest: confidential forwarding is disabled"
"""Why a broker refuses confidential traffic when it cannot sign or verify shares."""

Pending = tuple[ShareRecord, str, tuple[str, ...] | None]
"""A share not verified yet: record, sender, the path it claims (None: unknown)."""


def _weigh(pending: Pending) -> Weight:
    """A waiting record's bytes: its share and, as if its own, the certificates it carries
    (records of one frame share them, so this over-counts, never under-counts)."""
    record, sender, _ = pending
    certs = sum(
        len(c.signature) + 32 * (len(c.commitments) + len(c.proof) + 2) for c in record.certs
    )
    return sender, None, 0, len(record.salt) + len(record.data) + certs


Held = tuple[ShareRecord, ShareInbox, str]
"""A share this replica accepted: record, the inbox that accepted it (its path's verifier),
and its sender (the splitter of its newest certificate)."""

Incoming = bytes | ShareRecord | PropagationError
"""A share as it reaches :meth:`SecureForwarding.share_arrived`: packed (SHARE, PUBLISH),
parsed from a SHARES frame, or why its SHARES entry was malformed."""

RELAY_CHECK_ONE_IN = 16
"""A share relayed to a local subscriber without being split has its sender's seal verified
with probability 1 / this (after the write); a sender caught once is checked every time."""

# Which shares are checked: seeded from os.urandom, and no draw is ever visible outside this
# process, so a sender cannot tell which of its shares will be (``secrets`` costs a system
# call per draw).
_draw = random.Random()

SPARE_DELAY = 0.025
"""Seconds the split of an epoch's last upstream share may wait for the next pass that
writes shares. A replica that already split all but one of the shares its upstream VN sends
it leaves the last one for the next pass that writes anyway (or this timer): the shares split
at once already let a subscriber recover the key, so in the fault-free case the spare one
costs no latency, and it no longer costs a seal, a write and a read at every hop below."""

RECENT_SHARES = 1024
"""Share records a local client's connection keeps (the newest) for its session to be sent
again after a loss: the keys of the last 128 confidential publications over a path of three
VNs of three replicas (9 leaves per edge replica)."""

SILENCE_DEADLINE = 3.0
"""Seconds after an epoch's content was routed here by which every upstream replica must
have sent a share of it; one that sent none is blamed as silent."""


class SecureForwarding:
    """Per-broker state of confidential publications: epoch shares held, hops served."""

    # Key shares by the pass (a publisher's choice) are handled by this class's instance.
    pass_forwarding: type[PassForwarding] = PassForwarding

    def __init__(
        self,
        config: BrokerConfig,
        vn: str,
        stats: BrokerStats,
        neighbours: Mapping[str, NeighbourConfig],
        tlog: TrafficLog | None = None,
    ) -> None:
        self.config = config
        # The broker's traffic log (SPEC §7): share verdicts are logged there.
        self.tlog = tlog
        self.broker_id = config.id
        self.replica = config.replica
        self.vn = vn
        self.stats = stats
        # The broker's current neighbours (reconfiguration changes them in place).
        self.neighbours = neighbours
        self.manifest = Manifest.load(config.manifest) if config.manifest else None
        self.signer: Signer | None = None
        if config.key_file is not None:
            raw = bytes.fromhex(Path(config.key_file).read_text(encoding="utf-8").strip())
            self.signer = Signer(config.id, private_key_from_bytes(raw))
        # (publisher, epoch) -> the share records this replica holds for that key (relayed
        # as received to local subscribers)
        self.held: OrderedDict[tuple[str, int], list[Held]] = OrderedDict()
        # Seal checks of shares relayed unsplit (sampled), run after the pass's write; the
        # senders caught with a bad seal (checked on every share from then on); the
        # certificates already blamed for one.
        self._relay_checks: list[tuple[str, int, Held]] = []
        self.distrusted: set[str] = set()
        self._bad_seals: OrderedDict[object, None] = OrderedDict()
        # (publisher, epoch) -> hops that have been sent this replica's shares
        self.served: OrderedDict[tuple[str, int], list[Hop]] = OrderedDict()
        # (publisher, epoch) -> path -> the verifier of incoming shares along that path. An
        # epoch's shares may reach a replica along two paths when reconfiguration moves a
        # link mid-epoch; the key is the same, each set is verified on its own path.
        self.inboxes: OrderedDict[tuple[str, int], dict[tuple[str, ...], ShareInbox]] = (
            OrderedDict()
        )
        # shares not verified yet (content not routed here, or their path not agreed): (record,
        # sender, the path it claims once the content is known)
        self.unverified: WaitingShares[tuple[str, int], Pending] = WaitingShares(
            _weigh, config.max_waiting_share_bytes, EPOCH_MEMORY
        )
        self.waiting_budget = config.max_waiting_share_bytes
        # What one PASS or LEAVES frame may carry (half the frame limit: room for framing).
        self.frame_budget = config.max_frame // 2
        # The security block of each epoch whose content was routed here.
        self.secs: OrderedDict[tuple[str, int], SecBlock] = OrderedDict()
        # Splits of this event-loop pass, sealed by one signature, and the shares they make
        # or relay (to a broker of a next VN, or to a local subscriber), sent per receiver
        # in SHARES frames at the end of the pass.
        self.batch = CertBatch(self.signer) if self.signer is not None else None
        self._outbox: list[tuple[Member | Hop, str, int, ShareRecord]] = []
        # Certificate ids per connection, out and in (ids number what one connection
        # carried: a late frame of a closed connection must not read a new one's ids).
        self._certs_out: dict[Member | Hop, LinkCertsOut] = {}
        # The share records each local client was sent last (a session parked after its
        # connection was lost is sent them again: they may have died in flight).
        # Kept only when sessions are (session_linger > 0).
        self._recent: dict[Member | Hop, deque[tuple[str, int, ShareRecord]]] = {}
        self._keep_recent = config.session_linger > 0
        self.recent_shares = RECENT_SHARES
        self._certs_in: dict[Member, LinkCertsIn] = {}
        self._flushing = False
        # Splits left for the next pass that writes anyway (SPARE_DELAY), and how many
        # shares of an epoch were split at once toward each hop.
        self._spares: list[tuple[VNHop, str, int, ShareRecord]] = []
        self._spare_timer: asyncio.TimerHandle | None = None
        self._prompt: OrderedDict[tuple[str, int], dict[VNHop, int]] = OrderedDict()
        # (deadline, epoch) in routing order: when to judge who stayed silent; and who sent
        # anything at all for an epoch (on whatever path it claimed).
        self._deadlines: deque[tuple[float, tuple[str, int]]] = deque()
        # When this broker's routing last changed (loop time): see routing_changed().
        self._changed: deque[float] = deque(maxlen=8)
        self.heard: OrderedDict[tuple[str, int], list[str]] = OrderedDict()
        self._sweeping = False
        # (next-hop VN, r) -> shares split toward it with r replicas (a live attach or detach
        # switches r: after the switch, the old count must not grow)
        self.splits_by_scheme: dict[tuple[str, int], int] = {}
        # Key shares by the pass (a publisher's choice): the same epochs, hops and blame.
        self.passes = self.pass_forwarding(self)

    def adopt_manifest(self, manifest: Manifest) -> None:
        """A new manifest version is in force (replicas attached or detached): verify from
        now on against it, shares of epochs already under way included (it still allows
        the replica counts of the versions before it)."""
        self.manifest = manifest
        self.routing_changed()
        for key, inboxes in self.inboxes.items():
            sec = self.secs.get(key)
            if sec is None:
                continue
            for path, inbox in inboxes.items():
                try:
                    view = path_view(manifest, key[0], sec, path)
                except (PropagationError, KeyError):
                    continue
                inbox.rebase(view)
        for key in self.passes.paths:
            self.passes.rebase(key)

    @property
    def member(self) -> bool:
        """Whether this replica is one of its VN's members in the manifest in force: one
        about to join or just left is not sent every share, so it judges no silence."""
        manifest = self.manifest
        return manifest is not None and self.broker_id in manifest.members.get(self.vn, ())

    @property
    def keep_recent(self) -> bool:
        """Whether local clients' recent shares are kept for their parked sessions."""
        return self._keep_recent

    @property
    def pending(self) -> bool:
        """Whether sub-shares split in this pass wait to be sealed and sent."""
        return bool(self._outbox) or self.passes.pending

    def sample_relay(self) -> bool:
        """Whether to verify the seal of one share relayed unsplit (RELAY_CHECK_ONE_IN)."""
        return _draw.randrange(RELAY_CHECK_ONE_IN) == 0

    @property
    def enabled(self) -> bool:
        return self.signer is not None and self.manifest is not None

    def check_publish(self, publisher: str, msg: Publish) -> str | None:
        """Why a client's confidential PUBLISH is unacceptable here, or None."""
        if not self.enabled:
            return DISABLED
        sec = msg.sec
        assert sec is not None
        if sec.vn != self.vn:
            return f"sec.vn is {sec.vn!r} but this broker belongs to {self.vn!r}"
        if sec.epoch > msg.seq:
            return f"epoch {sec.epoch} starts after the publication itself"
        if not signature_valid(publisher, msg.seq, msg.attrs, msg.payload, sec):
            self.stats.bad_signatures += 1
            return "the publisher signature does not verify"
        if sec.share is None:
            return None
        if sec.epoch != msg.seq:
            return "key shares travel only with the first publication of their epoch"
        try:
            record = unpack_record(sec.share)
        except PropagationError as exc:
            return f"malformed key share: {exc}"
        if record.pub_id != publication_id(publisher, msg.seq):
            return "the key share belongs to another publication"
        if record.lineage != (self.replica,):
            return f"share {record.lineage} is not for replica {self.replica}"
        return None

    def routed(self, publisher: str, epoch: int, targets: Iterable[Hop], sec: SecBlock) -> None:
        """A publication of ``epoch`` went to ``targets``: serve the hops new to the epoch."""
        if not self.enabled:
            return
        key = (publisher, epoch)
        if key not in self.secs:
            self.secs[key] = sec
            if len(self.secs) > EPOCH_MEMORY:
                self.secs.popitem(last=False)
            self._open_inboxes(key)
            if self.member:
                self._expect(key)
        served = epoch_entry(self.served, key, list)
        held = self.held.get(key, ())
        new: list[Hop] = []
        for hop in targets:
            if hop not in served:
                served.append(hop)
                new.append(hop)
                for entry in held:
                    self._send(hop, publisher, epoch, entry)
        self.passes.routed(key, new)

    def batch_arrived(self, msg: Shares, sender: str, conn: Member) -> None:
        """A SHARES frame from ``sender`` over ``conn``: every share in it, in order (a
        malformed entry is blamed on the sender like a malformed SHARE)."""
        links = self._certs_in
        link = links.get(conn)
        if link is None:
            link = links[conn] = LinkCertsIn()
            for gone in [c for c in links if c.closing]:
                del links[gone]
        for publisher, epoch, record in link.unpack(msg.base, msg.certs, msg.entries):
            self.share_arrived(publisher, epoch, record, sender)

    def share_arrived(
        self,
        publisher: str,
        epoch: int,
        raw: Incoming,
        sender: str | None = None,
    ) -> None:
        """This replica now holds one more share of an epoch's key (from ``sender``, or
        from the publisher itself): pass it on. ``raw``: a packed record (SHARE, PUBLISH),
        one parsed from a SHARES frame, or why its entry there was malformed."""
        stats = self.stats
        stats.shares_in += 1
        if not self.enabled:
            return
        try:
            if isinstance(raw, PropagationError):
                raise raw
            record = unpack_record(raw) if isinstance(raw, bytes) else raw
        except PropagationError as exc:
            self._not_a_share(publisher, epoch, sender, "malformed", f"malformed: {exc}")
            return
        if record.pub_id != publication_id(publisher, epoch):
            self._not_a_share(
                publisher, epoch, sender, "misaddressed", "belongs to another publication"
            )
            return
        key = (publisher, epoch)
        if sender is None:
            sender = publisher
        heard = epoch_entry(self.heard, key, list)
        if sender not in heard:
            heard.append(sender)
        sec = self.secs.get(key)
        path = None if sec is None else self._claim(key, sec, record, sender)
        inbox = self.inboxes.get(key, {}).get(path) if path is not None else None
        if inbox is not None:
            self._accept(key, inbox, record, sender)
        elif sec is None or path is not None:
            pending = self.unverified.get(key) or ()
            # A sender that already vouched for this path adds no vote: the path is still
            # not agreed, so recounting every waiting share (quadratic in a frame's shares
            # of one epoch) would change nothing.
            known = sec is not None and any(p == path and s == sender for _, s, p in pending)
            if not self.unverified.add(key, (record, sender, path)):
                self.over_budget(key, sender)
            elif not known:
                self._open_inboxes(key)

    def _claim(
        self, key: tuple[str, int], sec: SecBlock, record: ShareRecord, sender: str
    ) -> tuple[str, ...] | None:
        """The path ``record`` claims; None, and its sender blamed, when it cannot be one."""
        assert self.manifest is not None
        path = claimed_path(self.manifest, sec, record, self.vn)
        if path is None:
            self.blame(key, sender, "claims no possible path", sender)
        return path

    def _open_inboxes(self, key: tuple[str, int]) -> None:
        """Verify an epoch's shares along each path a majority of the sending VN vouches for
        (:class:`PathVote`), once the epoch's content was routed here."""
        assert self.manifest is not None
        sec = self.secs.get(key)
        pending = self.unverified.get(key)
        if sec is None or not pending:
            return
        opened = epoch_entry(self.inboxes, key, dict)
        vote = PathVote()
        claims: list[Pending] = []
        for record, sender, known in pending:
            claim = known or claimed_path(self.manifest, sec, record, self.vn)
            claims.append((record, sender, claim))
            chosen = None if claim is None else vote.vouch(self.manifest, claim, sender)
            if chosen is None or chosen in opened:
                continue
            try:
                view = path_view(self.manifest, key[0], sec, chosen)
                # Hashes at once; the sender's seal when the share is split (_send).
                quick = ChainVerifier(view, seals="none", prefixes=False)
                opened[chosen] = ShareInbox(
                    view, publication_id(*key), view.depth, self.replica, quick
                )
            except (PropagationError, KeyError) as exc:
                log.warning("cannot verify shares of %s/%d: %s", key[0], key[1], exc)
        self.unverified.pop(key)
        for record, sender, path in claims:
            if path is None:
                self.blame(key, sender, "claims no possible path", sender)
            elif path in opened:
                self._accept(key, opened[path], record, sender)
            else:
                self.unverified.add(key, (record, sender, path))  # (fits: charged until popped)

    def _not_a_share(
        self, publisher: str, epoch: int, sender: str | None, kind: str, verdict: str
    ) -> None:
        """What came as a share of ``publisher``/``epoch`` is none (``kind``: malformed, or
        another publication's): counted, ``verdict`` in the traffic log, and logged at a
        rate (:class:`~security.agreement.LogRate`): a sender's junk must not flood it."""
        self.stats.bad_shares += 1
        if warned := self.stats.warnings.note(sender or publisher):
            log.warning(
                "%s share of %s/%d from %s (%s; %d such warnings)",
                kind,
                publisher,
                epoch,
                sender,
                verdict,
                warned,
            )
        self.log_share(publisher, epoch, sender, sender, verdict)

    def blame(self, key: tuple[str, int], broker: str, detail: str, sender: str | None) -> None:
        """Count and log blame; ``sender`` None: blame for what was not sent (silence)."""
        stats = self.stats
        if sender is not None:
            stats.bad_shares += 1
        blamed = stats.blamed[broker] = stats.blamed.get(broker, 0) + 1
        # Each blame is counted (trellis_share_blame_total) and in the traffic log; the log
        # file gets a culprit's first LOGGED_BLAMES and every LOGGED_EVERY-th after.
        if worth_logging(blamed):
            log.warning(
                "share of %s/%d rejected: %s: %s (%d blamed on %s so far)",
                key[0],
                key[1],
                broker,
                detail,
                blamed,
                broker,
            )
        self.log_share(key[0], key[1], sender, broker, detail)

    def over_budget(self, key: tuple[str, int], sender: str) -> None:
        """A share from ``sender`` dropped: its shares waiting here (for content or a path
        that has not come) are charged ``max_waiting_share_bytes`` already. Counted each
        time; logged for the first drop and every 10,000th after (a flood must not flood
        the log too)."""
        stats = self.stats
        stats.shares_over_budget += 1
        if stats.shares_over_budget % 10_000 == 1:
            log.warning(
                "dropping key shares from %s (%s/%d): its shares waiting here for content or "
                "a path that has not come are charged max_waiting_share_bytes = %d already "
                "(%d dropped from all senders so far)",
                sender,
                key[0],
                key[1],
                self.waiting_budget,
                stats.shares_over_budget,
            )

    def log_share(
        self, publisher: str, epoch: int, sender: str | None, culprit: str | None, why: str | None
    ) -> None:
        """One share verdict in the traffic log (``culprit`` None: the share verified)."""
        tlog = self.tlog
        if tlog is not None:
            tlog.append(
                ("share", time.time(), publisher, epoch, sender, culprit is None, culprit, why)
            )

    def _accept(
        self, key: tuple[str, int], inbox: ShareInbox, record: ShareRecord, sender: str
    ) -> None:
        """Hold a verified share and pass it on; blame the sender of a bad one."""
        if not inbox.offer(record, sender):
            for blame in inbox.blames:
                self.blame(key, blame.broker, f"{blame.fault}: {blame.detail}", sender)
            # Reported: the inbox lives as long as the epoch, and a sender repeating bad
            # shares for it grew the list without bound.
            inbox.blames.clear()
            return
        self.log_share(key[0], key[1], sender, None, None)
        entry = (record, inbox, sender)
        epoch_entry(self.held, key, list).append(entry)
        for hop in self.served.get(key, ()):
            self._send(hop, key[0], key[1], entry)

    def _send(self, hop: Hop, publisher: str, epoch: int, entry: Held) -> None:
        if hop.closing:
            return
        record, inbox, sender = entry
        if isinstance(hop, VNHop):
            # Splitting signs a statement naming the share's certificate: vouch only for a
            # seal this replica verified.
            if not self._seal_verified(publisher, epoch, entry):
                return
            level = record.level
            # Upstream VNs of fewer than 3 replicas send too few shares to leave one out.
            upstream = len(inbox.path.vns[level - 2]) if level > 1 else 0
            if upstream >= 3:
                prompt = epoch_entry(self._prompt, (publisher, epoch), dict)
                done = prompt.get(hop, 0)
                if done >= upstream - 1:
                    self._spare(hop, publisher, epoch, record)
                    return
                prompt[hop] = done + 1
            self._split_toward(hop, publisher, epoch, record)
        elif hop.congested:
            # The slow-consumer policy covers key shares too (the delivery was dropped).
            self.stats.deliveries_dropped += 1
        else:
            if sender in self.distrusted:
                if not self._seal_verified(publisher, epoch, entry):
                    return
            elif self.sample_relay():
                self._relay_checks.append((publisher, epoch, entry))
            # Relayed as received, in this pass's SHARES frame to the subscriber.
            self._outbox.append((hop, publisher, epoch, record))
            self.stats.shares_delivered += 1
            self.schedule_flush()

    def _seal_verified(self, publisher: str, epoch: int, entry: Held) -> bool:
        """Whether the seal of the sender's own certificate on a held share verifies
        (through the verifier's and the process's caches: once per batch root). A sender
        whose seal fails is blamed first-hand (links are authenticated, and an honest
        broker only ever sends its own splits, validly sealed) and distrusted."""
        record, inbox, sender = entry
        cert = record.certs[-1]
        if inbox.verifier.seal_ok(cert):
            return True
        self.distrusted.add(sender)
        bad = self._bad_seals
        if cert not in bad:
            bad[cert] = None
            if len(bad) > EPOCH_MEMORY:
                bad.popitem(last=False)
            self.blame(
                (publisher, epoch),
                sender,
                f"bad_share: level {record.level}: bad signature on its own certificate",
                sender,
            )
        return False

    def _check_relays(self) -> None:
        """The sampled seal checks of this pass's relayed shares (after its write)."""
        checks, self._relay_checks = self._relay_checks, []
        for publisher, epoch, entry in checks:
            self._seal_verified(publisher, epoch, entry)

    def _split_toward(self, hop: VNHop, publisher: str, seq: int, record: ShareRecord) -> None:
        subs = self.split(record, hop.size)
        self.stats.shares_split += 1
        scheme = (hop.peer_id, hop.size)
        self.splits_by_scheme[scheme] = self.splits_by_scheme.get(scheme, 0) + 1
        outbox = self._outbox
        for broker_id, conn in hop.members.items():
            if conn.closing:
                continue
            for sub in self.recipients_of(subs, self.neighbours[broker_id].replica):
                outbox.append((conn, publisher, seq, sub))
        self.schedule_flush()

    def _spare(self, hop: VNHop, publisher: str, epoch: int, record: ShareRecord) -> None:
        """Leave a spare split for the next pass that writes (at most SPARE_DELAY away)."""
        self._spares.append((hop, publisher, epoch, record))
        if self._spare_timer is None:
            self._spare_timer = asyncio.get_running_loop().call_later(
                SPARE_DELAY, self._split_spares
            )

    def _split_spares(self) -> None:
        """Split the spare shares waiting (into this pass's outbox and seal)."""
        if self._spare_timer is not None:
            self._spare_timer.cancel()
            self._spare_timer = None
        spares, self._spares = self._spares, []
        for hop, publisher, epoch, record in spares:
            if not hop.closing:
                self._split_toward(hop, publisher, epoch, record)
        if spares and not self._flushing:
            self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self, *, write: bool = True) -> None:
        """Seal this pass's splits with one signature and send their sub-shares.

        The broker calls it with ``write=False`` just before it writes what a read produced,
        so sub-shares leave in the same write as the content they belong to (one system
        call and one wake-up per link and read, not two); the call scheduled when the first
        split of the pass was made then finds nothing left and writes itself only when
        splits came from elsewhere (a timer)."""
        self._flushing = False
        if self._spares and self._outbox:
            # A write is going out anyway: the spare splits join its seal and frames.
            self._split_spares()
            self._flushing = False
        outbox, self._outbox = self._outbox, []
        if self._relay_checks:
            # In a later loop iteration: after the broker's write, off the critical path.
            asyncio.get_running_loop().call_soon(self._check_relays)
        written: dict[Member | Hop, None] = self.passes.flush() if self.passes.pending else {}
        if not outbox:
            self._write(written, write)
            return
        sealed = self.batch.seal() if self.batch is not None else {}
        stats = self.stats
        # One SHARES frame (or a few, for a large pass) per receiver, in the order made.
        per_conn: dict[Member | Hop, list[tuple[str, int, ShareRecord]]] = {}
        for conn, publisher, seq, sub in outbox:
            if conn.closing:
                continue
            cert = sealed.get(sub.certs[-1])
            record = sub if cert is None else sub.with_cert(cert)
            items = per_conn.get(conn)
            if items is None:
                items = per_conn[conn] = []
            items.append((publisher, seq, record))
            if cert is not None:
                stats.shares_forwarded += 1
        links = self._certs_out
        recent_of, keep_recent = self._recent, self._keep_recent
        for conn, items in per_conn.items():
            link = links.get(conn)
            if link is None:
                link = links[conn] = LinkCertsOut()
                for gone in [c for c in links if c.closing]:
                    del links[gone]
            if keep_recent and not conn.is_broker:
                recent = recent_of.get(conn)
                if recent is None:
                    recent = recent_of[conn] = deque(maxlen=RECENT_SHARES)
                recent.extend(items)
            for base, certs, entries in link.frames(items, self.frame_budget):
                conn.send(Shares(base, certs, entries))
            written[conn] = None
        self._write(written, write)

    @staticmethod
    def _write(written: dict[Member | Hop, None], write: bool) -> None:
        if not write:
            return
        # A connection writes what it was sent once per read; this pass ran after the read.
        for conn in written:
            flush = getattr(conn, "flush", None)
            if flush is not None:
                flush()

    def link_gone(self, conn: Member | Hop) -> None:
        """``conn`` is closed for good: forget its certificate ids and recent shares."""
        self._certs_out.pop(conn, None)
        self._recent.pop(conn, None)
        self.passes.link_gone(conn)

    def resend_recent(self, conn: Member | Hop) -> None:
        """A local client's connection was lost and its session parked on ``conn``: send
        it again the share records it was sent last, numbering certificate ids afresh
        (whatever carries the session next is a new connection, which numbers from 0)."""
        self._certs_out.pop(conn, None)
        self.passes.resend_recent(conn)
        items = list(self._recent.pop(conn, ()))
        if not items:
            return
        link = self._certs_out[conn] = LinkCertsOut()
        for base, certs, entries in link.frames(items, self.frame_budget):
            conn.send(Shares(base, certs, entries))

    # -- silence -----------------------------------------------------------------------------

    def _expect(self, key: tuple[str, int]) -> None:
        """Judge the upstream replicas' silence about ``key`` once the deadline passed."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._deadlines.append((loop.time() + SILENCE_DEADLINE, key))
        if not self._sweeping:
            self._sweeping = True
            loop.call_later(SILENCE_DEADLINE, self._sweep)

    def routing_changed(self) -> None:
        """This broker's routing changed (a live round installed, a membership version
        adopted): silence about epochs routed here around now is not judged, since the
        upstream replicas do not switch at the same instant."""
        try:
            self._changed.append(asyncio.get_running_loop().time())
        except RuntimeError:
            return

    def _near_a_change(self, routed_at: float) -> bool:
        return any(abs(routed_at - t) <= SILENCE_DEADLINE for t in self._changed)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, key = deadlines.popleft()
            if not self._near_a_change(deadline - SILENCE_DEADLINE):
                self.judge_silence(key)
        if deadlines:
            loop.call_later(max(0.0, deadlines[0][0] - now), self._sweep)
        else:
            self._sweeping = False

    def judge_silence(self, key: tuple[str, int]) -> None:
        """Blame every upstream replica of an agreed path that sent no share of ``key``.

        Sound because each honest upstream replica holds a share of every epoch routed to
        this VN (at most f per VN are Byzantine) and sends it as soon as it routes the
        content; a share on another path (a link moved mid-epoch) counts as heard.
        """
        heard = self.heard.get(key, ())
        blamed: set[str] = set()
        silent = [
            (blame.broker, f"{blame.fault}: {blame.detail}")
            for inbox in self.inboxes.get(key, {}).values()
            for blame in silent_senders(inbox.path, inbox.level, heard)
        ]
        for broker, why in silent + self.passes.silent(key, heard):
            if broker not in blamed:
                blamed.add(broker)
                self.blame(key, broker, why, None)

    # -- hooks (wrapped by broker.daemon.faults on a Byzantine test broker) -----------------

    def split(self, record: ShareRecord, r: int) -> list[ShareRecord]:
        """Re-split one held share for a next-hop VN of ``r`` replicas; item j is replica j's.

        The sub-shares' certificate is sealed with this pass's batch when it is flushed."""
        assert self.batch is not None
        return self.batch.split(record, threshold_for(r), r)

    def recipients_of(self, subs: list[ShareRecord], replica: int) -> list[ShareRecord]:
        """The sub-shares replica ``replica`` of the next-hop VN is sent: its own."""
        return [subs[replica]]
