"""Traffic logs (SPEC §7): one record per publication a broker handles, written off the loop.

The hot path hands ``append`` a tuple of strings and numbers, and ``append`` is a plain list's
``extend``: the record's fields join one flat list (atomic under the GIL, no lock, no
formatting, and no object kept per record: keeping a tuple per record cost the broker more
CPU than packing them). A ``pub`` names its hops by a route id, defined once per route
(:meth:`TrafficLog.define_route`). A writer thread wakes every ``flush_interval`` seconds,
swaps the list for an empty one and packs what it took with msgpack, one C call per chunk,
into frames of the version-2 format of :mod:`analytics.logfile` (layouts in
``analytics/traffic_log_schema.json``, which the job reads too), appended with one write and
a flush. Readers find the records again from their kinds and fixed layouts. A crash
therefore loses at most the records of the last interval; a write cut short leaves one torn
last frame (and perhaps a cut record), which the readers skip.

Files live in ``<dir>/<broker id>/traffic-<UTC start>.tlog``; a file is closed and a new one
started after ``rotate_seconds`` or ``rotate_bytes``, and the oldest closed files are deleted
past ``retention_bytes`` or ``retention_seconds``. Every file starts with a ``meta`` record
(the broker, its VN, replica, VN size and the overlay brokers it knows) and the routes known
when it was opened, so each file reads on its own.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import IO, Any

import msgpack

from broker.daemon.config import BrokerConfig, TrafficLogConfig, vn_of

log = logging.getLogger("trellis.traffic")

SCHEMA_FILE = "traffic_log_schema.json"
SCHEMA_PACKAGE = "analytics"
SUFFIX = ".tlog"
FRAME_ITEMS = 1 << 16  # fields per frame: bounds how long one packb holds the GIL

# The record layouts this writer emits; checked against the schema file at start.
WRITER_RECORDS: dict[str, tuple[str, ...]] = {
    "meta": ("k", "t", "b", "vn", "r", "vs", "nb"),
    "route": ("k", "route", "prev", "pc", "next", "loc", "drop"),
    "pub": ("k", "t", "p", "s", "route", "from", "n", "conf", "dig"),
    "pubx": ("k", "t", "p", "s", "prev", "pc", "from", "next", "loc", "drop", "n", "conf", "dig"),
    "copy": ("k", "t", "p", "s", "prev", "from", "dig"),
    "share": ("k", "t", "p", "s", "from", "ok", "cul", "why"),
    "link": ("k", "t", "peer"),
}

Record = tuple[Any, ...]


def load_schema() -> dict[str, Any]:
    """The traffic-log schema document shared with the analytics job."""
    text = files(SCHEMA_PACKAGE).joinpath(SCHEMA_FILE).read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    layouts = doc.get("records", {})
    for kind, fields in WRITER_RECORDS.items():
        if tuple(layouts.get(kind, ())) != fields:
            raise ValueError(
                f"traffic-log schema v{doc['version']} lays out {kind!r} as "
                f"{layouts.get(kind)}; writer has {fields}"
            )
    return doc


def log_dir(config: BrokerConfig) -> Path | None:
    """Where a broker's traffic logs go (None: logging is off)."""
    settings = config.traffic_log
    if not settings.enabled:
        return None
    if settings.dir is not None:
        return Path(settings.dir)
    if config.links_file is not None:
        return Path(config.links_file).parent / "traffic"
    return None


class _LinkDown(logging.Handler):
    """Turns the daemon's 'link a-b down' log lines into link-failure records."""

    def __init__(self, log: TrafficLog) -> None:
        super().__init__(logging.INFO)
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "link %s-%s down" and isinstance(record.args, tuple):
            self._log.append(("link", record.created, str(record.args[-1])))


