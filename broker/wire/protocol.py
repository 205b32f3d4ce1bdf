"""The Trellis wire protocol, sans-I/O: bytes in, validated messages out, and back.

A frame is a 4-byte big-endian length followed by a msgpack array whose first element is
the message type. Keeping the codec free of sockets lets the broker, the SDK and the
fuzz/property tests share one implementation. Every decoded frame is validated here, so
the layers above only ever see well-typed messages; anything else raises
``ProtocolError``/``InvalidRequest`` with a reason precise enough to put in an ERROR frame.

Layouts (``rid`` is a request id the broker echoes in ACK/ERROR; 0 asks for no ACK)::

    HELLO        [1, version, role, id, options]
    WELCOME      [2, version, broker_id, options]
    ADVERTISE    [3, rid, adv_id, filter]
    UNADVERTISE  [4, rid, adv_id]
    SUBSCRIBE    [5, rid, sub_id, filter]
    UNSUBSCRIBE  [6, rid, sub_id]
    PUBLISH      [7, rid, seq, attrs, payload, sec]
    DELIVER      [8, [sub_id, ...], publisher, seq, attrs, payload, sec]
    ACK          [9, rid]
    ERROR        [10, rid, code, message]
    PING         [11, token]
    PONG         [12, token]
    NOTICE       [13, kind, data]
    FORWARD      [14, publisher, seq, attrs, payload, sec]   (broker to broker)
    LINKSTATE    [15, broker_id, vn, version, [neighbour, ...]]  (broker to broker)

    SHARE        [16, publisher, seq, record]                (key share, to broker or client)
    RECONF       [17, op, data]                              (live reconfiguration)
    SHARES       [19, base, [cert, ...], [entry, ...]]
                 entry: [publisher, seq, pub_id, lineage, [cert id, ...], salt, data]
                 (key shares of one pass from one sender; the new certificates take link-wide
                 ids base, base + 1, ...; entries name theirs by id, also ones the link
                 carried in earlier frames; base 0 starts the numbering of a new connection)
    PASS         [20, [[statement, signature], ...], statement, signature, blob]
                 (key shares by the pass, :mod:`security.pass_shares`: what one splitter split
                 toward the receiver in one pass: the statements above those shares that are
                 new to the link, the pass's own signed statement, and the receiver's blob;
                 also publisher to edge replica, beside the PUBLISH that opens an epoch)
    LEAVES       [21, [[statement, signature], ...], [[ref, [position, ...], openings], ...]]
                 (a replica of the subscriber's VN hands it the leaves it holds: the statements
                 new to the link, then per statement the entries' positions and openings)

``sec`` is nil for a plain publication. For a confidential one the payload is AES-GCM
ciphertext and ``sec`` is a map: ``pk`` (publisher's Ed25519 key), ``sig`` (its signature),
``vn`` (the publisher's edge VN), ``epoch`` (the seq of the first publication under the
same content key), in a PUBLISH that opens an epoch ``share`` (this replica's share), and
``seal`` ([position, count, [hash, ...]]) when ``sig`` signs a Merkle root over this
publication and the root split of its key rather than the publication alone.

Between brokers, ADVERTISE/UNADVERTISE/SUBSCRIBE/UNSUBSCRIBE travel with rid 0 and
overlay-wide keys (``origin-broker/client/id``) in place of the client's ids.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from math import isfinite
from typing import Any

import msgpack

from broker.errors import FilterError, InvalidRequest, PayloadTooLarge, ProtocolError
from broker.language.filters import Filter, Value
from security.publication import SecBlock

PROTOCOL_VERSION = 1
MARK_NOTICE = "mark"
"""``NOTICE mark {"round": id}``: a broker asks a publishing client for a mark of a live
reconfiguration round, and the client writes one to every replica of its edge VN at one
point of its stream (once ``f + 1`` asked), so that they all switch tables there."""
MARKS_OPTION = "marks"
"""HELLO option: the client answers ``NOTICE mark``."""
RESUMED_OPTION = "resumed"
"""WELCOME option, present when the connection resumed the client's parked session:
``{"advertisements": [id, ...], "subscriptions": [id, ...]}`` the session still holds, so
that a client withdraws what it dropped while its connection was down."""
REPLICAS_OPTION = "replicas"
"""WELCOME option of a replica of a replicated VN (until a live membership change, whose
announcement says the same): ``[[broker id, endpoint], ...]``, the VN's replicas (the
answering one's endpoint empty), so that a client given too few endpoints finds the rest."""
DEFAULT_MAX_FRAME = 1024 * 1024
MAX_ID_LENGTH = 256
MAX_KEY_LENGTH = 3 * MAX_ID_LENGTH + 2
"""A routing key between brokers: a broker forwards a client's advertisement or
subscription under ``broker/client/key``, three ids long (a client's own key is an id)."""


