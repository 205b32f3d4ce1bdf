"""Reliability figures (issue 15): fault scenarios on hosts with their own addresses, and a
long fuzzing run against a real broker process. Needs root (network namespaces). Not a test:

    .venv/bin/python bench/bench_reliability.py scenarios [--short] [--rate 100] [NAME ...]
    .venv/bin/python bench/bench_reliability.py fuzz [--examples 20000]

``scenarios`` runs each fault scenario of ``tests/hosts/scenarios.py`` (full versions by
default: kill, partition, netem, vn-restart) and prints one row per scenario: load held,
faults injected, and published/delivered/lost/duplicated/reordered/decrypted counts.

``fuzz`` throws ``--examples`` hypothesis-generated sessions (every frame type and field,
as a client, a neighbour broker, a control connection and before HELLO) at one broker,
with a witness client checked every 50 sessions, then 2,000 identical bad connections
to compare file descriptors and RSS before and after; prints the inputs tried and the
outcomes by error code.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings

from broker.tools.launcher import start_broker
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("scenarios", add_help=False)
    f = sub.add_parser("fuzz")
    f.add_argument("--examples", type=int, default=20000)
    args, rest = parser.parse_known_args()
    if args.what == "fuzz":
        return fuzz(args.examples)
    return scenarios_main(rest)


if __name__ == "__main__":
    sys.exit(main())
