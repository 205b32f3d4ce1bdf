"""Topic creation and discovery latency through a real TDN on a real overlay (SPEC §8).

Usage::

    .venv/bin/python bench/bench_tdn.py                 # 10,000 topics, 30 samples each
    .venv/bin/python bench/bench_tdn.py --topics 2000 --samples 10   # quicker
    .venv/bin/python bench/bench_tdn.py --auth          # secured topics on vs off, one broker

Setup: two broker processes in a line (b0 - b1), one ``trellis tdn`` process at b0, the
measuring entity at b1 (so every request and answer crosses the overlay link). The TDN is
loaded with ``--topics`` advertisements disseminated on ``Services/Discovery/Topics`` (issued
in this process by a second trusted TDN key, as another TDN would; the TDN verifies each one).
Among them, groups of 1, 10 and 100 topics share a synopsis prefix and a ``group``
descriptor, so a query matches exactly that many.

Measured (medians of ``--samples``, wall clock at the entity):

- ``echo``: the baseline, a publication to an echo client at b0 and its answer back (the
  overlay round trip with nothing but routing);
- ``create``: ``TopicsClient.create_topic`` end to end (sign the request, TDN checks and
  signs, the entity verifies the advertisement and disseminates it);
- ``discover N``: ``TopicsClient.discover`` for each query kind matching N topics among all
  (the TDN scans every advertisement; the entity verifies the N it receives).

The seed (NaradaBrokering, 2005 hardware) reports creation ≈ 211 ms and discovery of 100 topics
≈ 481 ms, local; they are printed beside ours for scale, not as a same-run peer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client import Client
from broker.tools.local import start_overlay
from broker.tools.tdn import start_tdn_process
from broker.tools.tdn_wire import TOPICS_CLASS
from broker.tools.topics_client import TopicsClient
from overlay.tree import line_tree
from security.envelope import Signer, public_key_to_bytes
from security.topics import issue_advertisement, make_request

SEED = {"create": 211.0, "discover 100": 481.0}


async def median_ms(samples: int, action: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        await action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def measure(workdir: Path, topics: int, samples: int) -> dict[str, float]:
    overlay = start_overlay(workdir / "overlay", line_tree(["b0", "b1"]))
    tdn, loader = Signer.generate("tdn-1"), Signer.generate("tdn-loader")
    trusted = {s.id: public_key_to_bytes(s.public_key) for s in (tdn, loader)}
    trusted_file = workdir / "tdns.json"
    trusted_file.write_text(json.dumps({k: v.hex() for k, v in trusted.items()}))
    proc = start_tdn_process(workdir, tdn, overlay.endpoint("b0"), trusted_file)
    out: dict[str, float] = {}
    try:
        me, owner = Signer.generate("bench"), Signer.generate("owner")
        c_me = Client(overlay.endpoint("b1"), client_id="bench")
        c_load = Client(overlay.endpoint("b0"), client_id="loader")
        c_echo = Client(overlay.endpoint("b0"), client_id="echo")
        async with c_me, c_load, c_echo, TopicsClient(c_me, me, trusted) as t:
            # load: groups of 1, 10, 100 matching topics; the rest spread over filler groups
            await c_load.advertise("class prefix 'Services/Discovery/'")
            now = time.time()
            sizes = {"one": 1, "ten": 10, "hundred": 100}
            names = [g for g, n in sizes.items() for _ in range(n)]
            names += [f"filler{i % 500}" for i in range(topics - len(names))]

            async def held() -> int:
                found = await t.locate(wait=1.0)
                return found[0].topics if found else 0

            for i, group in enumerate(names):
                req = make_request(
                    owner,
                    f"{group}/{i}",
                    nonce=os.urandom(16),
                    now=now,
                    lifetime=3600,
                    descriptors={"group": group, "i": i},
                )
                ad = issue_advertisement(
                    loader, req, uuid=str(uuid.uuid4()), now=now, depth=0, expires=now + 3600
                )
                await c_load.publish(
                    {"class": TOPICS_CLASS, "from": "loader"},
                    msgpack.packb(ad.to_wire(), use_bin_type=True),
                    ack=False,
                )
                if (i + 1) % 1000 == 0 or i + 1 == len(names):
                    # in batches, so that the TDN's bounded queue never overflows
                    await c_load.drain(60)
                    for _ in range(120):  # bounded: two minutes per batch at most
                        if await held() >= i + 1:
                            break
                    else:
                        raise RuntimeError("the TDN did not hold the loaded topics in time")

            # baseline: overlay round trip through an echo client
            await c_echo.advertise("class = 'bench/echo-back'")
            await c_me.advertise("class = 'bench/echo'")
            async with (
                c_echo.subscribe("class = 'bench/echo'") as pings,
                c_me.subscribe("class = 'bench/echo-back'") as pongs,
            ):

                async def echo_server() -> None:
                    async for msg in pings:
                        await c_echo.publish({"class": "bench/echo-back"}, msg.payload)

                server = asyncio.create_task(echo_server())

                async def echo() -> None:
                    await c_me.publish({"class": "bench/echo"}, b"x" * 200)
                    await pongs.get(5)

                out["echo"] = await median_ms(samples, echo)
                server.cancel()

            counter = iter(range(10**9))
            out["create"] = await median_ms(
                samples,
                lambda: t.create_topic(f"bench/{next(counter)}", lifetime=600, tdn="tdn-1"),
            )
            for group, n in sizes.items():
                for kind, text in (
                    ("exact", f"{group}/{names.index(group)}"),
                    ("regex", f"{group}/[0-9]+"),
                    ("properties", f"group = '{group}'"),
                ):
                    if kind == "exact" and n > 1:
                        continue  # an exact synopsis names one topic

                    async def discover(kind: str = kind, text: str = text, n: int = n) -> None:
                        found = await t.discover(kind, text, tdn="tdn-1")
                        assert len(found) == n, (kind, text, len(found))

                    out[f"discover {n} ({kind})"] = await median_ms(samples, discover)
    finally:
        proc.terminate()
        proc.wait(10)
        overlay.stop()
    return out


async def measure_auth(
    workdir: Path, samples: int, count: int, rounds: int = 5
) -> dict[str, dict[str, float]]:
    """The same broker binary twice, secured topics on (``topic_trust``) and off, measured in
    alternation (the machine is shared; alternating spreads its noise over both): SUBSCRIBE
    latency (credentials checked on each) and publish throughput to one subscriber (there is
    no per-publication check; this shows what that path costs)."""
    from broker.daemon.topic_guard import secured_class
    from broker.tools.launcher import BrokerProcess, start_broker
    from security.topics_credentials import present_credentials
    from security.topics_delegations import delegate

    tdn, owner, reader = (Signer.generate(n) for n in ("tdn-1", "owner", "reader"))
    trust = workdir / "tdns.json"
    trust.write_text(json.dumps({"tdn-1": public_key_to_bytes(tdn.public_key).hex()}))
    now = time.time()
    req = make_request(owner, "bench", nonce=os.urandom(16), now=now, lifetime=3600)
    ad = issue_advertisement(tdn, req, uuid=str(uuid.uuid4()), now=now, depth=0, expires=now + 3600)
    grant = delegate(owner, ad, public_key_to_bytes(reader.public_key), "subscribe", now=now)
    flt = f"class = '{secured_class(ad.uuid)}'"
    attrs = {"class": secured_class(ad.uuid)}
    procs: dict[str, BrokerProcess] = {}
    subscribe: dict[str, list[float]] = {"open": [], "secured": []}
    rates: dict[str, list[float]] = {"open": [], "secured": []}
    try:
        for mode in ("open", "secured"):
            settings = {"topic_trust": str(trust)} if mode == "secured" else {}
            procs[mode] = start_broker(workdir / mode, f"auth-{mode}", settings=settings)
        async with contextlib.AsyncExitStack() as stack:
            pairs = {}
            for mode, proc in procs.items():
                pub = Client(
                    proc.endpoint,
                    client_id="owner",
                    hello_options={
                        "credentials": present_credentials(
                            owner, "owner", time.time(), [(ad, None)]
                        )
                    },
                )
                sub = Client(
                    proc.endpoint,
                    client_id="reader",
                    hello_options={
                        "credentials": present_credentials(
                            reader, "reader", time.time(), [(ad, grant)]
                        )
                    },
                )
                await stack.enter_async_context(pub)
                await stack.enter_async_context(sub)
                await pub.advertise(flt)
                pairs[mode] = (pub, sub)
            for _ in range(rounds):
                for mode, (pub, sub) in pairs.items():

                    async def cycle(sub: Client = sub) -> None:
                        async with sub.subscribe(flt):
                            pass

                    subscribe[mode].append(await median_ms(samples, cycle))
                    async with sub.subscribe(flt) as stream:
                        start = time.perf_counter()
                        for i in range(count):
                            await pub.publish({**attrs, "i": i}, b"x" * 100, ack=False)
                        for _ in range(count):
                            await stream.get(30)
                        rates[mode].append(count / (time.perf_counter() - start))
    finally:
        for proc in procs.values():
            proc.stop()
    return {
        mode: {
            "subscribe ms": statistics.median(subscribe[mode]),
            "msg/s": statistics.median(rates[mode]),
        }
        for mode in ("open", "secured")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument(
        "--auth", action="store_true", help="secured topics on vs off at one broker instead"
    )
    parser.add_argument("--count", type=int, default=5000, help="publications per --auth run")
    args = parser.parse_args()
    from broker.tools.launcher import run_async

    if args.auth:
        with tempfile.TemporaryDirectory(prefix="bench-tdn-auth-") as tmp:
            auth = run_async(measure_auth(Path(tmp), args.samples, args.count))
        print(
            f"medians over 5 alternating rounds (SUBSCRIBE: median of {args.samples} per round; "
            f"{args.count} publications per round)"
        )
        for mode, figures in auth.items():
            print(
                f"  {mode:8s} subscribe {figures['subscribe ms']:7.2f} ms  "
                f"{figures['msg/s']:9.0f} msg/s"
            )
        print(
            f"  secured/open: subscribe "
            f"{auth['secured']['subscribe ms'] / auth['open']['subscribe ms']:.2f}x, "
            f"msg/s {auth['secured']['msg/s'] / auth['open']['msg/s']:.2f}x"
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-tdn-") as tmp:
        results = run_async(measure(Path(tmp), args.topics, args.samples))
    echo = results["echo"]
    print(
        f"{args.topics} topics registered, medians of {args.samples} (ms); "
        "ratio to the echo round trip"
    )
    for name, ms in results.items():
        seed = next((f"  seed {v:g} ms" for k, v in SEED.items() if name.startswith(k)), "")
        print(f"  {name:28s} {ms:8.2f} ms  {ms / echo:6.1f}x echo{seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
