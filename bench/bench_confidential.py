"""Confidential vs plain publication over 3 VN hops with r = 3 (SPEC §10).

A line of three virtual nodes b0 - b1 - b2, three replicas each (9 broker processes). The
publisher is a client of b0, the subscriber a client of b2, 1 -> 1, 100-byte payloads. The
modes run on the same overlay, in the same run, in alternating order: plain, confidential
(the default: a fresh key per publication) and, for context, confidential with a key epoch
of 100 publications (``key_refresh=100``):

* latency: one publication at a time, the next sent once the previous was delivered;
  measured from just before ``publish()`` to the return of ``sub.get()`` (the payload carries
  the send time; CLOCK_MONOTONIC is system-wide, so the two processes compare times);
* throughput: ``ack=False`` publications for a fixed time with at most ``--window`` of them
  undelivered (the subscriber reports each delivery on a pipe), delivered count /
  (last delivery - first publish); the window keeps the backlog, and so the bench, bounded;
* CPU: utime + stime of every broker process (``/proc/<pid>/stat``) over the stream, per
  delivered message, and the same for the publisher and subscriber processes;
* bytes: ``wchar`` of every broker (``/proc/<pid>/io``: it counts socket writes) over the
  stream minus the growth of its log file, per publication and per broker-written hop,
  next to the sizes of the frames the protocol sends, computed with the real encoders.

Publisher and subscriber are separate processes (this script with ``--role``), so the
subscriber's key reconstruction and the publisher's sealing do not share one event loop.
Not a test:

    .venv/bin/python bench/bench_confidential.py [--quick] [--share-form pass]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client import Client
from broker.errors import SlowConsumerError, TrellisTimeout
from broker.tools.local import LocalOverlay, start_overlay
from overlay.tree import broker_names, line_tree

PAYLOAD_SIZE = 100
REPLICAS = 3
VNS = 3
FILTER = "class = 'bench'"
PUB_ID = "bench-pub"
STAMP = struct.Struct("<dI")  # send time (CLOCK_MONOTONIC), sequence marker
# The SPEC row compares the default (key_refresh = 1: a fresh key per publication) with plain;
# a key epoch of EPOCH publications is measured alongside, to show what epochs buy.
EPOCH = 100
EPOCH_MODE = f"conf-epoch{EPOCH}"
MODES = ("plain", "confidential", EPOCH_MODE)
R1_MODE = "plain-r1"  # plain on the same line with unreplicated brokers
CLK_TCK = os.sysconf("SC_CLK_TCK")
COMMAND_TIMEOUT = 90.0
SCRIPT = str(Path(__file__).resolve())


def payload(seq: int) -> bytes:
    head = STAMP.pack(time.monotonic(), seq)
    return head + b"x" * (PAYLOAD_SIZE - len(head))


def proc_cpu(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_wchar(pid: int | str) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError(f"no wchar for {pid}")


def new_loop_policy() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# ------------------------------------------------------------------------------------------
# Child processes: publisher and subscriber, driven by JSON lines on stdin/stdout.


async def stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Pacer:
    """The subscriber's delivery reports: markers (4 bytes each) on a pipe, in delivery order."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.last = 0
        self._rest = b""

    async def until(self, marker: int, timeout: float) -> bool:
        """Wait until ``marker`` (or a later one) was reported delivered."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.last < marker:
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                chunk = await asyncio.wait_for(self.reader.read(65536), left)
            except TimeoutError:
                return False
            if not chunk:
                raise RuntimeError("the subscriber closed its delivery reports")
            data = self._rest + chunk
            whole = len(data) - len(data) % 4
            self._rest = data[whole:]
            if whole:
                self.last = max(self.last, *struct.unpack(f"<{whole // 4}I", data[:whole]))
        return True


async def run_publisher(endpoints: list[str], pace_fd: int, share_form: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(pace_fd, "rb", 0)
    )
    pacer = Pacer(reader)
    commands = await stdin_lines()
    async with (
        Client(endpoints, client_id=PUB_ID, share_form=share_form) as pub,
        Client(
            endpoints, client_id=PUB_ID + "-e", key_refresh=EPOCH, share_form=share_form
        ) as pub_epoch,
    ):
        await pub.advertise(FILTER)
        await pub_epoch.advertise(FILTER)
        reply({"ready": True})
        marker = 0  # unique and increasing over both clients: what the subscriber reports
        while line := await commands.readline():
            cmd = json.loads(line)
            op = cmd["op"]
            mode = cmd.get("mode", "plain")
            client = pub_epoch if mode == EPOCH_MODE else pub
            conf = mode != "plain"
            attrs = {"class": "bench", "phase": op, "tag": cmd.get("tag", "")}
            if op == "warm":
                ok = False
                deadline = loop.time() + cmd["seconds"]
                while not ok and loop.time() < deadline:
                    marker += 1
                    await client.publish(attrs, payload(marker), confidential=conf)
                    ok = await pacer.until(marker, 0.3)
                reply({"ok": ok})
            elif op == "ping":
                lost = 0
                for _ in range(cmd["n"]):
                    marker += 1
                    await client.publish(attrs, payload(marker), ack=False, confidential=conf)
                    if not await pacer.until(marker, 5.0):
                        lost += 1
                        if lost > 5:
                            break
                reply({"lost": lost})
            elif op == "stream":
                # Publish for ``seconds`` with at most ``window`` publications undelivered:
                # saturates the pipeline while bounding the backlog left to drain.
                w0 = proc_wchar("self")
                t0 = time.monotonic()
                end = t0 + cmd["seconds"]
                first = marker + 1
                stalled = False
                while time.monotonic() < end:
                    if marker - pacer.last >= cmd["window"]:
                        if not await pacer.until(marker - cmd["window"] + 1, 10.0):
                            stalled = True
                            break
                        continue
                    marker += 1
                    await client.publish(attrs, payload(marker), ack=False, confidential=conf)
                await client.drain(30)
                reply(
                    {
                        "sent": marker - first + 1,
                        "t0": t0,
                        "t_pub": time.monotonic() - t0,
                        "wchar": proc_wchar("self") - w0,
                        "stalled": stalled,
                    }
                )
            elif op == "quit":
                break


async def run_subscriber(endpoints: list[str], manifest: str, pace_fd: int, queue: int) -> None:
    commands = await stdin_lines()
    ping_lat: dict[str, list[float]] = {}
    streams: dict[str, dict[str, float]] = {}
    stream_lat: dict[str, list[float]] = {}  # send to delivery, in a stream (window-bound)
    warnings: list[str] = []
    async with (
        Client(endpoints, client_id="bench-sub", manifest=manifest, queue_size=queue) as sc,
        sc.subscribe(FILTER) as sub,
    ):
        reply({"ready": True})

        async def receive() -> None:
            while True:
                try:
                    msg = await sub.get()
                except SlowConsumerError as exc:
                    warnings.append(str(exc))
                    continue
                now = time.monotonic()
                sent, marker = STAMP.unpack_from(msg.payload)
                phase, tag = msg.attrs.get("phase"), str(msg.attrs.get("tag"))
                if phase == "stream":
                    st = streams.setdefault(tag, {"got": 0, "t_first": now, "t_last": now})
                    st["got"] += 1
                    st["t_last"] = now
                    stream_lat.setdefault(tag, []).append(now - sent)
                elif phase == "ping":
                    ping_lat.setdefault(tag, []).append(now - sent)
                os.write(pace_fd, struct.pack("<I", marker))

        task = asyncio.create_task(receive())
        try:
            while line := await commands.readline():
                cmd = json.loads(line)
                op = cmd["op"]
                if op == "pings":
                    reply({"lat": ping_lat.pop(cmd["tag"], [])})
                elif op == "stream_wait":
                    # Until every sent publication arrived, or nothing new for idle seconds.
                    tag = cmd["tag"]
                    deadline = time.monotonic() + cmd["max_seconds"]
                    last, since = -1, time.monotonic()
                    while time.monotonic() < deadline:
                        got = streams.get(tag, {}).get("got", 0)
                        if got >= cmd["expect"]:
                            break
                        if got != last:
                            last, since = got, time.monotonic()
                        elif time.monotonic() - since > cmd["idle"]:
                            break
                        await asyncio.sleep(0.01)
                    stream = streams.pop(tag, {"got": 0, "t_first": 0.0, "t_last": 0.0})
                    lats = stream_lat.pop(tag, [])
                    reply(
                        {
                            **stream,
                            "lat_median": statistics.median(lats) if lats else float("nan"),
                            "dropped": sub.dropped,
                            "warnings": warnings[-3:],
                        }
                    )
                elif op == "quit":
                    break
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# ------------------------------------------------------------------------------------------
# Orchestrator


class Child:
    """A publisher or subscriber process speaking JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name

    @classmethod
    async def start(cls, name: str, args: list[str], pass_fd: int) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            SCRIPT,
            "--role",
            name,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            pass_fds=(pass_fd,),
        )
        child = cls(proc, name)
        await child.read(30)
        return child

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def read(self, timeout: float = COMMAND_TIMEOUT) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"{self.name} process exited ({await self.proc.wait()})")
        return json.loads(line)

    async def ask(self, timeout: float = COMMAND_TIMEOUT, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await self.read(timeout)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "quit"}\n')
                await asyncio.wait_for(self.proc.stdin.drain(), 2)
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class Meter:
    """CPU seconds and socket bytes written by the brokers (and CPU of the clients)."""

    def __init__(self, overlay: LocalOverlay, clients: dict[str, int]) -> None:
        self.overlay = overlay
        self.pids = {b: p.pid for b, p in overlay.brokers.items()}
        self.clients = clients

    def snapshot(self) -> dict[str, Any]:
        logs = {b: p.log_path.stat().st_size for b, p in self.overlay.brokers.items()}
        return {
            "cpu": {b: proc_cpu(pid) for b, pid in self.pids.items()},
            "wchar": {b: proc_wchar(pid) for b, pid in self.pids.items()},
            "log": logs,
            "clients": {name: proc_cpu(pid) for name, pid in self.clients.items()},
            "t": time.monotonic(),
        }

    @staticmethod
    def delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        cpu = {k: b["cpu"][k] - a["cpu"][k] for k in a["cpu"]}
        written = {k: b["wchar"][k] - a["wchar"][k] for k in a["wchar"]}
        logged = {k: b["log"][k] - a["log"][k] for k in a["log"]}
        return {
            "cpu": cpu,
            "bytes": {k: written[k] - logged[k] for k in written},
            "logged": sum(logged.values()),
            "clients": {k: b["clients"][k] - a["clients"][k] for k in a["clients"]},
            "wall": b["t"] - a["t"],
        }


