"""Topic requests, TDN advertisements, hierarchies, collections, delegations (pure)."""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import FilterSyntaxError, InvalidRequest
from broker.tools.tdn_query import Query, run_query
from security.envelope import Signer, public_key_to_bytes
from security.errors import IntegrityError, NotAuthorized
from security.topics import (
    AdvertisementError,
    HierarchySpec,
    ReplayGuard,
    TopicAdvertisement,
    TopicRequest,
    check_response,
    issue_advertisement,
    make_request,
    verify_advertisement,
)
from security.topics_channel import ReplyKey, open_reply, open_request, seal_reply, sign_request
from security.topics_collections import (
    CollectionError,
    CollectionLimitExceeded,
    CollectionLimits,
    CollectionRegistry,
    NotAllowedToEdit,
)
from security.topics_delegations import DelegationError, authorize, delegate
from security.topics_hierarchy import (
    ChildrenNotAllowed,
    HierarchyError,
    LifetimeExceedsParent,
    LimitLoosened,
    MaxDepthExceeded,
    MaxWidthExceeded,
    NotAllowedToRegister,
    TopicRegistry,
)
from security.topics_identity import Identity, load_identity, save_identity

TDN = Signer.generate("tdn-1")
TRUSTED = {"tdn-1": public_key_to_bytes(TDN.public_key)}
ALICE = Signer.generate("alice")
BOB = Signer.generate("bob")
NOW = 1_000_000.0


def key(signer: Signer) -> bytes:
    return public_key_to_bytes(signer.public_key)


def request(
    signer: Signer = ALICE,
    synopsis: str = "weather/paris",
    *,
    lifetime: float = 100.0,
    now: float = NOW,
    **kw: object,
) -> TopicRequest:
    return make_request(signer, synopsis, nonce=os.urandom(16), now=now, lifetime=lifetime, **kw)  # type: ignore[arg-type]


def register(reg: TopicRegistry, req: TopicRequest, now: float = NOW) -> TopicAdvertisement:
    """What a TDN does with a creation request."""
    expires = now + req.lifetime
    depth = reg.check(req, now, expires)
    ad = issue_advertisement(
        TDN, req, uuid=str(uuid.uuid4()), now=now, depth=depth, expires=expires
    )
    reg.add(ad)
    return ad


# -- requests and advertisements -----------------------------------------------------------

descriptor_values = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(
    synopsis=st.text(max_size=50),
    descriptors=st.dictionaries(st.text(min_size=1, max_size=10), descriptor_values, max_size=5),
    lifetime=st.floats(min_value=0.001, max_value=1e9),
    spec=st.builds(
        HierarchySpec,
        root=st.just(True),
        allow_children=st.booleans(),
        max_depth=st.none() | st.integers(0, 100),
        max_width=st.none() | st.integers(0, 100),
        registrars=st.none()
        | st.lists(st.text(max_size=8), max_size=3).map(lambda x: tuple(sorted(set(x)))),
    ),
)
def test_advertisement_round_trips_through_its_wire_form_and_still_verifies(
    synopsis: str, descriptors: dict[str, object], lifetime: float, spec: HierarchySpec
) -> None:
    req = request(synopsis=synopsis, lifetime=lifetime, descriptors=descriptors, hierarchy=spec)
    ad = issue_advertisement(TDN, req, uuid="u-1", now=NOW, depth=0, expires=NOW + lifetime)
    wire = msgpack.unpackb(msgpack.packb(ad.to_wire(), use_bin_type=True), raw=False)
    back = TopicAdvertisement.from_wire(wire)
    assert back == ad
    assert back.request.canonical() == req.canonical()
    verify_advertisement(back, TRUSTED, NOW)


def test_an_advertisement_signed_by_another_key_than_the_trusted_tdns_is_forged() -> None:
    req = request()
    mallory = Signer.generate("tdn-1")  # claims the trusted TDN's id
    ad = issue_advertisement(mallory, req, uuid="u", now=NOW, depth=0, expires=NOW + 10)
    with pytest.raises(AdvertisementError) as err:
        verify_advertisement(ad, TRUSTED, NOW)
    assert err.value.reason == "untrusted-tdn"
    # the trusted key, but a signature that is not the TDN's
    good = issue_advertisement(TDN, req, uuid="u", now=NOW, depth=0, expires=NOW + 10)
    forged = replace(good, expires=NOW + 10_000)
    with pytest.raises(AdvertisementError, match="does not verify") as err:
        verify_advertisement(forged, TRUSTED, NOW)
    assert err.value.reason == "forged"