def forward_growth(publisher: str) -> int:
    """Bytes a FORWARD of ``publisher``'s publication may weigh beyond its PUBLISH frame
    (it names the publisher where the PUBLISH had a request id), at most: a PUBLISH that
    fits ``max_frame`` with less to spare could not be forwarded to the next broker."""
    return len(publisher.encode()) + 5


def key_growth(broker_id: str, client_id: str) -> int:
    """Bytes an ADVERTISE or SUBSCRIBE of client ``client_id`` may weigh more once broker
    ``broker_id`` forwards it (under ``broker/client/key``), at most."""
    return len(broker_id.encode()) + len(client_id.encode()) + 8


def unforwardable(size: int, limit: int) -> PayloadTooLarge:
    """The refusal of a publication whose frame (``size`` bytes) is over ``limit``, the
    frame limit less :func:`forward_growth` (the SDK's and the broker's alike)."""
    return PayloadTooLarge(
        f"publication of {size} bytes (payload, attributes and security block) exceeds the "
        f"{limit} bytes a broker can forward (its max_frame less room to name the publisher)",
        size=size,
        limit=limit,
    )


def unroutable(name: str, size: int, limit: int) -> PayloadTooLarge:
    """The refusal of an ADVERTISE or SUBSCRIBE (``name``) whose frame is over ``limit``,
    the frame limit less :func:`key_growth` (the SDK's and the broker's alike)."""
    return PayloadTooLarge(
        f"{name} of {size} bytes exceeds the {limit} bytes a broker can forward (its "
        "max_frame less room for the key it forwards the filter under)",
        size=size,
        limit=limit,
    )


MAX_ROUND_ID = 1024
"""Characters of a reconfiguration round's name in a marker or a mark request (``broker
id#serial``: ids are far shorter)."""

MAX_VN_SIZE = 64
"""Replicas one VN may have (a broker's ``vn_size``; what a WELCOME may announce)."""

MAX_ATTRS = 128
MAX_ATTR_NAME = 256
MAX_STRING_VALUE = 64 * 1024

_LENGTH = struct.Struct(">I")
HEADER_SIZE = _LENGTH.size


class MsgType(IntEnum):
    HELLO = 1
    WELCOME = 2
    ADVERTISE = 3
    UNADVERTISE = 4
    SUBSCRIBE = 5
    UNSUBSCRIBE = 6
    PUBLISH = 7
    DELIVER = 8
    ACK = 9
    ERROR = 10
    PING = 11
    PONG = 12
    NOTICE = 13
    FORWARD = 14
    LINKSTATE = 15
    SHARE = 16
    RECONF = 17
    SYNC = 18
    SHARES = 19
    PASS = 20
    LEAVES = 21


_DELIVER = int(MsgType.DELIVER)
_PUBLISH = int(MsgType.PUBLISH)
_FORWARD = int(MsgType.FORWARD)


class Role(StrEnum):
    CLIENT = "client"
    BROKER = "broker"


@dataclass(slots=True)
class Hello:
    version: int
    role: Role
    id: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Welcome:
    version: int
    broker_id: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Advertise:
    rid: int
    adv_id: str
    filter: Filter


@dataclass(slots=True)
class Unadvertise:
    rid: int
    adv_id: str


@dataclass(slots=True)
class Subscribe:
    rid: int
    sub_id: str
    filter: Filter


@dataclass(slots=True)
class Unsubscribe:
    rid: int
    sub_id: str


@dataclass(slots=True)
class Publish:
    rid: int
    seq: int
    attrs: dict[str, Value]
    payload: bytes
    sec: SecBlock | None = None


@dataclass(slots=True)
class Deliver:
    sub_ids: list[str]
    publisher: str
    seq: int
    attrs: dict[str, Value]
    payload: bytes
    sec: SecBlock | None = None


@dataclass(slots=True)
class Ack:
    rid: int


@dataclass(slots=True)
class Error:
    rid: int
    code: str
    message: str


@dataclass(slots=True)
class Ping:
    token: int


@dataclass(slots=True)
class Pong:
    token: int


@dataclass(slots=True)
class Notice:
    kind: str
    data: dict[str, Any]


@dataclass(slots=True)
class Forward:
    publisher: str
    seq: int
    attrs: dict[str, Value]
    payload: bytes
    sec: SecBlock | None = None


