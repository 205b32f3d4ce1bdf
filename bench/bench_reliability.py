"""Reliability figures (issue 15): fault scenarios on hosts with their own addresses, and a
long fuzzing run against a real broker process. Needs root (network namespaces). Not a test:

    .venv/bin/python bench/bench_reliability.py scenarios [--short] [--rate 100] [NAME ...]
    .venv/bin/python bench/bench_reliability.py fuzz [--examples 20000]
    .venv/bin/python bench/bench_reliability.py idle [--connections 10000]

``scenarios`` runs each fault scenario of ``tests/hosts/scenarios.py`` (full versions by
default; all of them without a NAME: kill, partition, netem, flood-partition, flood,
long-partition, steady, vn-restart, rewire, reconf-kill, reconf-partition, reconf-netem) and
prints one row per scenario and subscriber: load held, faults injected, and
published/delivered/lost/duplicated/reordered/decrypted counts. ``rewire`` restarts a VN
attached elsewhere in the tree; ``reconf-*`` run live rounds moving a VN back and forth
during the fault (their notes count the rounds by outcome).

``fuzz`` throws ``--examples`` hypothesis-generated sessions (every frame type and field,
as a client, a neighbour broker, a control connection and before HELLO) at one broker,
with a witness client checked every 50 sessions, then 2,000 identical bad connections
to compare file descriptors and RSS before and after; prints the inputs tried and the
outcomes by error code.

``idle`` opens ``--connections`` client connections that say HELLO and then nothing, and
measures the broker's RSS and file descriptors per connection and a witness client's
publish-to-delivery round trip (median of 200) before, with and after them.
"""

from __future__ import annotations

import argparse
import collections
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings

from broker.tools.launcher import start_broker
from broker.wire.protocol import PROTOCOL_VERSION, Hello, Role, encode
from tests.fuzz_wire import FUZZ_BROKER, FuzzTarget, Witness, fuzzed_broker_settings, sessions
from tests.hosts.__main__ import main as scenarios_main
from tests.hosts.scenarios import fd_count, rss_kib


def fuzz(examples: int) -> int:
    with tempfile.TemporaryDirectory(prefix="trellis-fuzz-") as tmp:
        proc = start_broker(Path(tmp), FUZZ_BROKER, settings=fuzzed_broker_settings())
        try:
            target = FuzzTarget(proc.host, proc.port)
            witness = Witness(proc.host, proc.port)
            by_role: collections.Counter[str] = collections.Counter()
            fds0, rss0 = fd_count(proc.pid), rss_kib(proc.pid)

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(session=sessions())
            def run(session: tuple[str, list[bytes]]) -> None:
                role, payload = session
                outcome = target.session(role, payload)
                by_role[f"{role}:{'open' if outcome.answered else 'closed'}"] += 1
                assert proc.alive(), f"the broker died: see {proc.log_path}"
                if target.sessions % 50 == 0:
                    witness.check()

            start = time.monotonic()
            run()
            fuzz_s = time.monotonic() - start
            fds1, rss1 = fd_count(proc.pid), rss_kib(proc.pid)
            tried, frames_sent = target.sessions, target.frames_sent
            answered, refused = target.answered, target.refused
            closed, codes = target.closed_with_error, dict(sorted(target.codes.items()))
            for i in range(2000):
                target.session("client", [b"\x00\x00\x00\x02\x92\x07"], client_id=f"bad-{i}")
            witness.check()
            fds2, rss2 = fd_count(proc.pid), rss_kib(proc.pid)
            internal = proc.log_path.read_text(errors="replace").count("internal error")
            print(
                f"fuzzed sessions (inputs tried): {tried} with {frames_sent} "
                f"frames in {fuzz_s:.0f} s ({tried / fuzz_s:.0f}/s); then 2000 bad connections"
            )
            print(
                f"connection kept open (PONG): {answered}, of which a request was refused "
                f"with an ERROR: {refused}"
            )
            print(f"ERROR then close: {closed}, by code: {codes}")
            print(f"by role: {dict(sorted(by_role.items()))}")
            print(
                f"internal errors in the broker's log: {internal}; witness checks: "
                f"{witness.sent}, all served; broker alive: {proc.alive()}"
            )
            print(
                f"broker fds: {fds0} at start, {fds1} after fuzzing, {fds2} after 2000 more "
                f"bad connections; RSS KiB: {rss0}, {rss1}, {rss2} "
                f"({rss2 - rss1:+d} over the 2000)"
            )
            witness.close()
        finally:
            proc.stop()
    return 0


def _round_trips(witness: Witness, count: int = 200) -> float:
    """Median publish-to-delivery round trip of the witness, in microseconds."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        witness.check()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def idle(connections: int) -> int:
    with tempfile.TemporaryDirectory(prefix="trellis-idle-") as tmp:
        proc = start_broker(
            Path(tmp),
            "idle-broker",
            settings={"hello_timeout": 600.0, "heartbeat_interval": 3600.0},
        )
        socks: list[socket.socket] = []
        try:
            witness = Witness(proc.host, proc.port)
            base = _round_trips(witness)
            fds0, rss0 = fd_count(proc.pid), rss_kib(proc.pid)
            start = time.monotonic()
            for i in range(connections):
                sock = socket.create_connection((proc.host, proc.port), timeout=10.0)
                sock.sendall(encode(Hello(PROTOCOL_VERSION, Role.CLIENT, f"idle-{i}", {})))
                socks.append(sock)
            for sock in socks:  # every WELCOME: each connection is attached
                sock.recv(4096)
            opened = time.monotonic() - start
            loaded = _round_trips(witness)
            fds1, rss1 = fd_count(proc.pid), rss_kib(proc.pid)
            for sock in socks:
                sock.close()
            socks.clear()
            time.sleep(2.0)
            after = _round_trips(witness)
            fds2, rss2 = fd_count(proc.pid), rss_kib(proc.pid)
            print(f"{connections} idle client connections opened and welcomed in {opened:.1f} s")
            print(
                f"broker fds {fds0} -> {fds1} -> {fds2} (after closing them); RSS KiB "
                f"{rss0} -> {rss1} -> {rss2}: {(rss1 - rss0) / connections:.1f} KiB each"
            )
            print(
                f"witness round trip, median of 200: {base:.0f} us alone, {loaded:.0f} us "
                f"with them ({loaded / base:.2f}x), {after:.0f} us after"
            )
            print(f"broker alive: {proc.alive()}")
            witness.close()
        finally:
            for sock in socks:
                sock.close()
            proc.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("scenarios", add_help=False)
    f = sub.add_parser("fuzz")
    f.add_argument("--examples", type=int, default=20000)
    i = sub.add_parser("idle")
    i.add_argument("--connections", type=int, default=10000)
    args, rest = parser.parse_known_args()
    if args.what == "fuzz":
        return fuzz(args.examples)
    if args.what == "idle":
        return idle(args.connections)
    return scenarios_main(rest)


if __name__ == "__main__":
    sys.exit(main())
