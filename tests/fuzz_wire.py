"""Fuzzing a real broker process over its wire protocol.

One *session* is a TCP connection that says HELLO in one of four ways (not at all, as a
client, as a configured neighbour broker, as a control connection of a peer) and then
sends a few frames drawn from :func:`frames`: every message type, with fields that are
right, nearly right (a wrong type, a missing or extra field, an out-of-range number, a
malformed filter or security block) or random, and raw frames whose body is not msgpack
at all. It ends with a PING. The broker must then answer that PING (it accepted or ignored
everything), or send an ERROR and close the connection: never close without a word,
never hang, never die. A witness connection that publishes to itself between sessions
proves that only the offending connection was closed.

Used by ``tests/broker/test_wire_fuzz.py`` (a short run in the suite) and
``bench/bench_reliability.py fuzz`` (a long run that prints the number of inputs tried).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import string
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
from hypothesis import strategies as st

from broker.language.grammar import parse_filter
from broker.wire.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Advertise,
    Deliver,
    Error,
    FrameDecoder,
    Hello,
    Message,
    MsgType,
    Ping,
    Pong,
    Publish,
    Role,
    Subscribe,
    encode,
)

FUZZ_BROKER = "zz-fuzzed"
NEIGHBOUR = "fuzz-neighbour"  # sorts before FUZZ_BROKER: it dials, the broker accepts
PEER = "fuzz-peer"
WITNESS = "witness#fuzz"  # '#' is outside the alphabet of fuzzed ids

_OPS = ["eq", "ne", "lt", "le", "gt", "ge", "prefix", "suffix", "contains", "exists", "in"]


def mostly(
    common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int = 4
) -> st.SearchStrategy[Any]:
    """``common`` ``odds`` times out of ``odds + 1``, else ``rare`` (one_of draws its
    branches about evenly, so weighting needs a die)."""
    return st.integers(0, odds).flatmap(lambda n: rare if n == 0 else common)


text = st.text(max_size=12)
good_ident = st.text(
    alphabet=string.ascii_letters + string.digits + "-./_", min_size=1, max_size=12
)
# Mostly well-formed values (so frames get past validation into the handlers), some not.
ident = mostly(good_ident, text | st.text(alphabet="x", min_size=250, max_size=270), 6)
integer = mostly(
    st.integers(min_value=0, max_value=1000),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    6,
)
scalar = st.one_of(st.none(), st.booleans(), integer, st.floats(), text, st.binary(max_size=16))
anything = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
predicate = st.one_of(
    st.tuples(
        st.sampled_from(["class", "price", "symbol"]) | text,
        st.sampled_from(_OPS) | text,
        scalar | st.lists(scalar, max_size=3),
    ).map(list),
    st.tuples(st.sampled_from(["class", "x"]), st.just("exists")).map(list),
    st.lists(anything, max_size=4),
)
good_predicate = st.one_of(
    st.tuples(st.just("class"), st.just("eq"), st.sampled_from(["fuzz", "witness", "x"])),
    st.tuples(
        st.just("price"),
        st.sampled_from(["lt", "le", "gt", "ge", "ne"]),
        st.integers(-100, 100) | st.floats(allow_nan=False, allow_infinity=False),
    ),
    st.tuples(st.just("symbol"), st.sampled_from(["prefix", "suffix", "contains"]), text),
    st.tuples(st.just("symbol"), st.just("in"), st.lists(text, min_size=1, max_size=3)),
).map(list)
wire_filter = mostly(
    st.lists(good_predicate, min_size=1, max_size=3), st.lists(predicate, max_size=4) | anything
)
attrs = mostly(
    st.fixed_dictionaries(
        {"class": st.sampled_from(["fuzz", "x"])},
        optional={"price": st.integers(-100, 100), "symbol": text},
    ),
    st.dictionaries(st.sampled_from(["class", "price", "i"]) | text, scalar, max_size=5) | anything,
)
sec = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "pk": st.binary(min_size=32, max_size=32) | st.binary(max_size=40),
            "sig": st.binary(min_size=64, max_size=64) | st.binary(max_size=70),
            "vn": ident,
            "epoch": integer,
        },
        optional={"share": st.binary(max_size=64) | anything},
    ),
    st.dictionaries(text, anything, max_size=4),
    anything,
)
options = st.one_of(st.dictionaries(text, anything, max_size=3), anything)

# Every message type's fields, as they are laid out on the wire (see broker.wire.protocol).
LAYOUTS: dict[MsgType, list[st.SearchStrategy[Any]]] = {
    MsgType.HELLO: [
        st.just(PROTOCOL_VERSION) | integer,
        st.sampled_from(["client", "broker"]) | text,
        ident,
        options,
    ],
    MsgType.WELCOME: [st.just(PROTOCOL_VERSION) | integer, ident, options],
    MsgType.ADVERTISE: [integer, ident, wire_filter],
    MsgType.UNADVERTISE: [integer, ident],
    MsgType.SUBSCRIBE: [integer, ident, wire_filter],
    MsgType.UNSUBSCRIBE: [integer, ident],
    MsgType.PUBLISH: [integer, integer, attrs, st.binary(max_size=64) | anything, sec],
    MsgType.DELIVER: [
        st.lists(ident, max_size=3) | anything,
        ident,
        integer,
        attrs,
        st.binary(max_size=64),
        sec,
    ],
    MsgType.ACK: [integer],
    MsgType.ERROR: [integer, text, text],
    MsgType.PING: [integer],
    MsgType.PONG: [integer],
    MsgType.NOTICE: [text, anything],
    MsgType.FORWARD: [ident, integer, attrs, st.binary(max_size=64) | anything, sec],
    MsgType.LINKSTATE: [ident, ident, integer, st.lists(ident, max_size=4) | anything],
    MsgType.SHARE: [ident, integer, st.binary(max_size=200) | anything],
    MsgType.RECONF: [
        st.sampled_from(["lock", "prepare", "freeze", "marker", "install", "abort", "explode"])
        | text,
        st.dictionaries(
            st.sampled_from(["round", "master", "lease", "hood", "links"]) | text,
            anything,
            max_size=4,
        )
        | anything,
    ],
    MsgType.SYNC: [integer, st.booleans() | anything],
}


# The message types each kind of connection may send (the others are refused).
EXPECTED = {
    "client": [
        MsgType.ADVERTISE,
        MsgType.UNADVERTISE,
        MsgType.SUBSCRIBE,
        MsgType.UNSUBSCRIBE,
        MsgType.PUBLISH,
        MsgType.PING,
        MsgType.PONG,
    ],
    "broker": [
        MsgType.ADVERTISE,
        MsgType.UNADVERTISE,
        MsgType.SUBSCRIBE,
        MsgType.UNSUBSCRIBE,
        MsgType.FORWARD,
        MsgType.SHARE,
        MsgType.LINKSTATE,
        MsgType.SYNC,
        MsgType.NOTICE,
        MsgType.PING,
        MsgType.PONG,
        MsgType.RECONF,
    ],
    "control": [MsgType.RECONF, MsgType.PING],
    "none": [MsgType.HELLO],
}


@st.composite
def structured_frame(draw: st.DrawFn, role: str = "none") -> bytes:
    """A msgpack array for one message type: fields right, one off, or random."""
    kinds = st.sampled_from(list(LAYOUTS))
    expected = st.sampled_from(EXPECTED[role])
    kind = draw(mostly(expected, kinds | st.integers(min_value=-3, max_value=300)))
    layout = LAYOUTS.get(kind, []) if isinstance(kind, MsgType) else []
    fields = [draw(s) for s in layout]
    shape = draw(mostly(st.just("right"), st.sampled_from(["short", "long", "random"])))
    if shape == "short" and fields:
        fields.pop(draw(st.integers(0, len(fields) - 1)))
    elif shape == "long":
        fields.append(draw(anything))
    elif shape == "random":
        fields = draw(st.lists(anything, max_size=6))
    body: bytes = msgpack.packb([int(kind), *fields], use_bin_type=True)
    return struct.pack(">I", len(body)) + body


@st.composite
def raw_frame(draw: st.DrawFn) -> bytes:
    """A well-delimited frame whose body is anything, or a header past the frame limit."""
    if draw(st.booleans()):
        body = draw(st.binary(max_size=80))
        return struct.pack(">I", len(body)) + body
    return struct.pack(">I", draw(st.integers(min_value=2**20 + 1, max_value=2**32 - 1)))


roles = st.sampled_from(["client", "broker", "control", "none"])


@st.composite
def sessions(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """How a connection says HELLO, and the frames it sends after."""
    role = draw(roles)
    frame = structured_frame(role)
    one = mostly(frame, raw_frame(), odds=6)
    return role, draw(st.lists(one, min_size=1, max_size=3))


def hello_for(role: str, client_id: str) -> bytes:
    if role == "client":
        return encode(Hello(PROTOCOL_VERSION, Role.CLIENT, client_id, {}))
    if role == "broker":
        return encode(Hello(PROTOCOL_VERSION, Role.BROKER, NEIGHBOUR, {}))
    if role == "control":
        return encode(Hello(PROTOCOL_VERSION, Role.BROKER, PEER, {"control": True}))
    return b""


def fuzzed_broker_settings() -> dict[str, Any]:
    """A broker that knows the fuzzer's neighbour and peer ids (so HELLOs as a broker get
    past the handshake and the fuzzed frames reach the link and control handlers)."""
    return {
        "neighbours": [{"id": NEIGHBOUR, "endpoint": "127.0.0.1:9", "vn": NEIGHBOUR}],
        "peers": [{"id": PEER, "endpoint": "127.0.0.1:9", "vn": PEER}],
        "heartbeat_interval": 3600.0,
        "hello_timeout": 30.0,
        "admin_port": 0,
    }


class Violation(AssertionError):
    """The broker broke the rule for bad input."""


@dataclass
class Outcome:
    answered: bool  # our closing PING got its PONG: the connection stayed open
    error: Error | None  # the last ERROR (before the close, or a refused request)


def _read_until(sock: socket.socket, decoder: FrameDecoder, token: int, timeout: float) -> Outcome:
    sock.settimeout(timeout)
    last_error: Error | None = None
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            raise Violation(f"no PONG and no close within {timeout:g} s") from None
        if not data:
            if last_error is None:
                raise Violation("the broker closed the connection without an ERROR")
            return Outcome(False, last_error)
        for msg in decoder.feed(data):
            if isinstance(msg, Pong) and msg.token == token:
                return Outcome(True, last_error)  # an ERROR before: a request refused
            if isinstance(msg, Error):
                last_error = msg
            elif isinstance(msg, Ping):
                sock.sendall(encode(Pong(msg.token)))


@dataclass
class FuzzTarget:
    """A running broker and the counters of what was thrown at it."""

    host: str
    port: int
    timeout: float = 10.0
    sessions: int = 0
    frames_sent: int = 0
    answered: int = 0
    closed_with_error: int = 0
    refused: int = 0  # requests refused with an ERROR on a connection that stayed open
    codes: dict[str, int] = field(default_factory=dict)
    _tokens: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def session(self, role: str, payload: list[bytes], client_id: str = "fuzz") -> Outcome:
        """One connection: HELLO as ``role``, the frames, a PING; checks the answer."""
        token = next(self._tokens) + 10**9
        with socket.create_connection((self.host, self.port), timeout=5.0) as sock:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(hello_for(role, client_id) + b"".join(payload) + encode(Ping(token)))
            outcome = _read_until(sock, FrameDecoder(max_frame=2**26), token, self.timeout)
        self.sessions += 1
        self.frames_sent += len(payload)
        if outcome.answered:
            self.answered += 1
            if outcome.error is not None:
                self.refused += 1
        else:
            assert outcome.error is not None
            self.closed_with_error += 1
            self.codes[outcome.error.code] = self.codes.get(outcome.error.code, 0) + 1
        return outcome


class Witness:
    """A client connection kept open for the whole run: it publishes to itself and must
    receive each of its publications (nothing else may disturb it)."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10.0)
        self.decoder = FrameDecoder(max_frame=2**26)
        self.rids = itertools.count(1)
        self.sent = 0
        self.inbox: list[Message] = []
        self._send(Hello(PROTOCOL_VERSION, Role.CLIENT, WITNESS, {}))
        self._expect(lambda m: m.__class__.__name__ == "Welcome")
        flt = parse_filter("class = 'witness'")
        self._request(lambda rid: Advertise(rid, "a", flt))
        self._request(lambda rid: Subscribe(rid, "s", flt))

    def _send(self, msg: Message) -> None:
        self.sock.sendall(encode(msg))

    def _expect(self, want: Any) -> Message:
        while True:
            for i, msg in enumerate(self.inbox):
                if want(msg):
                    return self.inbox.pop(i)
                if isinstance(msg, Error):
                    raise Violation(f"the witness got {msg}")
            data = self.sock.recv(65536)
            if not data:
                raise Violation("the witness's connection was closed")
            for msg in self.decoder.feed(data):
                if isinstance(msg, Ping):
                    self._send(Pong(msg.token))
                else:
                    self.inbox.append(msg)

    def _request(self, make: Any) -> None:
        rid = next(self.rids)
        self._send(make(rid))
        self._expect(lambda m: isinstance(m, Ack) and m.rid == rid)

    def check(self) -> None:
        """Publish once and receive it back."""
        self.sent += 1
        n = self.sent
        self._request(lambda rid: Publish(rid, n, {"class": "witness", "n": n}, b"w"))
        self._expect(lambda m: isinstance(m, Deliver) and m.attrs.get("n") == n)

    def close(self) -> None:
        self.sock.close()