@dataclass(slots=True)
class Share:
    publisher: str
    seq: int
    record: bytes


ShareEntry = tuple[str, int, bytes, tuple[int, ...], tuple[int, ...], bytes, bytes]
"""One share in a SHARES frame: publisher, seq (the key epoch), pub_id, lineage, link ids
of its certificates (root split first), salt, data."""


@dataclass(slots=True)
class Shares:
    """Key shares one sender made or relayed in one event-loop pass, for one receiver.

    ``certs`` holds the packed split certificates new to the link, numbered from ``base``;
    entries name theirs by link id, so a certificate shared by many records (every record
    below a split carries it) travels and is parsed once per link instead of once per
    record (:class:`security.propagation.LinkCertsOut`)."""

    base: int
    certs: list[bytes]
    entries: list[ShareEntry]


Signed = tuple[bytes, bytes]
"""A pass statement as it travels: its canonical bytes and its splitter's signature."""


@dataclass(slots=True)
class Pass:
    """Key shares one splitter split toward the receiver in one pass (or a publisher's root
    split toward its edge replica): the statements above them new to the link, the pass's
    own statement and signature, and the receiver's blob (its child of every entry)."""

    above: list[Signed]
    statement: bytes
    signature: bytes
    blob: bytes


LeafEntry = tuple[bytes, tuple[int, ...], bytes]
"""Leaves under one statement: its reference, the entries' positions, their openings."""


@dataclass(slots=True)
class Leaves:
    """Key shares a replica of the subscriber's VN hands it: statements new to the link
    (every one above the leaves) and the leaves, grouped by the statement they came under."""

    statements: list[Signed]
    batches: list[LeafEntry]


@dataclass(slots=True)
class Reconf:
    """One step of the live OCBR protocol (lock, prepare, freeze, marker, install, ...)."""

    op: str
    data: dict[str, Any]


@dataclass(slots=True)
class Sync:
    """A routing-state wave between brokers (``done`` False: "settle your side, then tell
    me"; True: "everything I and those beyond me owed you was sent before this")."""

    token: int
    done: bool


@dataclass(slots=True)
class LinkState:
    broker_id: str
    vn: str
    version: int
    neighbours: list[str]


Message = (
    Hello
    | Welcome
    | Advertise
    | Unadvertise
    | Subscribe
    | Unsubscribe
    | Publish
    | Deliver
    | Ack
    | Error
    | Ping
    | Pong
    | Notice
    | Forward
    | LinkState
    | Share
    | Reconf
    | Sync
    | Shares
    | Pass
    | Leaves
)


# ---------------------------------------------------------------------------------------
# Encoding


def frame(body: bytes) -> bytes:
    """Prefix an already-packed msgpack body with its length."""
    return _LENGTH.pack(len(body)) + body


_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def encode(msg: Message) -> bytes:
    """Encode one message as a complete frame."""
    return frame(_packb(to_wire(msg)))


def encode_filter(flt: Filter) -> bytes:
    """A filter's wire form alone (what it costs in a frame, and to hold)."""
    return _packb(flt.to_wire())


def to_wire(msg: Message) -> list[Any]:
    """The msgpack-ready array for ``msg``."""
    match msg:
        case Publish(rid, seq, attrs, payload, sec):
            return [_PUBLISH, rid, seq, attrs, payload, _sec_wire(sec)]
        case Deliver(sub_ids, publisher, seq, attrs, payload, sec):
            return [MsgType.DELIVER, sub_ids, publisher, seq, attrs, payload, _sec_wire(sec)]
        case Ack(rid):
            return [MsgType.ACK, rid]
        case Hello(version, role, ident, options):
            return [MsgType.HELLO, version, str(role), ident, options]
        case Welcome(version, broker_id, options):
            return [MsgType.WELCOME, version, broker_id, options]
        case Advertise(rid, adv_id, flt):
            return [MsgType.ADVERTISE, rid, adv_id, flt.to_wire()]
        case Unadvertise(rid, adv_id):
            return [MsgType.UNADVERTISE, rid, adv_id]
        case Subscribe(rid, sub_id, flt):
            return [MsgType.SUBSCRIBE, rid, sub_id, flt.to_wire()]
        case Unsubscribe(rid, sub_id):
            return [MsgType.UNSUBSCRIBE, rid, sub_id]
        case Error(rid, code, message):
            return [MsgType.ERROR, rid, code, message]
        case Ping(token):
            return [MsgType.PING, token]
        case Pong(token):
            return [MsgType.PONG, token]
        case Notice(kind, data):
            return [MsgType.NOTICE, kind, data]
        case Forward(publisher, seq, attrs, payload, sec):
            return [MsgType.FORWARD, publisher, seq, attrs, payload, _sec_wire(sec)]
        case Share(publisher, seq, record):
            return [MsgType.SHARE, publisher, seq, record]
        case LinkState(broker_id, vn, version, neighbours):
            return [MsgType.LINKSTATE, broker_id, vn, version, neighbours]
        case Reconf(op, data):
            return [MsgType.RECONF, op, data]
        case Sync(token, done):
            return [MsgType.SYNC, token, done]
        case Shares(base, certs, entries):
            return [MsgType.SHARES, base, certs, entries]
        case Pass(above, statement, signature, blob):
            return [MsgType.PASS, above, statement, signature, blob]
        case Leaves(statements, batches):
            return [MsgType.LEAVES, statements, batches]
    raise TypeError(f"not a protocol message: {msg!r}")


