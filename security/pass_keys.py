"""A subscriber's keys from shares by the pass (:mod:`security.pass_shares`, SPEC §3).

Every replica of the subscriber's VN hands it ``LEAVES``: the statements above its leaves
(each once per link) and the leaves, by statement. :class:`PassKeys` keeps them in one
:class:`~security.pass_shares.Assembly` for all publishers (statements cover many
publications) and recovers each epoch's key for its
:class:`~security.paths.KeyAssembly`, with that class's rules:

* the path a leaf travelled is read from its chain of statements and adopted once a
  majority of the sending VN vouches for it (:class:`~security.paths.PathVote`);
* a quick pass first (hashes only, no signature): its key is tentative until the AES-GCM
  tag of a payload checks (:meth:`KeyAssembly.open` falls back to the audit);
* once every leaf is in, the quick pass runs over all of them; when it finds nothing wrong
  and gives the same key, the audit (every statement's signature, blame) is skipped except
  for one epoch in :data:`~security.paths.AUDIT_ONE_IN` picked at random.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from security.pass_shares import (
    Assembly,
    LeafBatch,
    SealChecks,
    claimed_vns,
    parse_statement,
    statement_ref,
)
from security.paths import AUDIT_ONE_IN, PathVote, _draw, path_view
from security.propagation import PathView, PropagationError, threshold_for
from security.publication import epoch_of, publication_id

if TYPE_CHECKING:
    from security.paths import KeyAssembly, Membership

log = logging.getLogger("trellis.security")

Key = tuple[str, int]

STATEMENT_MEMORY = 1 << 14
"""Statements a subscriber keeps (the oldest quarter goes past it)."""


@dataclass
class _Epoch:
    """What :class:`PassKeys` knows of one epoch: paths vouched for, leaves read so far."""

    vote: PathVote = field(default_factory=PathVote)
    paths: dict[tuple[str, ...], PathView] = field(default_factory=dict)
    classified: int = 0
    senders: set[str] = field(default_factory=set)
    claimed: set[tuple[str, bytes]] = field(default_factory=set)  # (sender, statement) read
    checked: bool = False  # the complete set was looked at (its leaves then let go)
    audited_at: int = -1  # leaves in at the last late audit (:meth:`PassKeys.audit_late`)


class PassKeys:
    """The statements and leaves a subscriber was handed, and the state of each epoch."""

    def __init__(self) -> None:
        self.assembly = Assembly()
        self.seals = SealChecks()
        self._epochs: OrderedDict[Key, _Epoch] = OrderedDict()

    def add(
        self,
        sender: str,
        statements: Iterable[tuple[bytes, bytes]],
        batches: Iterable[tuple[bytes, tuple[int, ...], bytes]],
    ) -> set[Key]:
        """Take one ``LEAVES`` frame from ``sender``; returns the epochs it brought leaves
        of. A malformed statement is dropped (a relay can send anything: only a signed
        statement names anyone, and reconstruction checks what the leaves need)."""
        assembly = self.assembly
        for raw, signature in statements:
            if statement_ref(raw, signature) in assembly.statements:
                continue  # every replica of this VN relays the statements above
            try:
                assembly.add_statement(parse_statement(raw, signature))
            except PropagationError as exc:
                log.warning("malformed pass statement from broker %s: %s", sender, exc)
        known = assembly.statements
        if len(known) > STATEMENT_MEMORY:
            for stale in list(known)[: STATEMENT_MEMORY // 4]:
                del known[stale]
        touched: set[Key] = set()
        for ref, positions, blob in batches:
            assembly.add_leaves(sender, LeafBatch(ref, positions, blob))
            statement = known.get(ref)
            if statement is None:
                continue
            entries = statement.entries
            for position in positions:
                if 0 <= position < len(entries):
                    key = epoch_of(entries[position].pub_id)
                    if key is not None:
                        touched.add(key)
        return touched

    def leaves(self, publisher: str, epoch: int) -> int:
        """Leaves of an epoch handed to this subscriber so far (those read by
        :meth:`recover` are counted after their epoch's check let them go)."""
        state = self._epochs.get((publisher, epoch))
        held = len(self.assembly.leaves(publication_id(publisher, epoch)))
        return held if state is None else max(held, state.classified)

    def forget(self, publisher: str, epoch: int) -> None:
        self.assembly.forget(publication_id(publisher, epoch))
        self._epochs.pop((publisher, epoch), None)

    def recover(
        self, keys: KeyAssembly, manifest: Membership, holder_vn: str, *, audit: bool
    ) -> None:
        """Recover ``keys``'s epoch key from the leaves in (a quick pass unless ``keys``
        distrusts it), and once they are all in, check them (``audit``)."""
        sec = keys.sec
        if sec is None:
            return
        publisher, epoch = keys.publisher, keys.seq
        state = self._epochs.get((publisher, epoch))
        if state is None:
            state = self._epochs[publisher, epoch] = _Epoch()
            if len(self._epochs) > 4 * 4096:
                self._epochs.popitem(last=False)
        if keys.key is not None and (state.checked or not audit):
            return  # (a quick call per delivery: nothing to do until the check)
        pub_id = publication_id(publisher, epoch)
        assembly = self.assembly
        leaves = assembly.leaves(pub_id)
        for sender, statement, entry, _ in leaves[state.classified :]:
            state.senders.add(sender)
            read = (sender, statement.ref)
            if read in state.claimed:
                continue  # one path per sender and statement is all the vote needs
            state.claimed.add(read)
            claim = claimed_vns(
                statement, entry, assembly.statements, manifest.owner, sec.vn, holder_vn
            )
            if (
                claim is None
                or claim in state.paths
                or any(vn not in manifest.members for vn in claim)
            ):
                continue
            if state.vote.vouch(manifest, claim, sender) is not None:
                try:
                    state.paths[claim] = path_view(manifest, publisher, sec, claim)
                except (PropagationError, KeyError) as exc:
                    log.warning("cannot verify shares of %s/%d: %s", publisher, epoch, exc)
        state.classified = len(leaves)
        for view in state.paths.values():
            last = view.vns[-1]
            if len(state.senders) < threshold_for(len(last)):
                continue  # each node of the last level needs k of its holders
            complete = len(leaves) >= math.prod(len(vn) for vn in view.vns)
            if keys.key is None:
                result = assembly.reconstruct(
                    pub_id, view, seals=self.seals, audit=keys.distrust, complete=complete
                )
                self._blame(keys, result.culprits if keys.distrust else frozenset())
                if result.key is not None:
                    keys.key = result.key
                    keys.tentative = not keys.distrust
                    if keys.distrust:
                        state.checked = complete
                if keys.key is None:
                    continue
            if not (audit and complete) or state.checked:
                continue
            state.checked = True
            quick = assembly.reconstruct(pub_id, view, seals=self.seals, audit=False, complete=True)
            if quick.blame or quick.key != keys.key or _draw.randrange(AUDIT_ONE_IN) == 0:
                full = assembly.reconstruct(pub_id, view, seals=self.seals, complete=True)
                self._blame(keys, full.culprits)
                if full.key is not None and keys.tentative:
                    keys.key, keys.tentative = full.key, False
            assembly.forget(pub_id)

    def audit_late(self, keys: KeyAssembly) -> None:
        """Audit an epoch whose key is known though not every leaf arrived (an upstream
        replica's shares were rejected on the way, so the check at completion never
        comes), once per new leaf count: an equivocation shows only when both versions are
        looked at together."""
        state = self._epochs.get((keys.publisher, keys.seq))
        pub_id = publication_id(keys.publisher, keys.seq)
        count = len(self.assembly.leaves(pub_id))
        if state is None or state.checked or keys.key is None or state.audited_at == count:
            return
        state.audited_at = count
        for view in state.paths.values():
            full = self.assembly.reconstruct(pub_id, view, seals=self.seals)
            self._blame(keys, full.culprits)

    @staticmethod
    def _blame(keys: KeyAssembly, culprits: frozenset[str]) -> None:
        if culprits - keys.culprits:
            keys.culprits = keys.culprits | culprits
            log.warning(
                "publication %s/%d: bad shares from %s",
                keys.publisher,
                keys.seq,
                ", ".join(sorted(culprits)),
            )
