"""The broker daemon's lifecycle: listen, serve until a signal, shut down in stages.

Like uvicorn's ``Server``: ``serve()`` runs startup (listening socket, admin endpoint,
ready file), the main loop (heartbeats, link dialers, reconfiguration turns) and a staged
graceful shutdown on SIGTERM or SIGINT: stop accepting, tell clients, close connections,
wait up to ``shutdown_timeout``, abort the rest. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.daemon.admin import start_admin
from broker.daemon.config import BrokerConfig
from broker.daemon.dispatch import Broker, Connection
from broker.wire.protocol import Notice

log = logging.getLogger("trellis.broker")


class Server:
    """Runs a ``Broker``: startup, serve until a signal, staged graceful shutdown."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker = Broker(config)
        self._stop = asyncio.Event()
        # Set once the broker listens (and its admin endpoint, if any): ports are known.
        self.started = asyncio.Event()
        self._signals = 0
        self.port: int | None = None
        self.admin_port: int | None = None

    def request_stop(self) -> None:
        """Begin the graceful shutdown (idempotent)."""
        self._stop.set()

    def _signalled(self) -> None:
        """SIGTERM or SIGINT: shut down gracefully; a second signal exits at once."""
        self._signals += 1
        if self._signals > 1:
            log.warning("second stop signal: exiting now")
            os._exit(1)
        self.request_stop()

    async def serve(self) -> None:
        """Start, serve until :meth:`request_stop` (or a signal), then shut down."""
        loop = asyncio.get_running_loop()
        handled = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._signalled)
                handled.append(sig)
        try:
            await self._serve(loop)
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        factory: Callable[[], asyncio.Protocol] = lambda: Connection(self.broker)  # noqa: E731
        tls = self.broker.tls
        if tls is not None:
            factory = tls.acceptor(factory)
        server = await loop.create_server(
            factory, self.config.host, self.config.port, reuse_address=True
        )
        self.port = server.sockets[0].getsockname()[1]
        admin = None
        if self.config.admin_port is not None:
            admin = await start_admin(self.broker, self.config.host, self.config.admin_port)
            self.admin_port = admin.sockets[0].getsockname()[1]
        log.info(
            "broker %s listening on %s:%d%s",
            self.config.id,
            self.config.host,
            self.port,
            " (TLS)" if tls is not None else "",
        )
        if self.config.vn_size == 1:
            # A plain broker is the common case, not an alarm: say what it means, once.
            log.info(
                "broker %s is a plain broker (VN %s of one replica): no Byzantine replica is "
                "tolerated and it can read the keys of confidential publications it routes",
                self.config.id,
                self.broker.vn,
            )
        elif self.config.vn_size < 3:
            log.warning(
                "VN %s has %d replicas: it tolerates no Byzantine replica, and its brokers can "
                "read the keys of confidential publications routed through it",
                self.broker.vn,
                self.config.vn_size,
            )
        if self.config.reconfig.enabled:
            # Before dialling: a round may have moved this VN's links while it was down.
            reconfig = self.config.reconfig
            await self.broker.reconfig.adopt_siblings_links(
                reconfig.step_timeout, reconfig.lock_lease
            )
        self._write_ready_file()
        self.started.set()
        async with asyncio.TaskGroup() as tg:
            background = [
                tg.create_task(self.broker.heartbeat()),
                tg.create_task(self.broker.watch_copies()),
                tg.create_task(self.broker.reconfig.run()),
                tg.create_task(self.broker.reconfig.repair_loop()),
            ]
            for neighbour in list(self.broker.neighbours.values()):
                self.broker.start_dialer(neighbour)
            await self._stop.wait()
            log.info("broker %s shutting down", self.config.id)
            server.close()
            if tls is not None:
                tls.close()
            for task in background:
                task.cancel()
            for peer_id in list(self.broker.dialers):
                self.broker.stop_dialer(peer_id)
            self.broker.sessions.close()  # no client comes back to a stopped broker
            await self._close_connections()
        if admin is not None:
            admin.close()
        await server.wait_closed()
        log.info("broker %s stopped", self.config.id)

    async def _close_connections(self) -> None:
        conns = list(self.broker.connections)
        for conn in conns:
            if not conn.is_broker:
                conn.send(Notice("shutdown", {"broker": self.config.id}))
        self.broker.flush()
        for conn in conns:
            conn.close()
        if conns:
            await asyncio.wait([c.closed for c in conns], timeout=self.config.shutdown_timeout)
        for conn in list(self.broker.connections):
            if conn.transport is not None:
                conn.transport.abort()

    def _write_ready_file(self) -> None:
        path = self.config.ready_file
        if path is None:
            return
        tmp = Path(f"{path}.tmp")
        info: dict[str, Any] = {
            "host": self.config.host,
            "port": self.port,
            "admin_port": self.admin_port or 0,
            "pid": os.getpid(),
        }
        tmp.write_text(" ".join(f"{k}={v}" for k, v in info.items()) + "\n", encoding="utf-8")
        tmp.replace(path)


GC_THRESHOLD = (50_000, 10, 10)
"""The cyclic collector's thresholds in a broker process (CPython's default: 700, 10, 10)."""


def tune_gc() -> None:
    """Collect less often in a broker process, and never again over what startup built.

    A broker keeps tens of thousands of long-lived objects (held key shares, verified
    certificates, epochs it served) and allocates a few hundred per confidential
    publication. At CPython's default thresholds the collector ran every 700 allocations
    and re-scanned the whole heap every few hundred publications: about 6.5 % of the CPU
    of a middle or last-VN replica in a confidential stream, 3.3 % with these settings
    (process CPU time inside the collector, bench/RESULTS.md, 2026-11-26 evening); the
    longest pauses are no longer full collections. Reference counting still frees
    everything not in a cycle at once.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def raise_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, as servers do: every
    connection is a descriptor, and the usual soft limit (1,024) is reached by a thousand
    clients, after which connections are refused. Returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
    return soft


def run(config: BrokerConfig) -> None:
    """Run a broker until SIGTERM/SIGINT, on uvloop when it is installed."""
    tune_gc()
    log.info("open-file limit: %d (each client or broker connection takes one)", raise_file_limit())
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(Server(config).serve())