def test_an_altered_request_no_longer_hashes_to_the_signed_digest() -> None:
    ad = issue_advertisement(TDN, request(), uuid="u", now=NOW, depth=0, expires=NOW + 10)
    altered = replace(ad, request=replace(ad.request, synopsis="weather/lyon"))
    with pytest.raises(AdvertisementError) as err:
        verify_advertisement(altered, TRUSTED, NOW)
    assert err.value.reason == "digest"
    assert isinstance(err.value, IntegrityError)


def test_an_expired_advertisement_is_refused() -> None:
    ad = issue_advertisement(TDN, request(), uuid="u", now=NOW, depth=0, expires=NOW + 10)
    with pytest.raises(AdvertisementError) as err:
        verify_advertisement(ad, TRUSTED, NOW + 10)
    assert err.value.reason == "expired"


def test_a_response_to_an_earlier_request_is_a_replay() -> None:
    old = request()
    old_ad = issue_advertisement(TDN, old, uuid="u-old", now=NOW, depth=0, expires=NOW + 50)
    new = request()  # same creator, same synopsis, a fresh nonce
    with pytest.raises(AdvertisementError, match="replayed") as err:
        check_response(old_ad, new, TRUSTED, NOW + 1)
    assert err.value.reason == "replayed"
    check_response(old_ad, old, TRUSTED, NOW + 1)


def test_the_tdn_answers_a_repeated_request_with_the_same_topic_and_refuses_stale_ones() -> None:
    guard = ReplayGuard(max_age=60)
    req = request()
    assert guard.check(req, NOW) is None
    guard.remember(req, "u-1", NOW)
    assert guard.check(req, NOW + 5) == "u-1"
    with pytest.raises(NotAuthorized, match="stale"):
        guard.check(req, NOW + 61)


def test_malformed_wire_forms_are_refused_naming_the_field() -> None:
    ad = issue_advertisement(TDN, request(), uuid="u", now=NOW, depth=0, expires=NOW + 10)
    wire = ad.to_wire()
    with pytest.raises(InvalidRequest, match="digest"):
        TopicAdvertisement.from_wire([*wire[:2], b"short", *wire[3:]])
    with pytest.raises(InvalidRequest, match="9 fields"):
        TopicAdvertisement.from_wire(wire[:5])
    req_wire = ad.request.to_wire()
    req_wire[4] = -1.0
    with pytest.raises(InvalidRequest, match="lifetime"):
        TopicRequest.from_wire(req_wire)