def _sec_wire(sec: SecBlock | None) -> dict[str, Any] | None:
    return None if sec is None else sec.to_wire()


def encode_forward(
    publisher: str, seq: int, attrs: Any, payload: bytes, sec: SecBlock | None = None
) -> bytes:
    """Fast path for publications travelling between brokers."""
    wire = None if sec is None else sec.to_wire()
    return frame(_packb([_FORWARD, publisher, seq, attrs, payload, wire]))


def encode_deliver(
    sub_ids: list[str],
    publisher: str,
    seq: int,
    attrs: Any,
    payload: bytes,
    sec: SecBlock | None = None,
) -> bytes:
    """Fast path for the broker's hottest frame (skips building a ``Deliver`` object)."""
    wire = None if sec is None else sec.to_wire()
    return frame(_packb([_DELIVER, sub_ids, publisher, seq, attrs, payload, wire]))


# ---------------------------------------------------------------------------------------
# Decoding


class FrameDecoder:
    """Incremental frame splitter and validator.

    Feed it whatever the transport delivered; iterate the complete, validated messages.
    A frame over ``max_frame`` is rejected from its header alone, before buffering it.
    """

    __slots__ = ("_buf", "consumed", "last", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame
        # The body length of the frame last yielded (read while handling it).
        self.last = 0
        # Bytes of complete frames so far: a reader tells progress from a stalled frame.
        self.consumed = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> Iterator[Message]:
        """Append ``data`` and yield every message now complete.

        Raises:
            PayloadTooLarge: a frame header announces more than ``max_frame`` bytes.
            ProtocolError: a frame is not a valid message.
            InvalidRequest: a message is well-formed but a field is invalid.
        """
        buf = self._buf
        buf += data
        offset = 0
        end = len(buf)
        try:
            while end - offset >= HEADER_SIZE:
                (length,) = _LENGTH.unpack_from(buf, offset)
                if length > self.max_frame:
                    raise PayloadTooLarge(
                        f"frame of {length} bytes exceeds the limit of {self.max_frame} bytes",
                        size=length,
                        limit=self.max_frame,
                    )
                if end - offset - HEADER_SIZE < length:
                    break
                start = offset + HEADER_SIZE
                offset = start + length
                self.last = length
                yield decode_body(buf[start:offset])
        finally:
            del buf[:offset]
            self.consumed += offset

    def check_eof(self) -> None:
        """Raise if the stream ended in the middle of a frame."""
        if not self._buf:
            return
        if len(self._buf) < HEADER_SIZE:
            raise ProtocolError(
                f"truncated frame: stream ended after {len(self._buf)} of "
                f"{HEADER_SIZE} header bytes"
            )
        (length,) = _LENGTH.unpack_from(self._buf, 0)
        got = len(self._buf) - HEADER_SIZE
        raise ProtocolError(f"truncated frame: stream ended after {got} of {length} body bytes")


def decode_body(body: bytes | bytearray) -> Message:
    """Decode and validate one frame body."""
    try:
        raw = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=False)
    except msgpack.StackError:
        raise ProtocolError("malformed frame: msgpack nested too deeply") from None
    except Exception as exc:
        raise ProtocolError(
            f"malformed frame: not valid msgpack ({exc or type(exc).__name__})"
        ) from None
    return validate(raw)


def validate(raw: object) -> Message:
    """Turn a decoded msgpack value into a typed message, or say precisely what is wrong."""
    if not isinstance(raw, list) or not raw:
        raise ProtocolError(f"malformed frame: expected a non-empty array, got {_kind(raw)}")
    tag = raw[0]
    if type(tag) is not int:
        raise ProtocolError(f"malformed frame: message type must be an integer, got {_kind(tag)}")
    entry = _DISPATCH.get(tag)
    if entry is None:
        raise ProtocolError(f"unknown message type {tag}")
    name, size, build = entry
    if len(raw) != size:
        spec = _LAYOUTS[MsgType(tag)]
        raise ProtocolError(
            f"{name} takes {len(spec)} fields ({', '.join(spec)}), got {len(raw) - 1}"
        )
    return build(name, raw)