class TrafficLog:
    """A broker's traffic-log writer. The hot path calls ``append`` (and, for a route not
    seen before, :meth:`define_route`); everything else runs on the writer thread."""

    def __init__(self, config: BrokerConfig, directory: Path) -> None:
        self.settings: TrafficLogConfig = config.traffic_log
        self.version = int(load_schema()["version"])
        self.broker_id = config.id
        self.directory = directory / config.id
        self.directory.mkdir(parents=True, exist_ok=True)
        self._buffer: list[Any] = []
        self.append: Callable[[Record], None] = self._buffer.extend
        # The list the writer took last time and how much of it it wrote: an append that
        # fetched the old list's method just before the swap lands there (checked next time).
        self._taken: tuple[list[Any], int] = ([], 0)
        # (source hop, *target hops) -> route id; id -> its route record. Loop thread only,
        # except that the writer copies ``route_defs`` into every new file.
        self.routes: dict[tuple[Any, ...], int] = {}
        self.route_defs: dict[int, Record] = {}
        self._old_defs: dict[int, Record] = {}  # the generation before the last reset
        self._next_route = 0
        nb = [(n.id, n.vn_id, n.replica) for n in (*config.neighbours, *config.peers)]
        self._meta = ("meta", 0.0, config.id, vn_of(config), config.replica, config.vn_size, nb)
        self._file: IO[bytes] | None = None
        self._opened = 0.0
        self._size = 0
        self.fields_written = 0
        self.files_deleted = 0
        self._stop = threading.Event()
        self._handler = _LinkDown(self)
        logging.getLogger("trellis.overlay").addHandler(self._handler)
        self._thread = threading.Thread(target=self._run, name="traffic-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- the hot path's helpers (event loop) -----------------------------------------------

    def define_route(self, key: tuple[Any, ...], source: Any, targets: Iterable[Any]) -> int:
        """A new route's id, its ``route`` record queued (routes repeat, so the hot path
        formats nothing and holds no hop objects)."""
        nxt = [str(h.peer_id) for h in targets if h.is_broker]
        loc = [str(h.peer_id) for h in targets if not h.is_broker]
        if len(self.routes) > 4096:
            # Records still queued may name the old routes: a new file gets them too.
            self.routes, self._old_defs, self.route_defs = {}, self.route_defs, {}
        route = self._next_route
        self._next_route += 1
        record: Record = ("route", route, _str(source.peer_id), not source.is_broker, nxt, loc, [])
        self.route_defs[route] = record
        self.routes[key] = route
        self.append(record)
        return route

    def dropped_pub(
        self,
        t: float,
        publisher: str,
        seq: int,
        source: Any,
        sender: object,
        targets: Mapping[Any, Any],
        dropped: list[Any],
        nbytes: int,
        conf: bool,
        digest: int | None,
    ) -> Record:
        """A ``pub`` record with its hops inline (a delivery was dropped: rare)."""
        nxt = [str(h.peer_id) for h in targets if h.is_broker]
        loc = [str(h.peer_id) for h in targets if not h.is_broker and h not in dropped]
        drop = [str(h.peer_id) for h in dropped]
        prev = _str(source.peer_id)
        pc = not source.is_broker
        return (
            "pubx",
            t,
            publisher,
            seq,
            prev,
            pc,
            _str(sender),
            nxt,
            loc,
            drop,
            nbytes,
            conf,
            digest,
        )

    # -- files (writer thread) ---------------------------------------------------------------

    def _open(self, now: float) -> IO[bytes]:
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        path = self.directory / f"traffic-{stamp}{SUFFIX}"
        handle = path.open("ab")
        routes = [*list(self._old_defs.values()), *list(self.route_defs.values())]
        head = [*self._meta[:1], now, *self._meta[2:]]
        for route in routes:
            head.extend(route)
        data = _frame(head)
        handle.write(data)
        handle.flush()
        self._file, self._opened, self._size = handle, now, len(data)
        return handle

    def _rotate_if_due(self, now: float) -> None:
        s = self.settings
        if self._file is None:
            return
        if self._size >= s.rotate_bytes or now - self._opened >= s.rotate_seconds:
            self._file.close()
            self._file, self._size = None, 0
            self._retain(now)

    def _retain(self, now: float) -> None:
        """Delete the oldest closed files past the retention limits."""
        s = self.settings
        current = Path(self._file.name) if self._file is not None else None
        closed = [
            p
            for p in sorted(self.directory.glob("traffic-*"))
            if p != current and p.suffix in (SUFFIX, ".jsonl")
        ]
        sizes = {p: p.stat().st_size for p in closed}
        total = sum(sizes.values()) + self._size
        for path in closed:
            too_old = now - path.stat().st_mtime > s.retention_seconds
            if not too_old and total <= s.retention_bytes:
                break
            total -= sizes[path]
            path.unlink(missing_ok=True)
            self.files_deleted += 1

    def _write(self, items: list[Any]) -> None:
        """Append the records whose fields are ``items`` (whole records, in order)."""
        now = time.time()
        self._rotate_if_due(now)
        if not items:
            return
        # A record may span two frames of one write; a write holds whole records only.
        chunks = range(0, len(items), FRAME_ITEMS)
        try:
            data = b"".join(_frame(items[at : at + FRAME_ITEMS]) for at in chunks)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer past 64 bits
            log.warning("traffic log: a batch of %d fields skipped: %s", len(items), exc)
            return
        handle = self._file or self._open(now)
        handle.write(data)
        handle.flush()
        self._size += len(data)
        self.fields_written += len(items)

    def flush(self) -> None:
        """Write everything appended so far (the writer thread does this every interval)."""
        taken, done = self._taken
        late = taken[done:]  # appended to the previous list during its swap: rare
        fresh: list[Any] = []
        self._buffer, batch = fresh, self._buffer
        self.append = fresh.extend
        self._taken = (batch, len(batch))
        self._write([*late, *batch] if late else batch)

    def _run(self) -> None:
        interval = self.settings.flush_interval
        while not self._stop.wait(interval):
            try:
                self.flush()
            except OSError as exc:
                log.warning("traffic log: cannot write to %s: %s", self.directory, exc)

    def close(self) -> None:
        """Write what is queued and close the file (idempotent; also run at exit)."""
        if self._stop.is_set():
            return
        self._stop.set()
        logging.getLogger("trellis.overlay").removeHandler(self._handler)
        self._thread.join(timeout=5.0)
        try:
            self.flush()
            self.flush()  # anything that landed in the last list during its swap
        except OSError as exc:
            log.warning("traffic log: cannot write to %s: %s", self.directory, exc)
        if self._file is not None:
            self._file.close()
            self._file = None
        atexit.unregister(self.close)


def _str(text: object) -> str | None:
    return None if text is None else str(text)


def _frame(items: list[Any]) -> bytes:
    """One frame of the version-2 format (see :mod:`analytics.logfile`); an object msgpack
    does not know is written as its text, so no record ever goes missing mid-stream."""
    body = msgpack.packb(items, default=str)
    return len(body).to_bytes(4, "little") + zlib.crc32(body).to_bytes(4, "little") + body


def open_traffic_log(config: BrokerConfig) -> TrafficLog | None:
    """The broker's traffic log, or None when logging is off or has nowhere to go."""
    directory = log_dir(config)
    if directory is None:
        return None
    try:
        return TrafficLog(config, directory)
    except (OSError, ValueError) as exc:
        log.error("traffic log disabled: %s", exc)
        return None