def test_identity_files_round_trip_and_bad_ones_say_why(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "alice.json"
    save_identity(ALICE, path)
    loaded = load_identity(path)
    assert Identity.of(loaded) == Identity.of(ALICE)
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("{}")
    with pytest.raises(InvalidRequest, match="identity file"):
        load_identity(path)


# -- hierarchies ----------------------------------------------------------------------------


def test_a_child_below_max_depth_fails_naming_the_ancestor_and_limit() -> None:
    reg = TopicRegistry()
    root = register(
        reg, request(hierarchy=HierarchySpec(root=True, allow_children=True, max_depth=1))
    )
    child = register(reg, request(hierarchy=HierarchySpec(allow_children=True, parent=root.uuid)))
    assert child.depth == 1
    with pytest.raises(MaxDepthExceeded) as err:
        register(reg, request(hierarchy=HierarchySpec(parent=child.uuid)))
    assert (err.value.topic, err.value.limit, err.value.depth) == (root.uuid, 1, 2)


def test_a_parent_at_max_width_refuses_another_child() -> None:
    reg = TopicRegistry()
    root = register(
        reg, request(hierarchy=HierarchySpec(root=True, allow_children=True, max_width=2))
    )
    for _ in range(2):
        register(reg, request(hierarchy=HierarchySpec(parent=root.uuid)))
    with pytest.raises(MaxWidthExceeded) as err:
        register(reg, request(hierarchy=HierarchySpec(parent=root.uuid)))
    assert (err.value.limit, err.value.children) == (2, 2)


def test_a_child_may_not_loosen_its_ancestors_limits() -> None:
    reg = TopicRegistry()
    root = register(
        reg,
        request(hierarchy=HierarchySpec(root=True, allow_children=True, max_depth=3, max_width=4)),
    )
    with pytest.raises(LimitLoosened) as err:
        register(
            reg,
            request(hierarchy=HierarchySpec(allow_children=True, parent=root.uuid, max_depth=3)),
        )
    assert (err.value.limit, err.value.allowed) == ("max_depth", 2)
    with pytest.raises(LimitLoosened) as err:
        register(
            reg,
            request(hierarchy=HierarchySpec(allow_children=True, parent=root.uuid, max_width=5)),
        )
    assert err.value.limit == "max_width"
    register(
        reg,
        request(
            hierarchy=HierarchySpec(allow_children=True, parent=root.uuid, max_depth=2, max_width=1)
        ),
    )


def test_children_need_allow_children_and_the_registrars_of_every_ancestor() -> None:
    reg = TopicRegistry()
    closed = register(reg, request(hierarchy=HierarchySpec(root=True)))
    with pytest.raises(ChildrenNotAllowed):
        register(reg, request(hierarchy=HierarchySpec(parent=closed.uuid)))
    bob = key(BOB).hex()
    root = register(
        reg, request(hierarchy=HierarchySpec(root=True, allow_children=True, registrars=(bob,)))
    )
    mid = register(
        reg,
        request(
            BOB, hierarchy=HierarchySpec(allow_children=True, parent=root.uuid, registrars=("*",))
        ),
    )
    carol = Signer.generate("carol")
    with pytest.raises(NotAllowedToRegister, match="ancestor"):
        register(reg, request(carol, hierarchy=HierarchySpec(parent=mid.uuid)))
    with pytest.raises(NotAllowedToRegister):
        register(reg, request(carol, hierarchy=HierarchySpec(parent=root.uuid)))


def test_a_child_cannot_outlive_its_parent_and_expires_with_it() -> None:
    reg = TopicRegistry()
    root = register(
        reg, request(lifetime=10, hierarchy=HierarchySpec(root=True, allow_children=True))
    )
    with pytest.raises(LifetimeExceedsParent, match="at most 10"):
        register(reg, request(lifetime=11, hierarchy=HierarchySpec(parent=root.uuid)))
    child = register(reg, request(lifetime=10, hierarchy=HierarchySpec(parent=root.uuid)))
    assert reg.live(child.uuid, NOW + 9)
    assert {ad.uuid for ad in reg.expire(NOW + 10)} == {root.uuid, child.uuid}
    assert len(reg) == 0


def test_a_second_claim_of_a_held_uuid_is_refused() -> None:
    reg = TopicRegistry()
    ad = register(reg, request())
    mallory = Signer.generate("mallory")
    claim = issue_advertisement(
        TDN, request(mallory), uuid=ad.uuid, now=NOW, depth=0, expires=NOW + 5
    )
    with pytest.raises(AdvertisementError, match="already registered") as err:
        reg.add(claim)
    assert err.value.reason == "conflict"
    assert reg.get(ad.uuid) == ad
    assert reg.add(ad) is False  # the same advertisement again is harmless


specs = st.builds(
    lambda allow, depth, width, life, parent_index: (allow, depth, width, life, parent_index),
    st.booleans(),
    st.none() | st.integers(0, 4),
    st.none() | st.integers(0, 3),
    st.floats(1, 200),
    st.integers(0, 30),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(specs, min_size=1, max_size=30))
def test_no_registration_sequence_makes_a_child_looser_than_an_ancestor(
    steps: list[tuple[bool, int | None, int | None, float, int]],
) -> None:
    reg = TopicRegistry()
    held: list[TopicAdvertisement] = []
    for i, (allow, depth, width, life, parent_index) in enumerate(steps):
        now = NOW + i
        if not held or parent_index % 5 == 0:
            spec = HierarchySpec(root=True, allow_children=allow, max_depth=depth, max_width=width)
        else:
            parent = held[parent_index % len(held)]
            spec = HierarchySpec(
                allow_children=allow, max_depth=depth, max_width=width, parent=parent.uuid
            )
        with contextlib.suppress(HierarchyError, NotAuthorized):
            held.append(register(reg, request(lifetime=life, now=now, hierarchy=spec), now))
        for ad in reg:
            chain = reg.chain(ad.uuid)
            for anc in chain[1:]:
                h = anc.request.hierarchy
                below = ad.depth - anc.depth
                assert ad.expires <= anc.expires
                if h.max_depth is not None:
                    assert below <= h.max_depth
                    if ad.request.hierarchy.max_depth is not None:
                        assert ad.request.hierarchy.max_depth <= h.max_depth - below
                if h.max_width is not None and ad.request.hierarchy.max_width is not None:
                    assert ad.request.hierarchy.max_width <= h.max_width
            widths = [a.request.hierarchy.max_width for a in chain]
            limit = min((w for w in widths if w is not None), default=None)
            if limit is not None:  # MaxWidth bounds the live children
                assert len(reg.children(ad.uuid, now)) <= limit


def test_discovery_restrictions_of_ancestors_bind_their_children() -> None:
    reg = TopicRegistry()
    bob = key(BOB).hex()
    root = register(
        reg,
        request(hierarchy=HierarchySpec(root=True, allow_children=True), discoverers=(bob,)),
    )
    child = register(reg, request(hierarchy=HierarchySpec(parent=root.uuid)))  # anyone, it says
    carol = key(Signer.generate("carol")).hex()
    assert reg.visible(child.uuid, bob, NOW)
    assert reg.visible(child.uuid, key(ALICE).hex(), NOW)
    assert not reg.visible(child.uuid, carol, NOW)


# -- queries ----------------------------------------------------------------------------------


def test_each_query_kind_finds_what_it_should_and_only_what_the_requester_may_see() -> None:
    reg = TopicRegistry()
    bob = key(BOB).hex()
    paris = register(
        reg, request(synopsis="weather/paris", descriptors={"kind": "weather", "floor": 2})
    )
    lyon = register(
        reg, request(synopsis="weather/lyon", descriptors={"kind": "weather", "floor": 5})
    )
    secret = register(
        reg, request(synopsis="weather/secret", descriptors={"kind": "weather"}, discoverers=(bob,))
    )
    carol = key(Signer.generate("carol")).hex()

    def found(kind: str, text: str, who: str) -> set[str]:
        return {
            ad.uuid
            for ad in run_query(Query(kind, text), reg, lambda ad: reg.visible(ad.uuid, who, NOW))
        }

    assert found("exact", "weather/paris", carol) == {paris.uuid}
    assert found("regex", r"weather/(paris|lyon|secret)", carol) == {paris.uuid, lyon.uuid}
    assert found("regex", r"weather/.*", bob) == {paris.uuid, lyon.uuid, secret.uuid}
    assert found("properties", "kind = 'weather' and floor >= 3", carol) == {lyon.uuid}
    with pytest.raises(InvalidRequest, match="regular expression"):
        found("regex", "(", carol)
    with pytest.raises(FilterSyntaxError):
        found("properties", "kind = ", carol)


# -- collections --------------------------------------------------------------------------


def test_collection_limits_hold_for_every_collection_above_an_addition() -> None:
    reg = CollectionRegistry()
    owner = key(ALICE).hex()
    reg.create("top", owner, "top", CollectionLimits(max_depth=1, max_topics=3))
    reg.create("mid", owner, "mid", CollectionLimits(max_breadth=2))
    reg.create("low", owner, "low", CollectionLimits())
    reg.add("top", "mid", "collection", owner)
    with pytest.raises(CollectionLimitExceeded) as err:
        reg.add("mid", "low", "collection", owner)  # two levels below top
    assert (err.value.collection, err.value.limit) == ("top", "max_depth")
    reg.add("mid", "t1", "topic", owner)
    reg.add("mid", "t2", "topic", owner)
    with pytest.raises(CollectionLimitExceeded, match="max_breadth"):
        reg.add("mid", "t3", "topic", owner)
    reg.add("top", "t3", "topic", owner)
    with pytest.raises(CollectionLimitExceeded, match="allows 3 topic"):
        reg.add("top", "t4", "topic", owner)
    with pytest.raises(CollectionError, match="cycle"):
        reg.add("mid", "top", "collection", owner)


def test_collections_are_changed_by_their_owner_and_editors_only_and_fixed_ones_keep_shape() -> (
    None
):
    reg = CollectionRegistry()
    owner, bob = key(ALICE).hex(), key(BOB).hex()
    reg.create("sub", owner, "sub", CollectionLimits())
    reg.create(
        "c", owner, "c", CollectionLimits(fixed=True), editors=(bob,), subcollections=("sub",)
    )
    with pytest.raises(NotAllowedToEdit):
        reg.add("c", "t1", "topic", key(Signer.generate("carol")).hex())
    change = reg.add("c", "t1", "topic", bob)
    assert (change.op, change.kind, change.member) == ("add", "topic", "t1")
    with pytest.raises(CollectionError, match="fixed"):
        reg.remove("c", "sub", "collection", owner)
    reg.remove("c", "t1", "topic", owner)


def test_the_four_collection_discovery_operations() -> None:
    reg = CollectionRegistry()
    owner, bob = key(ALICE).hex(), key(BOB).hex()
    carol = key(Signer.generate("carol")).hex()
    reg.create("a", owner, "a", CollectionLimits())
    reg.create("b", owner, "b", CollectionLimits(), discoverers=(bob,))
    reg.create("c", owner, "c", CollectionLimits())
    reg.add("a", "b", "collection", owner)
    reg.add("a", "t0", "topic", owner)
    reg.add("b", "t1", "topic", owner)
    reg.add("c", "t1", "topic", owner)  # a topic in two collections
    assert reg.topics_of("a", carol) == ["t0"]
    assert reg.topics_of("a", carol, recursive=True) == ["t0", "t1"]
    assert reg.subcollections_of("a", carol) == []
    assert reg.subcollections_of("a", bob) == ["b"]
    assert reg.collections_of("t1", carol) == ["c"]
    assert reg.collections_of("t1", bob) == ["b", "c"]
    with pytest.raises(NotAuthorized):
        reg.topics_of("b", carol)


# -- delegations --------------------------------------------------------------------------


def test_delegations_grant_exactly_what_the_owner_signed() -> None:
    ad = issue_advertisement(TDN, request(), uuid="u", now=NOW, depth=0, expires=NOW + 100)
    other = issue_advertisement(TDN, request(), uuid="v", now=NOW, depth=0, expires=NOW + 100)
    grant = delegate(ALICE, ad, key(BOB), "publish", now=NOW, expires=NOW + 10)
    authorize(ad, key(BOB), "publish", grant, NOW + 1)
    authorize(ad, key(ALICE), "subscribe", None, NOW + 1)  # the owner needs none

    def reason(
        grant_: object,
        *,
        holder: bytes = key(BOB),
        right: str = "publish",
        now: float = NOW + 1,
        topic: TopicAdvertisement = ad,
    ) -> str:
        with pytest.raises(DelegationError) as err:
            authorize(topic, holder, right, grant_, now)  # type: ignore[arg-type]
        return err.value.reason

    assert reason(None) == "no-delegation"
    assert reason(grant, now=NOW + 10) == "expired"
    assert reason(grant, right="subscribe") == "wrong-right"
    assert reason(grant, holder=key(Signer.generate("carol"))) == "wrong-holder"
    assert reason(grant, topic=other) == "wrong-topic"
    assert reason(replace(grant, expires=NOW + 1000)) == "forged"
    mallory = Signer.generate("mallory")
    claimed = replace(ad, request=replace(ad.request, creator_key=key(mallory)))
    with pytest.raises(NotAuthorized, match="does not own"):
        delegate(mallory, ad, key(BOB), "publish", now=NOW)
    own = delegate(mallory, claimed, key(BOB), "publish", now=NOW)
    assert reason(own) == "not-owner"


# -- the request/reply channel ---------------------------------------------------------------


def test_requests_are_signed_and_replies_open_only_with_their_reply_key() -> None:
    blob = sign_request(ALICE, {"op": "query", "n": 1})
    signer_key, body = open_request(blob)
    assert signer_key == key(ALICE)
    assert body == {"op": "query", "n": 1}
    parts = msgpack.unpackb(blob, raw=False)
    parts[3] = msgpack.packb({"op": "query", "n": 2})
    with pytest.raises(IntegrityError):
        open_request(msgpack.packb(parts, use_bin_type=True))
    with pytest.raises(InvalidRequest):
        open_request(b"\x01garbage")
    mine, theirs = ReplyKey(), ReplyKey()
    sealed = seal_reply(mine.public, b"answer")
    assert open_reply(mine, sealed) == b"answer"
    with pytest.raises(IntegrityError):
        open_reply(theirs, sealed)


@settings(max_examples=80, deadline=None)
@given(
    limits=st.lists(
        st.builds(
            CollectionLimits,
            max_breadth=st.none() | st.integers(0, 3),
            max_depth=st.none() | st.integers(0, 2),
            max_topics=st.none() | st.integers(0, 4),
        ),
        min_size=1,
        max_size=6,
    ),
    adds=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7), st.booleans()), max_size=40),
)
def test_no_sequence_of_additions_breaks_a_limit_set_higher_up(
    limits: list[CollectionLimits], adds: list[tuple[int, int, bool]]
) -> None:
    reg = CollectionRegistry()
    owner = key(ALICE).hex()
    ids = [f"c{i}" for i in range(len(limits))]
    for cid, lim in zip(ids, limits, strict=True):
        reg.create(cid, owner, cid, lim)
    for target, member, as_collection in adds:
        cid = ids[target % len(ids)]
        with contextlib.suppress(CollectionError):
            if as_collection:
                reg.add(cid, ids[member % len(ids)], "collection", owner)
            else:
                reg.add(cid, f"t{member}", "topic", owner)
        for c, lim in zip(ids, limits, strict=True):
            col = reg.get(c)
            if lim.max_breadth is not None:
                assert len(col.topics) + len(col.subcollections) <= lim.max_breadth
            if lim.max_depth is not None:
                assert reg.height(c) <= lim.max_depth
            if lim.max_topics is not None:
                assert len(reg.all_topics(c)) <= lim.max_topics