_LAYOUTS: dict[MsgType, tuple[str, ...]] = {
    MsgType.HELLO: ("version", "role", "id", "options"),
    MsgType.WELCOME: ("version", "broker_id", "options"),
    MsgType.ADVERTISE: ("rid", "adv_id", "filter"),
    MsgType.UNADVERTISE: ("rid", "adv_id"),
    MsgType.SUBSCRIBE: ("rid", "sub_id", "filter"),
    MsgType.UNSUBSCRIBE: ("rid", "sub_id"),
    MsgType.PUBLISH: ("rid", "seq", "attrs", "payload", "sec"),
    MsgType.DELIVER: ("sub_ids", "publisher", "seq", "attrs", "payload", "sec"),
    MsgType.ACK: ("rid",),
    MsgType.ERROR: ("rid", "code", "message"),
    MsgType.PING: ("token",),
    MsgType.PONG: ("token",),
    MsgType.NOTICE: ("kind", "data"),
    MsgType.FORWARD: ("publisher", "seq", "attrs", "payload", "sec"),
    MsgType.LINKSTATE: ("broker_id", "vn", "version", "neighbours"),
    MsgType.SHARE: ("publisher", "seq", "record"),
    MsgType.RECONF: ("op", "data"),
    MsgType.SYNC: ("token", "done"),
    MsgType.SHARES: ("base", "certs", "entries"),
    MsgType.PASS: ("above", "statement", "signature", "blob"),
    MsgType.LEAVES: ("statements", "batches"),
}


def _kind(value: object) -> str:
    return type(value).__name__


def _uint(name: str, field_name: str, value: object) -> int:
    if type(value) is not int or value < 0 or value >= 2**63:
        raise InvalidRequest(
            f"{name} field '{field_name}' must be an unsigned integer, got {value!r}"
        )
    return value


def _ident(name: str, field_name: str, value: object, limit: int = MAX_ID_LENGTH) -> str:
    if type(value) is not str or not value or len(value) > limit:
        raise InvalidRequest(
            f"{name} field '{field_name}' must be a non-empty string of at most "
            f"{limit} characters, got {_short(value)}"
        )
    return value


