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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from security.agreement import LogRate
from security.pass_shares import (
    Assembly,
    Entry,
    LeafBatch,
    PassStatement,
    SealChecks,
    claimed_vns,
    parse_statement,
    statement_ref,
)
from security.paths import AUDIT_ONE_IN, PathVote, _draw, path_view
from security.propagation import PathView, PropagationError, Reconstruction, threshold_for
from security.publication import SecBlock, epoch_of, publication_id

if TYPE_CHECKING:
    from security.paths import KeyAssembly, Membership

log = logging.getLogger("trellis.security")

Key = tuple[str, int]


def claimed_pass_path(
    manifest: Membership,
    sec: SecBlock,
    statement: PassStatement,
    entry: Entry,
    statements: Mapping[bytes, PassStatement],
    holder_vn: str,
) -> tuple[str, ...] | None:
    """The VN path the children of ``entry`` say they travelled, or None when that cannot
    be a path of this overlay: :func:`~security.pass_shares.claimed_vns` with the
    manifest's members, as :func:`security.paths.claimed_path` reads a record's (a broker
    and a subscriber adopt it once a majority of the sending VN vouches for it)."""
    claim = claimed_vns(statement, entry, statements, manifest.owner, sec.vn, holder_vn)
    if claim is None or any(vn not in manifest.members for vn in claim):
        return None
    return claim


Path = tuple[str, ...]


@dataclass
class _Epoch:
    """What :class:`PassKeys` knows of one epoch: paths vouched for, leaves read so far.

    Counts are per claimed path: during a move an epoch's leaves can come along an old and
    a new path, and each path is complete (and rebuilt) on its own leaves."""

    vote: PathVote = field(default_factory=PathVote)
    paths: dict[Path, PathView] = field(default_factory=dict)
    classified: int = 0  # leaves read
    counts: dict[Path, int] = field(default_factory=dict)  # leaves read per claimed path
    # the path each (statement, parent statement) of a leaf claims, read once
    claims: dict[tuple[bytes, bytes], Path] = field(default_factory=dict)
    checked: bool = False  # the complete set was looked at (its leaves then let go)
    audited_at: int = -1  # leaves in at the last late audit (:meth:`PassKeys.audit_late`)
    # per path, (its leaves, distrust) of the last try without a key
    tried: dict[Path, tuple[int, bool]] = field(default_factory=dict)
    # a quick pass over every leaf of a path (its leaves, the view, the result): the
    # check's own first step
    whole: tuple[int, PathView, Reconstruction] | None = None


_Member = tuple["KeyAssembly", _Epoch, Path]
"""An epoch to rebuild or check along one of its paths."""


def _whole(state: _Epoch, claim: Path, view: PathView) -> Reconstruction | None:
    """The quick pass kept in ``state`` if it was over ``view`` and every leaf of its path
    read so far (then it is the check's own first step), else None."""
    whole = state.whole
    if whole is None or whole[0] != state.counts.get(claim) or whole[1] is not view:
        return None
    return whole[2]


