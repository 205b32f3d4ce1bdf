"""Traffic logs (SPEC §7): one record per publication a broker handles, written off the loop.

The hot path only appends a tuple of references to a :class:`collections.deque` (atomic,
no lock, no formatting). A writer thread wakes every ``flush_interval`` seconds, takes
everything queued, formats it as JSON Lines in the layout of the versioned schema in
``analytics/traffic_log_schema.json`` (the job reads the same file), and appends it to the
current file with one write and a flush. A crash therefore loses at most the records of
the last interval; a write cut short leaves one torn last line, which the readers skip.

Files live in ``<dir>/<broker id>/traffic-<UTC start>.jsonl``; a file is closed and a new
one started after ``rotate_seconds`` or ``rotate_bytes``, and the oldest closed files are
deleted past ``retention_bytes`` or ``retention_seconds``. Every file starts with a
``meta`` record: the broker, its VN, replica, VN size and the overlay brokers it knows.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import IO, Any

from broker.daemon.config import BrokerConfig, TrafficLogConfig, vn_of

log = logging.getLogger("trellis.traffic")

SCHEMA_FILE = "traffic_log_schema.json"
SCHEMA_PACKAGE = "analytics"

# The fields this writer emits, in order; checked against the schema file at start.
WRITER_FIELDS = (
    "v",
    "k",
    "t",
    "b",
    "vn",
    "r",
    "p",
    "s",
    "prev",
    "pc",
    "from",
    "next",
    "loc",
    "drop",
    "n",
    "conf",
    "dig",
    "ok",
    "cul",
    "why",
    "peer",
    "vs",
    "nb",
)

Record = tuple[Any, ...]


def load_schema() -> dict[str, Any]:
    """The traffic-log schema document shared with the analytics job."""
    text = files(SCHEMA_PACKAGE).joinpath(SCHEMA_FILE).read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    names = tuple(name for name, _type, _doc in doc["fields"])
    if names != WRITER_FIELDS:
        raise ValueError(
            f"traffic-log schema v{doc['version']} lists {names}; writer has {WRITER_FIELDS}"
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

    def __init__(self, append: Callable[[Record], None]) -> None:
        super().__init__(logging.INFO)
        self._append = append

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "link %s-%s down" and isinstance(record.args, tuple):
            self._append(("link", record.created, str(record.args[-1])))


class TrafficLog:
    """A broker's traffic-log writer. ``append`` is the only method the hot path calls."""

    def __init__(self, config: BrokerConfig, directory: Path) -> None:
        self.settings: TrafficLogConfig = config.traffic_log
        self.version = int(load_schema()["version"])
        self.broker_id = config.id
        self.directory = directory / config.id
        self.directory.mkdir(parents=True, exist_ok=True)
        self._queue: deque[Record] = deque()
        self.append: Callable[[Record], None] = self._queue.append
        self._cache: dict[str, str] = {}
        # (source, sender, *targets) -> the hops part of a pub line; loop thread only.
        self.hops: dict[tuple[Any, ...], str] = {}
        q = self._q
        self._ident = (
            f'"v":{self.version},"b":{q(config.id)},"vn":{q(vn_of(config))},"r":{config.replica}'
        )
        nb = [
            {"id": n.id, "vn": n.vn_id, "r": n.replica} for n in (*config.neighbours, *config.peers)
        ]
        self._meta = (
            f'{{{self._ident},"k":"meta","t":%.6f,"vs":{config.vn_size},'
            f'"nb":{json.dumps(nb, separators=(",", ":"))}}}\n'
        )
        self._file: IO[str] | None = None
        self._opened = 0.0
        self._size = 0
        self.records_written = 0
        self.files_deleted = 0
        self._stop = threading.Event()
        self._handler = _LinkDown(self.append)
        logging.getLogger("trellis.overlay").addHandler(self._handler)
        self._thread = threading.Thread(target=self._run, name="traffic-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- formatting (writer thread) --------------------------------------------------------

    def _q(self, text: object) -> str:
        if text is None:
            return "null"
        s = str(text)
        quoted = self._cache.get(s)
        if quoted is None:
            if len(self._cache) > 65536:
                self._cache.clear()
            quoted = self._cache[s] = json.dumps(s)
        return quoted

    def hops_fragment(
        self,
        key: tuple[Any, ...] | None,
        source: Any,
        sender: object,
        targets: Iterable[Any],
        dropped: list[Any] | None,
    ) -> str:
        """The hops part of a ``pub`` line (called on the loop, cached in ``hops`` by
        ``key``: routes repeat, so the hot path formats nothing and holds no hop objects)."""

        def q(text: object) -> str:
            return "null" if text is None else json.dumps(str(text))

        nxt = []
        loc = []
        for hop in targets:
            if hop.is_broker:
                nxt.append(q(hop.peer_id))
            elif not dropped or hop not in dropped:
                loc.append(q(hop.peer_id))
        drop = ",".join(q(h.peer_id) for h in dropped) if dropped else ""
        text = (
            f'"prev":{q(source.peer_id)},"pc":{"false" if source.is_broker else "true"},'
            f'"from":{q(sender)},"next":[{",".join(nxt)}],"loc":[{",".join(loc)}],'
            f'"drop":[{drop}]'
        )
        if key is not None:
            if len(self.hops) > 4096:
                self.hops.clear()
            self.hops[key] = text
        return text

    def _format(self, rec: Record) -> str:
        kind = rec[0]
        q = self._q
        if kind == "pub":
            _, t, publisher, seq, hops, nbytes, conf, dig = rec
            return (
                f'{{{self._ident},"k":"pub","t":{t:.6f},"p":{q(publisher)},"s":{seq},{hops},'
                f'"n":{nbytes},"conf":{"true" if conf else "false"},'
                f'"dig":{"null" if dig is None else dig}}}\n'
            )
        if kind in ("copy", "sig"):
            _, t, publisher, seq, prev, sender, dig = rec
            return (
                f'{{{self._ident},"k":"{kind}","t":{t:.6f},"p":{q(publisher)},"s":{seq},'
                f'"prev":{q(prev)},"from":{q(sender)},'
                f'"dig":{"null" if dig is None else dig}}}\n'
            )
        if kind == "share":
            _, t, publisher, epoch, sender, ok, culprit, why = rec
            return (
                f'{{{self._ident},"k":"share","t":{t:.6f},"p":{q(publisher)},"s":{epoch},'
                f'"from":{q(sender)},"ok":{"true" if ok else "false"},"cul":{q(culprit)},'
                f'"why":{q(why)}}}\n'
            )
        if kind == "link":
            _, t, peer = rec
            return f'{{{self._ident},"k":"link","t":{t:.6f},"peer":{q(peer)}}}\n'
        raise ValueError(f"unknown traffic-log record kind {kind!r}")

    # -- files (writer thread) ---------------------------------------------------------------

    def _open(self, now: float) -> IO[str]:
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        path = self.directory / f"traffic-{stamp}.jsonl"
        handle = path.open("a", encoding="utf-8", buffering=1 << 20)
        meta = self._meta % now
        handle.write(meta)
        handle.flush()
        self._file, self._opened, self._size = handle, now, len(meta)
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
        closed = [p for p in sorted(self.directory.glob("traffic-*.jsonl")) if p != current]
        sizes = {p: p.stat().st_size for p in closed}
        total = sum(sizes.values()) + self._size
        for path in closed:
            too_old = now - path.stat().st_mtime > s.retention_seconds
            if not too_old and total <= s.retention_bytes:
                break
            total -= sizes[path]
            path.unlink(missing_ok=True)
            self.files_deleted += 1

    def _write(self, records: Iterable[Record]) -> None:
        now = time.time()
        self._rotate_if_due(now)
        lines = []
        for rec in records:
            try:
                lines.append(self._format(rec))
            except (ValueError, TypeError, AttributeError) as exc:
                log.warning("traffic log: record skipped: %s", exc)
        if not lines:
            return
        handle = self._file or self._open(now)
        data = "".join(lines)
        handle.write(data)
        handle.flush()
        self._size += len(data)
        self.records_written += len(lines)

    def flush(self) -> None:
        """Write everything queued so far (the writer thread does this every interval)."""
        queue = self._queue
        batch = [queue.popleft() for _ in range(len(queue))]
        if batch:
            self._write(batch)
        else:
            self._rotate_if_due(time.time())

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
        except OSError as exc:
            log.warning("traffic log: cannot write to %s: %s", self.directory, exc)
        if self._file is not None:
            self._file.close()
            self._file = None
        atexit.unregister(self.close)


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