def _key(name: str, field_name: str, value: object) -> str:
    return _ident(name, field_name, value, MAX_KEY_LENGTH)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _options(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(type(k) is str for k in value):
        raise InvalidRequest(f"{name} field 'options' must be a map with string keys")
    return value


def copy_weight(payload: bytes, attrs: Mapping[str, Value], sec: SecBlock | None) -> int:
    """About what one copy of a publication weighs as read (payload, attribute names and
    string values, security block): what a copy waiting for agreement is charged to its
    sender. The payload alone let a copy carry most of a frame in attributes for free."""
    weight = len(payload)
    for key, value in attrs.items():
        weight += len(key) + (len(value) if type(value) is str else 8)
    if sec is not None:
        weight += len(sec.pk) + len(sec.sig) + len(sec.vn) + len(sec.share or b"") + 16
        if sec.seal is not None:
            weight += 32 * len(sec.seal[2]) + 16
    return weight


def validate_attrs(name: str, value: object) -> dict[str, Value]:
    """Check a publication's attribute map: string names, scalar typed values, sane sizes."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} field 'attrs' must be a map, got {_kind(value)}")
    if len(value) > MAX_ATTRS:
        raise InvalidRequest(f"{name} has {len(value)} attributes; the limit is {MAX_ATTRS}")
    for key, item in value.items():
        if type(key) is not str or not key or len(key) > MAX_ATTR_NAME:
            raise InvalidRequest(f"{name} attribute name {_short(key)} must be a non-empty string")
        kind = type(item)
        if kind is str:
            if len(item) > MAX_STRING_VALUE:
                raise InvalidRequest(f"{name} attribute '{key}' is longer than {MAX_STRING_VALUE}")
        elif kind is float:
            if not isfinite(item):
                # NaN never equals itself: replicas could never agree on the copy (and no
                # filter can name NaN or infinity).
                raise InvalidRequest(f"{name} attribute '{key}' is {item}: numbers must be finite")
        elif kind not in (int, bool):
            raise InvalidRequest(
                f"{name} attribute '{key}' must be str, int, float or bool, got {_kind(item)}"
            )
    return value


def _filter(name: str, value: object) -> Filter:
    try:
        return Filter.from_wire(value)
    except FilterError as exc:
        raise type(exc)(f"{name} field 'filter': {exc.message}") from None


def _payload(name: str, value: object) -> bytes:
    if type(value) is not bytes:
        raise InvalidRequest(f"{name} field 'payload' must be binary, got {_kind(value)}")
    return value


def _build_hello(name: str, raw: list[Any]) -> Hello:
    version = _uint(name, "version", raw[1])
    try:
        role = Role(raw[2])
    except ValueError:
        raise InvalidRequest(
            f"{name} field 'role' must be 'client' or 'broker', got {_short(raw[2])}"
        ) from None
    return Hello(version, role, _ident(name, "id", raw[3]), _options(name, raw[4]))


def _build_welcome(name: str, raw: list[Any]) -> Welcome:
    return Welcome(
        _uint(name, "version", raw[1]), _ident(name, "broker_id", raw[2]), _options(name, raw[3])
    )


def _build_advertise(name: str, raw: list[Any]) -> Advertise:
    return Advertise(
        _uint(name, "rid", raw[1]), _key(name, "adv_id", raw[2]), _filter(name, raw[3])
    )


def _build_unadvertise(name: str, raw: list[Any]) -> Unadvertise:
    return Unadvertise(_uint(name, "rid", raw[1]), _key(name, "adv_id", raw[2]))


def _build_subscribe(name: str, raw: list[Any]) -> Subscribe:
    return Subscribe(
        _uint(name, "rid", raw[1]), _key(name, "sub_id", raw[2]), _filter(name, raw[3])
    )


def _build_unsubscribe(name: str, raw: list[Any]) -> Unsubscribe:
    return Unsubscribe(_uint(name, "rid", raw[1]), _key(name, "sub_id", raw[2]))


def check_client_key(msg: Advertise | Unadvertise | Subscribe | Unsubscribe) -> None:
    """A client's own advertisement or subscription key is an id (at most
    :data:`MAX_ID_LENGTH`): the frame decodes keys as long as brokers forward them.

    Raises:
        InvalidRequest: the key is longer.
    """
    field = "sub_id" if isinstance(msg, Subscribe | Unsubscribe) else "adv_id"
    _ident(type(msg).__name__.upper(), field, getattr(msg, field))


def _build_publish(name: str, raw: list[Any]) -> Publish:
    _, rid, seq, attrs, payload, sec = raw
    # The hottest frame: inline the common checks, fall back to the helpers for errors.
    if type(rid) is not int or rid < 0 or rid >= 2**63:
        _uint(name, "rid", rid)
    if type(seq) is not int or seq < 0 or seq >= 2**63:
        _uint(name, "seq", seq)
    if type(payload) is not bytes:
        _payload(name, payload)
    return Publish(
        rid, seq, validate_attrs(name, attrs), payload, None if sec is None else _sec(name, sec)
    )


def _build_deliver(name: str, raw: list[Any]) -> Deliver:
    sub_ids = raw[1]
    if not isinstance(sub_ids, list) or not sub_ids:
        raise InvalidRequest(f"{name} field 'sub_ids' must be a non-empty array")
    for sid in sub_ids:
        _ident(name, "sub_ids", sid)
    return Deliver(
        sub_ids,
        _ident(name, "publisher", raw[2]),
        _uint(name, "seq", raw[3]),
        validate_attrs(name, raw[4]),
        _payload(name, raw[5]),
        _sec(name, raw[6]),
    )


def _build_ack(name: str, raw: list[Any]) -> Ack:
    return Ack(_uint(name, "rid", raw[1]))


def _build_error(name: str, raw: list[Any]) -> Error:
    code, message = raw[2], raw[3]
    if type(code) is not str or type(message) is not str:
        raise InvalidRequest(f"{name} fields 'code' and 'message' must be strings")
    return Error(_uint(name, "rid", raw[1]), code, message)


def _build_ping(name: str, raw: list[Any]) -> Ping:
    return Ping(_uint(name, "token", raw[1]))


def _build_pong(name: str, raw: list[Any]) -> Pong:
    return Pong(_uint(name, "token", raw[1]))


def _build_sync(name: str, raw: list[Any]) -> Sync:
    done = raw[2]
    if type(done) is not bool:
        raise InvalidRequest(f"{name} field 'done' must be a boolean, got {_kind(done)}")
    return Sync(_uint(name, "token", raw[1]), done)


def _build_notice(name: str, raw: list[Any]) -> Notice:
    kind = raw[1]
    if type(kind) is not str:
        raise InvalidRequest(f"{name} field 'kind' must be a string")
    data = raw[2]
    if not isinstance(data, dict):
        raise InvalidRequest(f"{name} field 'data' must be a map")
    return Notice(kind, data)


def _build_forward(name: str, raw: list[Any]) -> Forward:
    return Forward(
        _ident(name, "publisher", raw[1]),
        _uint(name, "seq", raw[2]),
        validate_attrs(name, raw[3]),
        _payload(name, raw[4]),
        _sec(name, raw[5]),
    )


def _build_share(name: str, raw: list[Any]) -> Share:
    record = raw[3]
    if type(record) is not bytes or not record:
        raise InvalidRequest(f"{name} field 'record' must be non-empty binary")
    return Share(_ident(name, "publisher", raw[1]), _uint(name, "seq", raw[2]), record)


def _build_shares(name: str, raw: list[Any]) -> Shares:
    base = _uint(name, "base", raw[1])
    certs, entries = raw[2], raw[3]
    if not isinstance(certs, list) or not all(type(c) is bytes and c for c in certs):
        raise InvalidRequest(f"{name} field 'certs' must be an array of non-empty binaries")
    if not isinstance(entries, list) or not entries:
        raise InvalidRequest(f"{name} field 'entries' must be a non-empty array")
    out: list[ShareEntry] = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 7:
            raise InvalidRequest(f"{name} entry must be a 7-element array")
        publisher, seq, pub_id, lineage, refs, salt, data = entry
        if type(pub_id) is not bytes or type(salt) is not bytes or type(data) is not bytes:
            raise InvalidRequest(f"{name} entry pub_id, salt and data must be binary")
        if not isinstance(lineage, list) or not all(type(i) is int for i in lineage):
            raise InvalidRequest(f"{name} entry lineage must be an array of integers")
        if not isinstance(refs, list) or not all(type(i) is int and i >= 0 for i in refs):
            raise InvalidRequest(f"{name} entry certificate ids must be non-negative integers")
        out.append(
            (
                _ident(name, "publisher", publisher),
                _uint(name, "seq", seq),
                pub_id,
                tuple(lineage),
                tuple(refs),
                salt,
                data,
            )
        )
    return Shares(base, certs, out)


def _binary(name: str, field_name: str, value: object) -> bytes:
    if type(value) is not bytes or not value:
        raise InvalidRequest(f"{name} field '{field_name}' must be non-empty binary")
    return value


def _signed_list(name: str, field_name: str, value: object) -> list[Signed]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{name} field '{field_name}' must be an array")
    out: list[Signed] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or type(item[0]) is not bytes
            or type(item[1]) is not bytes
        ):
            raise InvalidRequest(
                f"{name} field '{field_name}' must hold [statement, signature] binary pairs"
            )
        out.append((item[0], item[1]))
    return out


def _build_pass(name: str, raw: list[Any]) -> Pass:
    return Pass(
        _signed_list(name, "above", raw[1]),
        _binary(name, "statement", raw[2]),
        _binary(name, "signature", raw[3]),
        _binary(name, "blob", raw[4]),
    )


def _build_leaves(name: str, raw: list[Any]) -> Leaves:
    statements = _signed_list(name, "statements", raw[1])
    batches = raw[2]
    if not isinstance(batches, list) or not batches:
        raise InvalidRequest(f"{name} field 'batches' must be a non-empty array")
    out: list[LeafEntry] = []
    for batch in batches:
        if not isinstance(batch, list) or len(batch) != 3:
            raise InvalidRequest(f"{name} batch must be [ref, [position, ...], openings]")
        ref, positions, blob = batch
        if type(ref) is not bytes or type(blob) is not bytes or not blob:
            raise InvalidRequest(f"{name} batch ref and openings must be binary")
        if (
            not isinstance(positions, list)
            or not positions
            or not all(type(p) is int and 0 <= p < 2**32 for p in positions)
        ):
            raise InvalidRequest(f"{name} batch positions must be a non-empty array of indices")
        out.append((ref, tuple(positions), blob))
    return Leaves(statements, out)


def _sec(name: str, value: object) -> SecBlock | None:
    """Check the security block of a confidential publication (nil for plain ones)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} field 'sec' must be nil or a map")
    for key in ("pk", "sig"):
        if type(value.get(key)) is not bytes:
            raise InvalidRequest(f"{name} field 'sec.{key}' must be binary")
    if "share" in value and type(value["share"]) is not bytes:
        raise InvalidRequest(f"{name} field 'sec.share' must be binary")
    epoch = value.get("epoch")
    if type(epoch) is not int or epoch < 1:
        raise InvalidRequest(f"{name} field 'sec.epoch' must be a positive integer")
    if type(value.get("vn")) is not str:
        raise InvalidRequest(f"{name} field 'sec.vn' must be a string")
    unknown = set(value) - _SEC_FIELDS
    if unknown:
        raise InvalidRequest(f"{name} field 'sec' has unknown keys {sorted(unknown)}")
    seal = value.get("seal")
    if seal is not None:
        seal = _seal(name, seal)
    return SecBlock(value["pk"], value["sig"], value["vn"], epoch, value.get("share"), seal)


