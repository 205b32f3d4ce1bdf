"""The traffic-log file format, version 2 (SPEC §7): framed msgpack records.

A file is a sequence of frames; a frame is an 8-byte header (the body's length and CRC-32,
both unsigned 32-bit little-endian) and a body, a msgpack array of records. Records are
positional msgpack arrays whose first element is the kind; their layouts are the ``records``
of ``analytics/traffic_log_schema.json``. The broker appends one frame per batch with one
write, so a crash leaves at worst one torn last frame: a frame cut short or failing its CRC
ends the file for every reader here.

Brokers write this rather than JSON Lines because packing a batch is one C call (msgpack),
about a fifth of the CPU of formatting JSON in Python on the broker's hot path, and records
carry no field names and no repeated identity or routes (a ``pub`` names a ``route`` defined
once per file). Readers turn records into the flat records of the schema's ``fields``, the
same as version 1's JSON Lines (:func:`read_file`, the JSON Lines export), or into Arrow
columns for the job (:mod:`analytics.compact`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
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


def raw_records(path: str | Path) -> list[Any]:
    """Every positional record of a file, in order (tuples; torn tail skipped)."""
    data = Path(path).read_bytes()
    records: list[Any] = []
    for body in frames(data):
        try:
            batch = msgpack.unpackb(body, use_list=False)
        except (ValueError, msgpack.UnpackException):
            break
        if isinstance(batch, tuple):
            records.extend(batch)
    return records


def _strings(items: Iterable[Any] | None) -> list[str]:
    return [str(x) for x in items or ()]


def read_file(path: str | Path) -> Iterator[dict[str, Any]]:
    """The flat records (schema ``fields``, ``v`` = 2) of one version-2 file."""
    ident: dict[str, Any] | None = None
    routes: dict[int, tuple[Any, ...]] = {}
    for rec in raw_records(path):
        if not isinstance(rec, tuple) or not rec:
            continue
        kind = rec[0]
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
        self.batch: list[tuple[Any, ...]] = []
        self.routes: dict[tuple[Any, ...], int] = {}
        nb = [(n["id"], n["vn"], n["r"]) for n in meta.get("nb") or ()]
        self.batch.append(("meta", meta["t"], meta["b"], meta["vn"], meta["r"], meta.get("vs"), nb))

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
                self.batch.append(("route", route, *hops))
            self.batch.append(
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
            self.batch.append(
                (kind, rec["t"], get("p"), get("s"), get("prev"), get("from"), get("dig"))
            )
        elif kind == "share":
            self.batch.append(
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
            self.batch.append(("link", rec["t"], get("peer")))
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
        self.handle.write(encode_frame([("link", 0.0, "x")])[:9])

    def close(self) -> None:
        """Flush and close."""
        self.flush()
        self.handle.close()
