"""The traffic-log file format, version 2 (SPEC §7): framed msgpack records.

A file is a sequence of frames; a frame is an 8-byte header (the body's length and CRC-32,
both unsigned 32-bit little-endian) and a body, a msgpack array of record fields. The fields
of all frames, in order, are the records one after the other, each its kind then the fields
of its kind's layout (the ``records`` of ``analytics/traffic_log_schema.json``, fixed
lengths), so a reader finds every record from its kind. A record may span two frames of one
write. The broker appends each batch with one write, so a crash leaves at worst one torn last
frame: a frame cut short or failing its CRC ends the file for every reader here, and so does a
record cut short or a field where a kind should be.

Brokers write this rather than JSON Lines because packing a batch is one C call (msgpack),
about a fifth of the CPU of formatting JSON in Python on the broker's hot path, and records
carry no field names and no repeated identity or routes (a ``pub`` names a ``route`` defined
once per file). Readers turn records into the flat records of the schema's ``fields``, the
same as version 1's JSON Lines (:func:`read_file`, the JSON Lines export), or into Arrow
columns for the job (:mod:`analytics.compact`).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import msgpack

HEADER = struct.Struct("<II")
SUFFIX = ".tlog"
VERSION = 2


def encode_frame(records: Sequence[Any]) -> bytes:
    """One frame holding ``records`` (each a positional record)."""
    body = msgpack.packb(records)
    return HEADER.pack(len(body), zlib.crc32(body)) + body


def frames(data: bytes) -> Iterator[bytes]:
    """The bodies of the whole frames in ``data``; stops at a torn or corrupt frame."""
    end = len(data)
    at = 0
    size = HEADER.size
    while at + size <= end:
        length, crc = HEADER.unpack_from(data, at)
        body = data[at + size : at + size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            return
        yield body
        at += size + length


WIDTHS: dict[str, int] = {
    "meta": 7,
    "route": 7,
    "pub": 9,
    "pubx": 13,
    "copy": 7,
    "sig": 7,
    "share": 8,
    "link": 3,
}
"""Fields per record of each kind, its kind included (the schema's ``records``)."""


def split_records(items: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The records in a flat sequence of fields; stops where no known kind starts one or the
    last one is cut short."""
    records: list[tuple[Any, ...]] = []
    add = records.append
    widths = WIDTHS
    at, end = 0, len(items)
    while at < end:
        try:
            width = widths[items[at]]
        except (KeyError, TypeError):
            break
        if at + width > end:
            break
        add(tuple(items[at : at + width]))
        at += width
    return records


def unpacked_fields(path: str | Path) -> list[Any]:
    """Every field of every batch of a file, in order, flat (a torn or undecodable tail
    skipped): what :func:`raw_records` splits into records."""
    items: list[Any] = []
    for body in frames(Path(path).read_bytes()):
        try:
            batch = msgpack.unpackb(body, use_list=False)
        except (ValueError, msgpack.UnpackException):
            break
        if not isinstance(batch, tuple):
            break
        items.extend(batch)
    return items


def raw_records(path: str | Path) -> list[tuple[Any, ...]]:
    """Every positional record of a file, in order (tuples; torn tail skipped)."""
    return split_records(unpacked_fields(path))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fits(value: Any, kind: str) -> bool:
    """Whether a field's value has the schema type ``kind`` (or is null)."""
    if value is None:
        return True
    if kind == "string":
        return isinstance(value, str)
    if kind in ("int", "long"):
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    if kind == "double":
        return _number(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array<string>":
        return isinstance(value, list) and all(isinstance(x, str) for x in value)
    return True  # nb: built by the reader itself


@cache
def _types() -> dict[str, str]:
    """Field name → schema type (read here: :mod:`analytics.schema` imports this module)."""
    doc = json.loads(files("analytics").joinpath("traffic_log_schema.json").read_text("utf-8"))
    return {name: kind for name, kind, _doc in doc["fields"]}


def _valid(record: dict[str, Any]) -> bool:
    types = _types()
    return all(_fits(value, types[name]) for name, value in record.items())


def _strings(items: Iterable[Any] | None) -> list[str]:
    return [str(x) for x in items or ()]


def read_file(path: str | Path) -> Iterator[dict[str, Any]]:
    """The flat records (schema ``fields``, ``v`` = 2) of one version-2 file; a record whose
    fields do not have their schema types is skipped."""
    for record in _read_file(path):
        if _valid(record):
            yield record


def _read_file(path: str | Path) -> Iterator[dict[str, Any]]:
    ident: dict[str, Any] | None = None
    routes: dict[int, tuple[Any, ...]] = {}
    for rec in raw_records(path):
        kind = rec[0]
        if not _number(rec[1]) and kind != "route":
            continue  # no time: not a record a writer made
        try:
            if kind == "meta":
                _, t, b, vn, r, vs, nb = rec
                ident = {"v": VERSION, "b": b, "vn": vn, "r": r}
                nbs = [{"id": i, "vn": v, "r": x} for i, v, x in nb or ()]
                yield {**ident, "k": "meta", "t": t, "vs": vs, "nb": nbs}
            elif ident is None:
                continue  # no identity: not a file this writer started
            elif kind == "route":
                routes[rec[1]] = rec[2:]
            elif kind == "pub":
                _, t, p, s, route, sender, n, conf, dig = rec
                prev, pc, nxt, loc, drop = routes[route]
                yield {
                    **ident,
                    "k": "pub",
                    "t": t,
                    "p": p,
                    "s": s,
                    "prev": prev,
                    "pc": pc,
                    "from": sender,
                    "next": _strings(nxt),
                    "loc": _strings(loc),
                    "drop": _strings(drop),
                    "n": n,
                    "conf": conf,
                    "dig": dig,
                }
            elif kind == "pubx":
                _, t, p, s, prev, pc, sender, nxt, loc, drop, n, conf, dig = rec
                yield {
                    **ident,
                    "k": "pub",
                    "t": t,
                    "p": p,
                    "s": s,
                    "prev": prev,
                    "pc": pc,
                    "from": sender,
                    "next": _strings(nxt),
                    "loc": _strings(loc),
                    "drop": _strings(drop),
                    "n": n,
                    "conf": conf,
                    "dig": dig,
                }
            elif kind in ("copy", "sig"):
                _, t, p, s, prev, sender, dig = rec
                yield {
                    **ident,
                    "k": kind,
                    "t": t,
                    "p": p,
                    "s": s,
                    "prev": prev,
                    "from": sender,
                    "dig": dig,
                }
            elif kind == "share":
                _, t, p, s, sender, ok, cul, why = rec
                yield {
                    **ident,
                    "k": "share",
                    "t": t,
                    "p": p,
                    "s": s,
                    "from": sender,
                    "ok": ok,
                    "cul": cul,
                    "why": why,
                }
            elif kind == "link":
                _, t, peer = rec
                yield {**ident, "k": "link", "t": t, "peer": peer}
        except (ValueError, TypeError, KeyError):
            continue  # a record this reader cannot place: skipped, like a torn line


class FileWriter:
    """Writes one version-2 file from flat records (tests, the generator; the broker has
    its own, cheaper writer in :mod:`broker.daemon.traffic_log`)."""

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.handle = self.path.open("wb")
        self.batch: list[Any] = []
        self.routes: dict[tuple[Any, ...], int] = {}
        nb = [(n["id"], n["vn"], n["r"]) for n in meta.get("nb") or ()]
        self.batch.extend(("meta", meta["t"], meta["b"], meta["vn"], meta["r"], meta.get("vs"), nb))

    def add(self, rec: dict[str, Any]) -> None:
        """Queue one flat record (its identity fields are the file's)."""
        kind = rec["k"]
        get = rec.get
        if kind == "pub":
            hops = (
                get("prev"),
                bool(get("pc")),
                tuple(get("next") or ()),
                tuple(get("loc") or ()),
                tuple(get("drop") or ()),
            )
            route = self.routes.get(hops)
            if route is None:
                route = self.routes[hops] = len(self.routes)
                self.batch.extend(("route", route, *hops))
            self.batch.extend(
                (
                    "pub",
                    rec["t"],
                    get("p"),
                    get("s"),
                    route,
                    get("from"),
                    get("n"),
                    get("conf"),
                    get("dig"),
                )
            )
        elif kind in ("copy", "sig"):
            self.batch.extend(
                (kind, rec["t"], get("p"), get("s"), get("prev"), get("from"), get("dig"))
            )
        elif kind == "share":
            self.batch.extend(
                (
                    "share",
                    rec["t"],
                    get("p"),
                    get("s"),
                    get("from"),
                    get("ok"),
                    get("cul"),
                    get("why"),
                )
            )
        elif kind == "link":
            self.batch.extend(("link", rec["t"], get("peer")))
        else:
            raise ValueError(f"unknown traffic-log record kind {kind!r}")

    def flush(self) -> None:
        """Write what is queued as one frame."""
        if self.batch:
            self.handle.write(encode_frame(self.batch))
            self.batch = []

    def tear(self) -> None:
        """Flush, then write the first bytes of one more frame (a crash mid-write)."""
        self.flush()
        self.handle.write(encode_frame(["link", 0.0, "x"])[:9])

    def close(self) -> None:
        """Flush and close."""
        self.flush()
        self.handle.close()