# -- TDNs certified by the project CA --------------------------------------------------------


def _der(issued: object) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return issued.cert.public_bytes(Encoding.DER)  # type: ignore[attr-defined]


def test_with_the_ca_as_trust_anchor_only_its_tdn_certificate_for_that_id_and_key_counts(
    tmp_path: Path,
) -> None:
    import time

    from security.ca import create_ca, issue, save_ca
    from security.topics import TdnAuthority
    from security.topics_identity import load_trusted_tdns

    ca, other_ca = create_ca("ours"), create_ca("theirs")
    save_ca(ca, tmp_path)
    authority = load_trusted_tdns(tmp_path / "ca.crt")
    assert isinstance(authority, TdnAuthority)
    now = time.time()
    tdn = Signer.generate("tdn-9")
    own = tdn.key

    def ad_with(certificate: bytes, signer: Signer = tdn) -> TopicAdvertisement:
        return issue_advertisement(
            signer,
            request(now=now),
            uuid="u-ca",
            now=now,
            depth=0,
            expires=now + 60,
            certificate=certificate,
        )

    good = ad_with(_der(issue(ca, "tdn-9", "tdn", key=own)))
    wire = msgpack.unpackb(msgpack.packb(good.to_wire(), use_bin_type=True), raw=False)
    assert TopicAdvertisement.from_wire(wire) == good
    verify_advertisement(TopicAdvertisement.from_wire(wire), authority, now)

    refused = {
        "no certificate": ad_with(b""),
        "another CA": ad_with(_der(issue(other_ca, "tdn-9", "tdn", key=own))),
        "a client certificate": ad_with(_der(issue(ca, "tdn-9", "client", key=own))),
        "another TDN's name": ad_with(_der(issue(ca, "tdn-8", "tdn", key=own))),
        "another key": ad_with(_der(issue(ca, "tdn-9", "tdn"))),
        "not DER": ad_with(b"\x30\x03garbage"),
    }
    for why, ad in refused.items():
        with pytest.raises(AdvertisementError) as err:
            verify_advertisement(ad, authority, now)
        assert err.value.reason == "untrusted-tdn", why
    # a key list still works beside it, and ignores certificates
    verify_advertisement(ad_with(b""), {"tdn-9": key(tdn)}, now)