def _seal(name: str, value: object) -> tuple[int, int, tuple[bytes, ...]]:
    """Check ``sec.seal``: [position, count, [sibling hash, ...]] of a sealed batch."""
    if not isinstance(value, list) or len(value) != 3:
        raise InvalidRequest(f"{name} field 'sec.seal' must be [position, count, proof]")
    position, count, proof = value
    if type(position) is not int or type(count) is not int or not 0 <= position < count:
        raise InvalidRequest(f"{name} field 'sec.seal' needs 0 <= position < count")
    if (
        not isinstance(proof, list)
        or len(proof) > _MAX_PROOF
        or not all(type(h) is bytes and len(h) == 32 for h in proof)
    ):
        raise InvalidRequest(f"{name} field 'sec.seal' proof must be 32-byte hashes")
    return position, count, tuple(proof)


_SEC_FIELDS = frozenset(("pk", "sig", "vn", "epoch", "share", "seal"))
_MAX_PROOF = 64


def _build_linkstate(name: str, raw: list[Any]) -> LinkState:
    neighbours = raw[4]
    if not isinstance(neighbours, list):
        raise InvalidRequest(f"{name} field 'neighbours' must be an array")
    return LinkState(
        _ident(name, "broker_id", raw[1]),
        _ident(name, "vn", raw[2]),
        _uint(name, "version", raw[3]),
        [_ident(name, "neighbours", n) for n in neighbours],
    )


