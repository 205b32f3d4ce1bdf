"""The sans-I/O codec: round trips, framing across chunk boundaries, precise errors."""

from __future__ import annotations

import contextlib
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import InvalidRequest, PayloadTooLarge, ProtocolError, TrellisError
from broker.language.grammar import parse_filter
from broker.wire.protocol import (
    Ack,
    Advertise,
    Deliver,
    Error,
    FrameDecoder,
    Hello,
    Leaves,
    Notice,
    Pass,
    Ping,
    Pong,
    Publish,
    Role,
    Shares,
    Subscribe,
    Unadvertise,
    Unsubscribe,
    Welcome,
    encode,
    validate_attrs,
)
from security.publication import SecBlock

EXAMPLES = [
    Hello(1, Role.CLIENT, "c1", {"x": 1}),
    Welcome(1, "b1", {"max_frame": 1024}),
    Advertise(3, "a1", parse_filter("class = 'stock'")),
    Unadvertise(4, "a1"),
    Subscribe(5, "s1", parse_filter("class = 'stock' and price > 1 and price <= 5.5")),
    Unsubscribe(6, "s1"),
    Publish(7, 42, {"class": "stock", "price": 1.5, "n": -3, "ok": True}, b"\x00payload"),
    Deliver(["s1", "s2"], "c1", 42, {"class": "stock"}, b""),
    Ack(9),
    Error(10, "protocol", "bad"),
    Ping(11),
    Pong(12),
    Notice("dropped", {"subscriptions": {"s1": 3}}),
    Publish(13, 1, {"class": "x"}, b"sealed", SecBlock(b"k" * 32, b"s" * 64, "b0", 1, b"share")),
    Deliver(["s1"], "c1", 2, {"class": "x"}, b"sealed", SecBlock(b"k" * 32, b"s" * 64, "b0", 1)),
    Publish(
        14,
        3,
        {"class": "x"},
        b"sealed",
        SecBlock(b"k" * 32, b"s" * 64, "b0", 3, b"share", (1, 2, (b"h" * 32,))),
    ),
    Shares(
        7,
        [b"cert-a", b"cert-b"],
        [
            ("c1", 4, b"c1/4", (0,), (0,), b"s" * 16, b"data"),
            ("c1", 4, b"c1/4", (0, 2), (0, 1), b"t" * 16, b"more"),
        ],
    ),
    Pass([(b"above", b"s" * 64)], b"statement", b"t" * 64, b"blob"),
    Pass([], b"statement", b"t" * 64, b"blob"),
    Leaves([(b"st", b"s" * 64)], [(b"r" * 32, (0, 3), b"openings")]),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_type_round_trips(msg) -> None:
    assert list(FrameDecoder().feed(encode(msg))) == [msg]


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=50))
def test_frames_split_at_any_boundary_decode_identically(cuts: list[int]) -> None:
    stream = b"".join(encode(m) for m in EXAMPLES)
    decoder = FrameDecoder()
    got = []
    pos = 0
    for cut in cuts:
        got.extend(decoder.feed(stream[pos : pos + cut]))
        pos += cut
    got.extend(decoder.feed(stream[pos:]))
    assert got == EXAMPLES
    decoder.check_eof()


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_trellis_errors(data: bytes) -> None:
    decoder = FrameDecoder(max_frame=4096)
    try:
        list(decoder.feed(data))
        decoder.check_eof()
    except TrellisError:
        pass