class PassKeys:
    """The statements and leaves a subscriber was handed, and the state of each epoch."""

    def __init__(self) -> None:
        self.assembly = Assembly()
        self.seals = SealChecks()
        self._epochs: OrderedDict[Key, _Epoch] = OrderedDict()
        self.malformed = LogRate()  # malformed statements per relay

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
            ref = statement_ref(raw, signature)
            if ref in assembly.statements:
                continue  # every replica of this VN relays the statements above
            try:
                assembly.add_statement(parse_statement(raw, signature, ref), sender)
            except PropagationError as exc:
                if count := self.malformed.note(sender):  # (junk must not flood the log)
                    log.warning(
                        "malformed pass statement from broker %s: %s (%d so far)",
                        sender,
                        exc,
                        count,
                    )
        known = assembly.statements
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
        """:meth:`recover_many` for one epoch."""
        self.recover_many([keys], manifest, holder_vn, audit=audit)

    def recover_many(
        self, many: Iterable[KeyAssembly], manifest: Membership, holder_vn: str, *, audit: bool
    ) -> None:
        """Recover the epoch keys of ``many`` from the leaves in (a quick pass unless an
        epoch distrusts it), and once an epoch's leaves are all in, check them (``audit``:
        the check may verify signatures; without it, it waits for a call with it).

        The epochs of one path are rebuilt together (:meth:`Assembly.reconstruct_many`:
        one combine per level for all of them), as a pass of a stream arrives together."""
        groups: dict[tuple[int, bool, bool], tuple[PathView, list[_Member]]] = {}
        checks: dict[int, tuple[PathView, list[_Member]]] = {}
        for keys in many:
            state = self._classify(keys, manifest, holder_vn, audit)
            if state is None:
                continue
            for claim, view in state.paths.items():
                if len(state.vote.votes[claim]) < threshold_for(len(view.vns[-1])):
                    continue  # each node of the last level needs k of its holders
                count = state.counts.get(claim, 0)
                complete = count >= math.prod(len(vn) for vn in view.vns)
                if keys.key is None:
                    attempt = (count, keys.distrust)
                    if state.tried.get(claim) == attempt:
                        continue  # nothing new since the last try (a delivery per copy)
                    state.tried[claim] = attempt
                    group = (id(view), complete, keys.distrust)
                    groups.setdefault(group, (view, []))[1].append((keys, state, claim))
                elif audit and complete and not state.checked:
                    checks.setdefault(id(view), (view, []))[1].append((keys, state, claim))
        for (_, complete, distrust), (view, members) in groups.items():
            found = self._reconstruct(members, view, audit=distrust, complete=complete)
            for (keys, state, claim), result in zip(members, found, strict=True):
                if distrust:
                    keys.report(result.culprits)
                if keys.key is None and result.key is not None:
                    keys.key, keys.tentative = result.key, not distrust
                    if complete and (audit or distrust):
                        # The quick pass over every leaf is the check's own first step.
                        self._judge(keys, state, view, result, audited=distrust)
                    elif complete:  # for the check
                        state.whole = (state.counts[claim], view, result)
        for view, members in checks.values():
            waiting = [item for item in members if not item[1].checked]
            kept = [_whole(state, claim, view) for _, state, claim in waiting]
            again = [item for item, whole in zip(waiting, kept, strict=True) if whole is None]
            rebuilt = iter(self._reconstruct(again, view, audit=False, complete=True))
            for (keys, state, _), whole in zip(waiting, kept, strict=True):
                result = next(rebuilt) if whole is None else whole
                self._judge(keys, state, view, result, audited=False)

    def _classify(
        self, keys: KeyAssembly, manifest: Membership, holder_vn: str, audit: bool
    ) -> _Epoch | None:
        """Read the paths an epoch's new leaves claim; its state, or None when there is
        nothing to do (no security block yet, or the key known and not to be checked)."""
        sec = keys.sec
        if sec is None:
            return None
        publisher, epoch = keys.publisher, keys.seq
        state = self._epochs.get((publisher, epoch))
        if state is None:
            state = self._epochs[publisher, epoch] = _Epoch()
            if len(self._epochs) > 4 * 4096:
                gone = self._epochs.popitem(last=False)[0]
                self.assembly.forget(publication_id(*gone))
        if keys.key is not None and (state.checked or not audit):
            return None  # (a call per delivery: nothing to do until the check)
        assembly = self.assembly
        leaves = assembly.leaves(publication_id(publisher, epoch))
        claims, counts, votes = state.claims, state.counts, state.vote.votes
        for sender, statement, entry, _ in leaves[state.classified :]:
            # The path is read once per statement and the one above this leaf's node (a
            # statement can hold the nodes of two paths after a move).
            read = (statement.ref, entry.parent)
            claim = claims.get(read)
            if claim is None:
                found = claimed_pass_path(
                    manifest, sec, statement, entry, assembly.statements, holder_vn
                )
                if found is None:
                    continue
                claim = claims[read] = found
            counts[claim] = counts.get(claim, 0) + 1
            if sender in votes.get(claim, ()):
                continue  # one vouch per sender and path is all the vote needs
            if state.vote.vouch(manifest, claim, sender) is not None and claim not in state.paths:
                try:
                    state.paths[claim] = path_view(manifest, publisher, sec, claim)
                except (PropagationError, KeyError) as exc:
                    log.warning("cannot verify shares of %s/%d: %s", publisher, epoch, exc)
        state.classified = max(state.classified, len(leaves))
        return state

    def _reconstruct(
        self,
        members: list[_Member],
        view: PathView,
        *,
        audit: bool,
        complete: bool,
    ) -> list[Reconstruction]:
        pub_ids = [publication_id(keys.publisher, keys.seq) for keys, _, _ in members]
        found = self.assembly.reconstruct_many(
            pub_ids, view, seals=self.seals, audit=audit, complete=complete
        )
        return [found[pub_id] for pub_id in pub_ids]

    def _judge(
        self,
        keys: KeyAssembly,
        state: _Epoch,
        view: PathView,
        quick: Reconstruction,
        *,
        audited: bool,
    ) -> None:
        """The check of an epoch whose every leaf is in, from a pass over all of them:
        clean (no blame, the same key) and not drawn for an audit, it is done; otherwise
        every signature is verified and every fault blamed. Its leaves are then let go."""
        state.checked = True
        state.whole = None
        pub_id = publication_id(keys.publisher, keys.seq)
        if not audited and (
            quick.blame or quick.key != keys.key or _draw.randrange(AUDIT_ONE_IN) == 0
        ):
            full = self.assembly.reconstruct(pub_id, view, seals=self.seals, complete=True)
            keys.report(full.culprits)
            if full.key is not None and keys.tentative:
                keys.key, keys.tentative = full.key, False
        self.assembly.forget(pub_id)

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
            keys.report(full.culprits)