RECONF_OPS = frozenset(
    {
        "lock",
        "unlock",
        "prepare",
        "connect",
        "freeze",
        "marker",
        "install",
        "resume",
        "abort",
        "reply",
        "move",  # an operator's request that a master run one given move (trellis rebuild)
        "membership",  # an operator's request to adopt a manifest version (replica attach/detach)
        "neighbours",  # a restarted replica asks a sibling for the neighbour VNs it keeps
    }
)


def _build_reconf(name: str, raw: list[Any]) -> Reconf:
    op = raw[1]
    if type(op) is not str or op not in RECONF_OPS:
        raise InvalidRequest(
            f"{name} field 'op' must be one of {', '.join(sorted(RECONF_OPS))}, got {op!r}"
        )
    data = raw[2]
    if not isinstance(data, dict):
        raise InvalidRequest(f"{name} field 'data' must be a map")
    return Reconf(op, data)


_Builder = Callable[[str, list[Any]], Message]

_BUILDERS: dict[MsgType, _Builder] = {
    MsgType.HELLO: _build_hello,
    MsgType.WELCOME: _build_welcome,
    MsgType.ADVERTISE: _build_advertise,
    MsgType.UNADVERTISE: _build_unadvertise,
    MsgType.SUBSCRIBE: _build_subscribe,
    MsgType.UNSUBSCRIBE: _build_unsubscribe,
    MsgType.PUBLISH: _build_publish,
    MsgType.DELIVER: _build_deliver,
    MsgType.ACK: _build_ack,
    MsgType.ERROR: _build_error,
    MsgType.PING: _build_ping,
    MsgType.PONG: _build_pong,
    MsgType.NOTICE: _build_notice,
    MsgType.FORWARD: _build_forward,
    MsgType.LINKSTATE: _build_linkstate,
    MsgType.SHARE: _build_share,
    MsgType.RECONF: _build_reconf,
    MsgType.SYNC: _build_sync,
    MsgType.SHARES: _build_shares,
    MsgType.PASS: _build_pass,
    MsgType.LEAVES: _build_leaves,
}


# Plain-int lookup: enum construction cost a fifth of the broker's time per frame.
_DISPATCH: dict[int, tuple[str, int, _Builder]] = {
    int(t): (t.name, len(_LAYOUTS[t]) + 1, _BUILDERS[t]) for t in MsgType
}


def error_for(exc: Exception, rid: int = 0) -> Error:
    """The ERROR message that reports ``exc`` to the peer."""
    code = getattr(exc, "code", "internal")
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return Error(rid, code, message)