@settings(max_examples=200)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**64 - 1)
        | st.floats()
        | st.text(max_size=5)
        | st.binary(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_arbitrary_msgpack_values_raise_only_trellis_errors(value: object) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    with contextlib.suppress(TrellisError):
        list(FrameDecoder().feed(struct.pack(">I", len(body)) + body))


def test_oversized_frame_is_rejected_before_its_body_arrives() -> None:
    decoder = FrameDecoder(max_frame=1024)
    with pytest.raises(PayloadTooLarge) as info:
        list(decoder.feed(struct.pack(">I", 5000)))
    assert info.value.size == 5000
    assert info.value.limit == 1024


def test_truncated_frame_is_detected_at_end_of_stream() -> None:
    decoder = FrameDecoder()
    list(decoder.feed(encode(Ping(1))[:-1]))
    with pytest.raises(ProtocolError, match="truncated frame"):
        decoder.check_eof()


def test_msgpack_nested_too_deeply_is_refused_saying_so() -> None:
    body = b"\x91" * 3000 + msgpack.packb(1)
    with pytest.raises(ProtocolError, match="msgpack nested too deeply"):
        list(FrameDecoder().feed(struct.pack(">I", len(body)) + body))


def test_field_count_mismatch_names_the_fields() -> None:
    body = msgpack.packb([7, 1, 2])
    with pytest.raises(
        ProtocolError, match=r"PUBLISH takes 5 fields \(rid, seq, attrs, payload, sec\), got 2"
    ):
        list(FrameDecoder().feed(struct.pack(">I", len(body)) + body))


def test_non_string_attribute_names_are_refused() -> None:
    body = msgpack.packb([7, 1, 1, {1: "x"}, b"", None])
    with pytest.raises(InvalidRequest, match="attribute name 1"):
        list(FrameDecoder().feed(struct.pack(">I", len(body)) + body))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_an_attribute_that_is_not_a_finite_number_is_refused_naming_it(value: float) -> None:
    """NaN never equals itself, so replicas could never agree on such a copy: it was
    acknowledged and then lost on replicated overlays."""
    body = msgpack.packb([7, 1, 1, {"class": "x", "v": value}, b"", None])
    with pytest.raises(InvalidRequest, match=r"attribute 'v' is .*numbers must be finite"):
        list(FrameDecoder().feed(struct.pack(">I", len(body)) + body))
    with pytest.raises(InvalidRequest, match="attribute 'v'"):
        validate_attrs("PUBLISH", {"v": value})


def test_a_security_block_with_an_unknown_key_is_refused_naming_it() -> None:
    sec = {"pk": b"k", "sig": b"s", "vn": "b0", "epoch": 1, "shares": b"typo"}
    frame = encode(Publish(1, 1, {"class": "x"}, b""))
    body = msgpack.unpackb(frame[4:])
    body[5] = sec
    packed = msgpack.packb(body)
    with pytest.raises(InvalidRequest, match=r"field 'sec' has unknown keys \['shares'\]"):
        list(FrameDecoder().feed(struct.pack(">I", len(packed)) + packed))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([19, 0, [b"c"], []], "'entries' must be a non-empty array"),
        ([19, 0, [1], [["c1", 1, b"p", [0], [0], b"s", b"d"]]], "'certs' must be an array"),
        ([19, -1, [b"c"], [["c1", 1, b"p", [0], [0], b"s", b"d"]]], "'base' must be an unsigned"),
        ([19, 0, [b"c"], [["c1", 1, b"p", [0], [-1], b"s", b"d"]]], "ids must be non-negative"),
        ([19, 0, [b"c"], [["c1", 1, b"p", [0], ["x"], b"s", b"d"]]], "ids must be non-negative"),
        ([19, 0, [b"c"], [["c1", 1, b"p", ["x"], [0], b"s", b"d"]]], "lineage"),
        ([19, 0, [b"c"], [["c1", 1, "p", [0], [0], b"s", b"d"]]], "must be binary"),
        ([19, 0, [b"c"], [["c1", 1, b"p", [0], [0], b"s"]]], "7-element"),
    ],
)
def test_a_malformed_shares_frame_is_refused_naming_the_field(body: list, why: str) -> None:
    raw = msgpack.packb(body, use_bin_type=True)
    with pytest.raises(InvalidRequest, match=why):
        list(FrameDecoder().feed(struct.pack(">I", len(raw)) + raw))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([20, {}, b"st", b"sig", b"blob"], "'above' must be an array"),
        ([20, [[b"st"]], b"st", b"sig", b"blob"], "'above' must hold"),
        ([20, [[b"st", "sig"]], b"st", b"sig", b"blob"], "'above' must hold"),
        ([20, [], b"", b"sig", b"blob"], "'statement' must be non-empty binary"),
        ([20, [], b"st", None, b"blob"], "'signature' must be non-empty binary"),
        ([20, [], b"st", b"sig", "blob"], "'blob' must be non-empty binary"),
        ([21, [], []], "'batches' must be a non-empty array"),
        ([21, [[b"a", b"b", b"c"]], [[b"r", [0], b"o"]]], "'statements' must hold"),
        ([21, [], [[b"r", [0]]]], r"batch must be \[ref"),
        ([21, [], [[b"r", [], b"o"]]], "positions must be a non-empty array"),
        ([21, [], [[b"r", [-1], b"o"]]], "positions must be a non-empty array"),
        ([21, [], [["r", [0], b"o"]]], "ref and openings must be binary"),
    ],
)
def test_a_malformed_pass_or_leaves_frame_is_refused_naming_the_field(body: list, why: str) -> None:
    raw = msgpack.packb(body, use_bin_type=True)
    with pytest.raises(InvalidRequest, match=why):
        list(FrameDecoder().feed(struct.pack(">I", len(raw)) + raw))


@pytest.mark.parametrize(
    "seal",
    [[0, 0, []], [2, 2, []], [0, 2, [b"short"]], [0, 2], "x", [0, 2, [b"h" * 32] * 65]],
)
def test_a_malformed_publication_seal_is_refused(seal: object) -> None:
    sec = {"pk": b"k" * 32, "sig": b"s" * 64, "vn": "b0", "epoch": 1, "seal": seal}
    raw = msgpack.packb([7, 1, 1, {"class": "x"}, b"", sec], use_bin_type=True)
    with pytest.raises(InvalidRequest, match=r"sec\.seal"):
        list(FrameDecoder().feed(struct.pack(">I", len(raw)) + raw))