PROFILED = ("b0.0", "b1.0", "b2.0", "pub", "sub")


async def start_profilers(pids: dict[str, int], outdir: Path) -> list[asyncio.subprocess.Process]:
    """``py-spy record`` (raw collapsed stacks, non-blocking) on one replica per VN and on
    both clients; stopped with SIGINT, which makes py-spy write its file."""
    spy = Path(sys.executable).with_name("py-spy")  # (main checks it is there)
    await asyncio.to_thread(outdir.mkdir, parents=True, exist_ok=True)
    procs = []
    for name in PROFILED:
        procs.append(
            await asyncio.create_subprocess_exec(
                str(spy),
                "record",
                "--nonblocking",
                "--format",
                "raw",
                "--rate",
                "200",
                "--pid",
                str(pids[name]),
                "--output",
                str(outdir / f"{name}.txt"),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
        )
    await asyncio.sleep(1.0)  # py-spy attaches
    return procs


async def stop_profilers(procs: list[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def summarize_profile(path: Path, top: int = 12) -> list[str]:
    """Self and inclusive sample shares of the hottest functions in a raw py-spy file."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            incl[frame] = incl.get(frame, 0) + n
    if not total:
        return ["  (no samples)"]
    lines = [f"  {total} samples; self time:"]
    for frame, n in sorted(own.items(), key=lambda x: -x[1])[:top]:
        lines.append(f"    {100 * n / total:5.1f}%  {frame}")
    lines.append("  inclusive:")
    for frame, n in sorted(incl.items(), key=lambda x: -x[1])[: top + 6]:
        lines.append(f"    {100 * n / total:5.1f}%  {frame}")
    return lines


async def measure_mode(
    mode: str,
    pub: Child,
    sub: Child,
    meter: Meter,
    pings: int,
    window: int,
    seconds: float,
    tag: str,
    profile: Path | None = None,
) -> dict[str, Any]:
    # Latency, one at a time; and the CPU all processes spend on it (one publication per
    # event-loop pass everywhere: nothing amortises, the steadier figure on a shared machine).
    ping0 = meter.snapshot()
    got = await pub.ask(op="ping", n=pings, mode=mode, tag=tag)
    lat = sorted((await sub.ask(op="pings", tag=tag))["lat"])
    ping_cpu = Meter.delta(ping0, meter.snapshot())
    ping_n = max(len(lat), 1)
    # Throughput and costs over a bounded stream.
    await asyncio.sleep(0.3)
    spies = []
    if profile is not None:
        spies = await start_profilers({**meter.pids, **meter.clients}, profile)
    before = meter.snapshot()
    try:
        sent = await pub.ask(op="stream", mode=mode, tag=tag, seconds=seconds, window=window)
        recv = await sub.ask(
            op="stream_wait", tag=tag, expect=sent["sent"], max_seconds=60, idle=10.0
        )
        await asyncio.sleep(0.5)  # late key shares are still work the brokers do
        d = Meter.delta(before, meter.snapshot())
    finally:
        await stop_profilers(spies)
    delivered = recv["got"]
    elapsed = recv["t_last"] - sent["t0"] if delivered else float("nan")
    per = max(delivered, 1)
    return {
        "lat_median_us": statistics.median(lat) * 1e6 if lat else float("nan"),
        "lat_p99_us": lat[max(0, int(len(lat) * 0.99) - 1)] * 1e6 if lat else float("nan"),
        "lat_samples": len(lat),
        "ping_cpu_us": (sum(ping_cpu["cpu"].values()) + sum(ping_cpu["clients"].values()))
        / ping_n
        * 1e6,
        "ping_vn_cpu_us": {
            vn: sum(v for b, v in ping_cpu["cpu"].items() if b.startswith(vn + ".")) / ping_n * 1e6
            for vn in broker_names(VNS)
        },
        "lat_lost": got["lost"],
        "sent": sent["sent"],
        "delivered": delivered,
        "dropped": recv["dropped"],
        "msg_per_s": delivered / elapsed if delivered else 0.0,
        "stream_lat_ms": recv["lat_median"] * 1e3,
        "pub_msg_per_s": sent["sent"] / sent["t_pub"],
        "broker_cpu_us": sum(d["cpu"].values()) / per * 1e6,
        "vn_cpu_us": {
            vn: sum(v for b, v in d["cpu"].items() if b.startswith(vn + ".")) / per * 1e6
            for vn in broker_names(VNS)
        },
        "pub_cpu_us": d["clients"]["pub"] / per * 1e6,
        "sub_cpu_us": d["clients"]["sub"] / per * 1e6,
        "broker_bytes": sum(d["bytes"].values()) / sent["sent"],
        "vn_bytes": {
            vn: sum(v for b, v in d["bytes"].items() if b.startswith(vn + ".")) / sent["sent"]
            for vn in broker_names(VNS)
        },
        "pub_bytes": sent["wchar"] / sent["sent"],
        "logged": d["logged"],
        "wall": d["wall"],
        "cpu_busy": (sum(d["cpu"].values()) + sum(d["clients"].values())) / d["wall"],
        "warnings": recv["warnings"],
    }


def analytic_bytes() -> dict[str, dict[str, float]]:
    """Bytes per publication on every hop, from the frames the protocol sends (real encoders,
    real seals, splits and certificates), for r = 3 at every VN."""
    from broker.wire.protocol import Publish, Share, encode, encode_deliver, encode_forward
    from security.envelope import Signer
    from security.propagation import pack_record, resplit, threshold_for
    from security.publication import EpochKey

    seq, body = 1000, b"x" * PAYLOAD_SIZE
    attrs = {"class": "bench", "phase": "stream", "tag": "r0m0"}
    names = broker_names(VNS)
    signers = {vn: [Signer.generate(f"{vn}.{i}") for i in range(REPLICAS)] for vn in names}
    k = threshold_for(REPLICAS)
    out: dict[str, dict[str, float]] = {}
    plain_pub = len(encode(Publish(0, seq, attrs, body)))
    plain_fwd = len(encode_forward(PUB_ID, seq, attrs, body, None))
    plain_del = len(encode_deliver(["s1"], PUB_ID, seq, attrs, body, None))
    out["plain"] = {
        "pub>b0": REPLICAS * plain_pub,
        "b0>b1": REPLICAS * REPLICAS * plain_fwd,
        "b1>b2": REPLICAS * REPLICAS * plain_fwd,
        "b2>sub": REPLICAS * plain_del,
        "content_frame": plain_fwd,
    }
    signer = Signer.generate(PUB_ID)
    epoch = EpochKey.start(signer, seq, names[0], REPLICAS)  # key_refresh = 1: one per message
    sealed, sec = epoch.seal(signer, seq, attrs, body)
    level1 = epoch.records
    conf_pub = sum(
        len(encode(Publish(0, seq, attrs, sealed, sec.with_share(pack_record(rec)))))
        for rec in level1
    )
    fwd = len(encode_forward(PUB_ID, seq, attrs, sealed, sec))
    dlv = len(encode_deliver(["s1"], PUB_ID, seq, attrs, sealed, sec))
    # Replica i of b0 re-splits its share for the 3 replicas of b1; each b1 replica then
    # holds 3 shares (one per b0 replica) and re-splits each for b2: 9 per b1 replica.
    level2 = [
        s for i, rec in enumerate(level1) for s in resplit(rec, k, REPLICAS, signers["b0"][i])
    ]
    level3 = [
        s for rec in level2 for s in resplit(rec, k, REPLICAS, signers["b1"][rec.lineage[-1]])
    ]

    def share_frame(rec: Any) -> int:
        return len(encode(Share(PUB_ID, seq, pack_record(rec))))

    out["confidential"] = {
        "pub>b0": conf_pub,
        "b0>b1": REPLICAS * REPLICAS * fwd + sum(map(share_frame, level2)),
        "b1>b2": REPLICAS * REPLICAS * fwd + sum(map(share_frame, level3)),
        "b2>sub": REPLICAS * dlv + sum(map(share_frame, level3)),
        "content_frame": fwd,
        "shares_b0>b1": len(level2),
        "shares_b1>b2": len(level3),
        "shares_b2>sub": len(level3),
        "share_frame_l2": share_frame(level2[0]),
        "share_frame_l3": share_frame(level3[0]),
        "sec_overhead": fwd - plain_fwd,
    }
    c = out["confidential"]
    share_bytes = {
        "pub>b0": conf_pub - REPLICAS * len(encode(Publish(0, seq, attrs, sealed, sec))),
        "b0>b1": c["b0>b1"] - REPLICAS * REPLICAS * fwd,
        "b1>b2": c["b1>b2"] - REPLICAS * REPLICAS * fwd,
        "b2>sub": c["b2>sub"] - REPLICAS * dlv,
    }
    out[EPOCH_MODE] = {hop: c[hop] - share_bytes[hop] * (1 - 1 / EPOCH) for hop in share_bytes}
    for mode in out.values():
        mode["brokers_total"] = mode["b0>b1"] + mode["b1>b2"] + mode["b2>sub"]
    return out


def crypto_costs(samples: int = 300) -> dict[str, float]:
    """Median µs of one Ed25519 sign and verify here and now (what the protocol's signatures
    cost on this machine, to set against the measured CPU per publication)."""
    from security.envelope import Signer

    signer = Signer.generate("x")
    public = signer.public_key
    data = b"d" * 200
    sig = signer.sign(data)

    def timed(fn: Any) -> float:
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e6

    return {
        "sign": timed(lambda: signer.sign(data)),
        "verify": timed(lambda: public.verify(sig, data)),
    }


# Ed25519 operations per confidential publication, r = 3 on b0-b1-b2, a fresh key per
# publication, one publication in flight (the latency case; read from broker/client.py,
# broker/daemon/shares.py and security/ on 2026-11-23, after batching). Signs: publisher 2
# (content, root split); each broker signs once per event-loop pass that split something: b0 3,
# b1 3 to 9 (its three shares arrive in one to three passes). Verifies: the edge's publisher
# signature 3 and root seal 3; each broker verifies only its sender's batch root (b1 3 x 3,
# b2 3 x 3 to 9); the subscriber's audit 1 + 3 + 3 to 9. With many publications in flight a
# pass covers many publications and every per-pass figure is divided among them.
# Before (2026-11-22): 14 signs, 76 verifies per publication, whatever the load.
ED25519_OPS = {"sign": 14, "verify": 9 + 54 + 13}


def pipeline_breakdown(pubs: int = 60, per_pass: int = 20) -> dict[str, dict[str, float]]:
    """Where share work goes, in one process: µs per publication by kind of work, for the
    whole r = 3, 3-VN pipeline (publisher split, three relaying VNs, subscriber assembly),
    one publication per event-loop pass (latency case) and ``per_pass`` per pass (stream).

    Every broker's and the subscriber's work runs here in turn, so this is the sum of the
    CPU the processes spend on shares, without sockets, frames or the event loop.
    """
    import random

    from broker.daemon import shares
    from security import propagation
    from security.envelope import Signer, public_key_to_bytes
    from security.paths import KeyAssembly
    from security.propagation import (
        CertBatch,
        ChainVerifier,
        SealCache,
        ShareInbox,
        pack_record,
        unpack_record,
    )
    from security.publication import EpochKey, publication_id

    names = broker_names(VNS)
    publisher = Signer.generate(PUB_ID)
    signers = {f"{vn}.{i}": Signer.generate(f"{vn}.{i}") for vn in names for i in range(REPLICAS)}

    class Manifest:
        def __init__(self) -> None:
            self.members = {vn: tuple(f"{vn}.{i}" for i in range(REPLICAS)) for vn in names}
            self.keys = {b: public_key_to_bytes(s.public_key) for b, s in signers.items()}

        def owner(self, broker_id: str) -> str | None:
            vn = broker_id.rpartition(".")[0]
            return vn if vn in self.members else None

        def slots(self, vn: str) -> tuple[str, ...]:
            return self.members[vn]

        def schemes(self, vn: str) -> frozenset[int]:
            return frozenset({len(self.members[vn])})

    manifest = Manifest()
    from security.paths import path_view

    def pipeline(first: int, count: int) -> None:
        # One seal cache per process, as in the overlay: the subscriber's is the default.
        caches = {b: SealCache() for b in signers}
        propagation.DEFAULT_SEALS = SealCache()
        epochs = []
        for seq in range(first, first + count):
            epoch = EpochKey.start(publisher, seq, names[0], REPLICAS)
            sealed, sec = epoch.seal(publisher, seq, {"class": "bench"}, b"x" * PAYLOAD_SIZE)
            view = path_view(manifest, PUB_ID, sec, tuple(names))
            epochs.append((seq, sec, sealed, view, [pack_record(r) for r in epoch.records]))
        # level 1: each edge replica gets its share from the publisher
        inflight = {
            (seq, j): [(PUB_ID, raw)] for seq, _, _, _, raws in epochs for j, raw in enumerate(raws)
        }
        for level, vn in enumerate(names, 1):
            nxt: dict[tuple[int, int], list[tuple[str, bytes]]] = {}
            for j in range(REPLICAS):
                me = f"{vn}.{j}"
                batch = CertBatch(signers[me])
                outbox = []
                for seq, _, _, view, _ in epochs:
                    pub_id = publication_id(PUB_ID, seq)
                    # As a broker does: hashes on arrival, the sender's seal just before a
                    # split (vouching), by sample when the share is only relayed.
                    verifier = ChainVerifier(view, seals="none", cache=caches[me])
                    inbox = ShareInbox(view, pub_id, level, j, verifier)
                    for sender, raw in inflight.get((seq, j), []):
                        inbox.offer(unpack_record(raw), sender)
                    for record in inbox.records:
                        if level == len(names):
                            if random.randrange(getattr(shares, "RELAY_CHECK_ONE_IN", 1)) == 0:
                                verifier.seal_ok(record.certs[-1])
                            nxt.setdefault((seq, -1), []).append((me, pack_record(record)))
                        elif verifier.seal_ok(record.certs[-1]):
                            outbox.append((seq, batch.split(record, 2, REPLICAS)))
                sealed_certs = batch.seal()
                for seq, subs in outbox:
                    cert = sealed_certs[subs[0].certs[-1]]
                    for i, sub in enumerate(subs):
                        sent = pack_record(replace_cert(sub, cert))
                        nxt.setdefault((seq, i), []).append((me, sent))
            inflight = nxt
        for seq, sec, sealed, _, _ in epochs:
            assembly = KeyAssembly(PUB_ID, seq)
            assembly.sec = sec
            for sender, raw in inflight[(seq, -1)]:
                assembly.add(sender, unpack_record(raw))
                assembly.recover(manifest, names[-1])
            assert assembly.open(seq, {"class": "bench"}, sealed) is not None

    def replace_cert(record: Any, cert: Any) -> Any:
        from dataclasses import replace

        return replace(record, certs=(*record.certs[:-1], cert))

    out: dict[str, dict[str, float]] = {}
    for label, per in (("one per pass", 1), (f"{per_pass} per pass", per_pass)):

        def run_all(per: int = per) -> None:
            seq = 1
            while seq <= pubs:
                pipeline(seq, per)
                seq += per

        out[label] = work_breakdown(run_all, pubs)
    return out


def work_breakdown(run: Any, pubs: int) -> dict[str, float]:
    """µs per publication by kind of work of ``run()`` (which handles ``pubs``
    publications), and the Ed25519 operations per publication: timed once without the
    profiler (the total) and once under it (the shares of C calls)."""
    import cProfile
    import pstats

    from security import shamir

    def per_call(fn: Any, n: int = 2000) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    secret = b"s" * 64
    parts = shamir.split(secret, 2, REPLICAS)
    shamir_cost = {
        "split": per_call(lambda: shamir.split(secret, 2, REPLICAS)),
        "combine": per_call(lambda: shamir.combine(parts[:2], 2)),
    }
    # C calls are timed accurately by the profiler; Python functions are not (its per-call
    # overhead lands on them), so Shamir is counted and timed alone and the rest of the
    # Python work is what remains of the wall time measured without the profiler.
    kinds = {
        "Ed25519 sign": ("sign' of 'cryptography",),
        "Ed25519 verify": ("verify' of 'cryptography",),
        "SHA-256 (commitments, Merkle, digests)": ("openssl_sha256", "digest' of '_hashlib"),
        "msgpack pack/unpack": ("method 'packb'", "built-in method unpackb", "msgpack"),
    }
    t0 = time.perf_counter()
    run()
    wall = (time.perf_counter() - t0) / pubs * 1e6
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    row = dict.fromkeys(kinds, 0.0)
    calls = {"sign": 0, "verify": 0}
    shamir_us = 0.0
    for (filename, _line, func), (_cc, ncalls, tt, _ct, _callers) in stats.items():
        name = f"{filename}:{func}"
        if filename.endswith("shamir.py") and func in shamir_cost:
            shamir_us += ncalls * shamir_cost[func] * 1e6
            continue
        for kind, needles in kinds.items():
            if any(n in name for n in needles):
                row[kind] += tt * 1e6
                if kind.startswith("Ed25519"):
                    calls[kind.split()[1]] += ncalls
                break
    row = {k: v / pubs for k, v in row.items()}
    row["Shamir split/combine"] = shamir_us / pubs
    row["other Python (shares, checks, assembly)"] = wall - sum(row.values())
    row["total"] = wall
    row["signs / publication"] = calls["sign"] / pubs
    row["verifies / publication"] = calls["verify"] / pubs
    return row


async def orchestrate(args: argparse.Namespace) -> None:
    runs = 1 if args.quick else args.runs
    pings, seconds = (100, 3.0) if args.quick else (args.pings, args.seconds)
    window = args.window
    names = broker_names(VNS)
    started = time.monotonic()
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in (*MODES, R1_MODE)}
    children: list[Child] = []
    overlays: list[LocalOverlay] = []
    with tempfile.TemporaryDirectory(prefix="bench-conf-") as tmp:
        overlay = await asyncio.to_thread(
            start_overlay,
            Path(tmp),
            line_tree(names),
            None,
            replicas=dict.fromkeys(names, REPLICAS),
        )
        overlays.append(overlay)
        try:
            rfd, wfd = os.pipe()
            sub = await Child.start(
                "sub",
                [
                    "--endpoints",
                    ",".join(overlay.endpoints(names[-1])),
                    "--manifest",
                    str(overlay.manifest_path),
                    "--fd",
                    str(wfd),
                    "--queue",
                    str(window + 1000),
                ],
                wfd,
            )
            children.append(sub)
            pub = await Child.start(
                "pub",
                [
                    "--endpoints",
                    ",".join(overlay.endpoints(names[0])),
                    "--fd",
                    str(rfd),
                    "--share-form",
                    args.share_form,
                ],
                rfd,
            )
            children.append(pub)
            os.close(rfd)
            os.close(wfd)
            await asyncio.to_thread(overlay.wait_quiet)
            for mode in MODES:
                if not (await pub.ask(op="warm", mode=mode, seconds=15.0))["ok"]:
                    raise RuntimeError(f"no {mode} warm-up publication was delivered")
            meter = Meter(overlay, {"pub": pub.pid, "sub": sub.pid})
            # The same line with unreplicated brokers (r = 1), for the cost of replication.
            plain1 = await asyncio.to_thread(
                start_overlay, Path(tmp) / "r1", line_tree(names), None, replicas=None
            )
            overlays.append(plain1)
            rfd, wfd = os.pipe()
            sub1 = await Child.start(
                "sub",
                [
                    "--endpoints",
                    ",".join(plain1.endpoints(names[-1])),
                    "--manifest",
                    str(plain1.manifest_path),
                    "--fd",
                    str(wfd),
                    "--queue",
                    str(window + 1000),
                ],
                wfd,
            )
            children.append(sub1)
            pub1 = await Child.start(
                "pub", ["--endpoints", ",".join(plain1.endpoints(names[0])), "--fd", str(rfd)], rfd
            )
            children.append(pub1)
            os.close(rfd)
            os.close(wfd)
            await asyncio.to_thread(plain1.wait_quiet)
            if not (await pub1.ask(op="warm", mode="plain", seconds=15.0))["ok"]:
                raise RuntimeError("no plain warm-up publication was delivered at r = 1")
            meter1 = Meter(plain1, {"pub": pub1.pid, "sub": sub1.pid})
            for run in range(runs):
                order = MODES if run % 2 == 0 else MODES[::-1]
                for mode in order:
                    last = mode == args.profile_mode and run == runs - 1
                    spy = args.profile if last else None
                    res = await measure_mode(
                        mode,
                        pub,
                        sub,
                        meter,
                        pings,
                        window,
                        seconds,
                        f"r{run}m{MODES.index(mode)}",
                        spy,
                    )
                    results[mode].append(res)
                    print(
                        f"run {run + 1}/{runs} {mode:<12} lat {res['lat_median_us']:7.0f} µs "
                        f"p99 {res['lat_p99_us']:7.0f} µs  {res['msg_per_s']:7.0f} msg/s "
                        f"({res['delivered']}/{res['sent']}, dropped {res['dropped']})  "
                        f"broker CPU {res['broker_cpu_us']:6.0f} µs/msg  "
                        f"pub {res['pub_cpu_us']:5.0f} sub {res['sub_cpu_us']:5.0f} µs/msg  "
                        f"{res['broker_bytes']:7.0f} B/pub  busy {res['cpu_busy']:.2f} cores",
                        flush=True,
                    )
                    for warning in res["warnings"]:
                        print("   subscriber:", warning)
                res = await measure_mode(
                    "plain", pub1, sub1, meter1, pings, window, seconds, f"r{run}r1"
                )
                results[R1_MODE].append(res)
                print(
                    f"run {run + 1}/{runs} {R1_MODE:<12} lat {res['lat_median_us']:7.0f} µs "
                    f"p99 {res['lat_p99_us']:7.0f} µs  {res['msg_per_s']:7.0f} msg/s "
                    f"({res['delivered']}/{res['sent']})  broker CPU "
                    f"{res['broker_cpu_us']:6.0f} µs/msg  {res['broker_bytes']:7.0f} B/pub",
                    flush=True,
                )
        finally:
            for child in children:
                await child.stop()
            for each in overlays:
                await asyncio.to_thread(each.stop)
            warnings = [
                f"{b}: {line}"
                for b, p in sorted(overlay.brokers.items())
                if p.log_path.exists()
                for line in p.log_path.read_text(errors="replace").splitlines()
                if "WARNING" in line or "ERROR" in line
            ]
    wall = time.monotonic() - started
    cpu = report(
        results,
        analytic_bytes(),
        crypto_costs(),
        runs,
        pings,
        window,
        seconds,
        wall,
        args.share_form,
    )
    report_replication(results, runs)
    if args.share_form == "pass":
        from bench_pass_shares import pass_breakdown

        breakdown = pass_breakdown()
    else:
        breakdown = pipeline_breakdown()
    print()
    print(f"where share work goes by the {args.share_form}, per confidential publication (all")
    print("processes' share work run in one process, no sockets or event loop; µs, and")
    print("Ed25519 operations):")
    head = list(breakdown)
    print(f"| {'work':<43} | " + " | ".join(f"{h:>14}" for h in head) + " |")
    print(f"|{'-' * 45}|" + "|".join("-" * 15 + ":" for _ in head) + "|")
    for key in breakdown[head[0]]:
        cells = " | ".join(f"{breakdown[h][key]:>14,.1f}" for h in head)
        print(f"| {key:<43} | {cells} |")
    extra = cpu["confidential"] - cpu["plain"]
    content = cpu[EPOCH_MODE] - cpu["plain"]
    model = breakdown[head[-1]]["total"]
    print(
        f"in the overlay's stream a confidential publication cost {extra:,.0f} µs of CPU more "
        f"than a plain one (all processes): about {content:,.0f} µs for its content (the "
        f"key_refresh = {EPOCH} stream's extra, whose shares travel once per {EPOCH}), "
        f"{model:,.0f} µs of share work (the table above, {head[-1]}) and "
        f"{extra - content - model:,.0f} µs for handling the shares around that work "
        "(frames and statements on the wire, paths, votes, per-epoch tables, the event loop)"
    )
    print(f"broker log warnings/errors: {len(warnings)}")
    for line in warnings[:8]:
        print("  " + line[:200])
    if args.profile is not None:
        for name in PROFILED:
            path = args.profile / f"{name}.txt"
            print(
                f"\npy-spy profile of {name} during the last {args.profile_mode} stream ({path}):"
            )
            lines = summarize_profile(path) if path.exists() else ["  (no profile written)"]
            print("\n".join(lines))


def report(
    results: dict[str, list[dict[str, Any]]],
    analytic: dict[str, dict[str, float]],
    crypto: dict[str, float],
    runs: int,
    pings: int,
    window: int,
    seconds: float,
    wall: float,
    share_form: str = "pass",
) -> dict[str, float]:
    """Print the comparison; returns the CPU per publication in the stream by mode (µs,
    brokers and clients)."""

    def med(mode: str, key: str, vn: str | None = None) -> float:
        values = [r[key] if vn is None else r[key][vn] for r in results[mode]]
        return statistics.median(values) if values else float("nan")

    def row(label: str, values: list[float], fmt: str = "{:,.0f}") -> str:
        p, c, e = values
        cells = [fmt.format(p), fmt.format(c), f"{c / p:.2f}x", fmt.format(e), f"{e / p:.2f}x"]
        return f"| {label:<43} | " + " | ".join(f"{x:>10}" for x in cells) + " |"

    keys: list[tuple[str, ...]] = [
        ("lat_median_us", "latency median (µs)"),
        ("lat_p99_us", "latency p99 (µs)"),
        ("ping_cpu_us", "CPU / msg one at a time, all processes (µs)"),
        ("msg_per_s", "throughput (msg/s delivered)"),
        ("pub_msg_per_s", "publisher send rate (msg/s)"),
        ("stream_lat_ms", "latency in the stream, median (ms)", "{:,.1f}"),
        ("cpu_busy", "cores busy in the stream, all processes", "{:.2f}"),
        ("broker_cpu_us", "broker CPU / delivered msg, 9 brokers (µs)"),
        ("pub_cpu_us", "publisher CPU / msg (µs)"),
        ("sub_cpu_us", "subscriber CPU / msg (µs)"),
        ("broker_bytes", "bytes written by brokers / publication"),
        ("pub_bytes", "bytes written by publisher / publication"),
    ]
    plain, conf, epoch = MODES
    print()
    print(f"3-VN line b0-b1-b2, r = {REPLICAS} (9 brokers), 1 -> 1, {PAYLOAD_SIZE}-byte payloads;")
    print(f"key shares travel by the {share_form} (--share-form)")
    print(
        f"medians of {runs} run(s); per mode and run: {pings} pings, then a {seconds:g} s stream "
        f"with at most {window} publications undelivered"
    )
    head = ["plain", "confidential", "conf/plain", f"epoch {EPOCH}", "ep/plain"]
    print(f"| {'metric':<43} | " + " | ".join(f"{h:>10}" for h in head) + " |")
    print(f"|{'-' * 45}|" + "|".join("-" * 11 + ":" for _ in head) + "|")
    for key, label, *fmt in keys:
        print(row(label, [med(m, key) for m in MODES], *fmt))
    for vn in broker_names(VNS):
        label = f"  CPU of VN {vn} (3 replicas) / msg (µs)"
        print(row(label, [med(m, "vn_cpu_us", vn) for m in MODES]))
    for vn in broker_names(VNS):
        label = f"  CPU of VN {vn} / msg, one at a time (µs)"
        print(row(label, [med(m, "ping_vn_cpu_us", vn) for m in MODES]))
    lost = {m: sum(r["sent"] - r["delivered"] for r in results[m]) for m in MODES}
    print(f"stream publications not delivered (sum over runs): {lost}")
    print()
    lat = med(conf, "lat_median_us") / med(plain, "lat_median_us")
    p99 = med(conf, "lat_p99_us") / med(plain, "lat_p99_us")
    thr = med(conf, "msg_per_s") / med(plain, "msg_per_s")
    print("SPEC §10 (fresh key per publication, the default):")
    print(f"  latency ratio {lat:.2f}x (goal ≤ 2x): {'MET' if lat <= 2 else 'NOT MET'}")
    print(f"  p99 latency ratio {p99:.2f}x")
    print(f"  throughput ratio {thr:.3f}x (goal ≥ 0.5x): {'MET' if thr >= 0.5 else 'NOT MET'}")
    lat_e = med(epoch, "lat_median_us") / med(plain, "lat_median_us")
    thr_e = med(epoch, "msg_per_s") / med(plain, "msg_per_s")
    print(f"  with key_refresh = {EPOCH}: latency {lat_e:.2f}x, throughput {thr_e:.3f}x")
    floor = ED25519_OPS["sign"] * crypto["sign"] + ED25519_OPS["verify"] * crypto["verify"]
    total = {
        m: sum(med(m, k) for k in ("broker_cpu_us", "pub_cpu_us", "sub_cpu_us")) for m in MODES
    }
    print(
        f"Ed25519 here: sign {crypto['sign']:.0f} µs, verify {crypto['verify']:.0f} µs; "
        f"before batching, {ED25519_OPS['sign']} signs + {ED25519_OPS['verify']} verifies per "
        f"confidential publication = {floor:,.0f} µs of CPU (the counts now: the last table; "
        f"measured CPU per publication, brokers + "
        f"clients: plain {total[plain]:,.0f} µs, confidential {total[conf]:,.0f} µs, "
        f"epoch {EPOCH} {total[epoch]:,.0f} µs)"
    )
    print()
    print("bytes on the wire per publication (measured: broker wchar minus log growth;")
    print("analytic: sum of the frames the protocol sends, encoded with the real encoders)")
    head = ["plain", "confidential", "ratio", f"epoch {EPOCH}", "ratio"]
    print(f"| {'hop':<43} | " + " | ".join(f"{h:>10}" for h in head) + " |")
    print(f"|{'-' * 45}|" + "|".join("-" * 11 + ":" for _ in head) + "|")
    if share_form == "record":  # (the analytic frames are the record form's)
        for hop in ("pub>b0", "b0>b1", "b1>b2", "b2>sub"):
            print(row("analytic " + hop, [analytic[m][hop] for m in MODES]))
        print(
            row(
                "analytic, per broker-written hop",
                [analytic[m]["brokers_total"] / 3 for m in MODES],
            )
        )
    for vn, hop in zip(broker_names(VNS), ("b0>b1", "b1>b2", "b2>sub"), strict=True):
        print(row(f"measured {hop} (wchar of {vn}.*)", [med(m, "vn_bytes", vn) for m in MODES]))
    print(row("measured, per broker-written hop", [med(m, "broker_bytes") / 3 for m in MODES]))
    print(row("measured pub>b0 (publisher wchar)", [med(m, "pub_bytes") for m in MODES]))
    ac = analytic[conf]
    print(
        f"frames{' of the record form' if share_form == 'pass' else ''}: content "
        f"{analytic[plain]['content_frame']:.0f} B plain / "
        f"{ac['content_frame']:.0f} B confidential (+{ac['sec_overhead']:.0f} B: nonce, tag, "
        f"pk, sig, vn, epoch); share frames {ac['share_frame_l2']:.0f} B (2 certs) / "
        f"{ac['share_frame_l3']:.0f} B (3 certs); shares per hop {ac['shares_b0>b1']:.0f} / "
        f"{ac['shares_b1>b2']:.0f} / {ac['shares_b2>sub']:.0f}; 9 content copies per "
        f"inter-VN hop, 3 to the subscriber"
    )
    logged = max(r["logged"] for m in MODES for r in results[m])
    busy = ", ".join(f"{m} {med(m, 'cpu_busy'):.2f}" for m in MODES)
    print(
        f"log bytes written during a stream (subtracted): at most {logged}; CPU busy during "
        f"the streams (cores of 2): {busy}; bench wall time {wall:.0f} s"
    )
    return total


def report_replication(results: dict[str, list[dict[str, Any]]], runs: int) -> None:
    """Replicated plain (r = 3) against unreplicated plain (r = 1) on the same line."""

    def med(mode: str, key: str) -> float:
        values = [r[key] for r in results[mode]]
        return statistics.median(values) if values else float("nan")

    print()
    print(f"replicated plain (r = {REPLICAS}, 9 brokers) vs unreplicated plain (r = 1, 3 brokers),")
    print(f"same 3-VN line, same run, medians of {runs} run(s):")
    print(f"| {'metric':<43} | {'r = 1':>10} | {'r = 3':>10} | {'r3/r1':>10} |")
    print(f"|{'-' * 45}|" + "|".join("-" * 11 + ":" for _ in range(3)) + "|")
    for key, label in (
        ("lat_median_us", "latency median (µs)"),
        ("lat_p99_us", "latency p99 (µs)"),
        ("msg_per_s", "throughput (msg/s delivered)"),
        ("broker_cpu_us", "broker CPU / delivered msg, all brokers (µs)"),
        ("broker_bytes", "bytes written by brokers / publication"),
    ):
        one, three = med(R1_MODE, key), med("plain", key)
        print(f"| {label:<43} | {one:>10,.0f} | {three:>10,.0f} | {three / one:>9.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run, fewer messages")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each stream")
    parser.add_argument("--window", type=int, default=200, help="most undelivered in a stream")
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy the last stream of --profile-mode (b0.0, b1.0, b2.0, pub, sub) into this "
        "dir (py-spy: bash deploy/setup.sh --bench)",
    )
    parser.add_argument(
        "--profile-mode", choices=MODES, default="confidential", help="the mode --profile spies on"
    )
    # Child roles (internal).
    parser.add_argument(
        "--share-form",
        choices=("record", "pass"),
        default="pass",
        help="how the confidential publishers' key shares travel (Client share_form)",
    )
    parser.add_argument("--role", choices=("pub", "sub"), help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--queue", type=int, default=10_000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile is not None and not Path(sys.executable).with_name("py-spy").exists():
        parser.error("--profile needs py-spy beside this Python: bash deploy/setup.sh --bench")
    if args.role is None:
        asyncio.run(orchestrate(args))
        return
    new_loop_policy()
    endpoints = args.endpoints.split(",")
    with contextlib.suppress(KeyboardInterrupt, TrellisTimeout):
        if args.role == "pub":
            asyncio.run(run_publisher(endpoints, args.fd, args.share_form))
        else:
            asyncio.run(run_subscriber(endpoints, args.manifest, args.fd, args.queue))


if __name__ == "__main__":
    main()
