"""`trellis demo`: the embedded default job.

Starts a local overlay of real broker processes, attaches subscribers with different
content filters at different brokers and a publisher streaming stock quotes at one end,
then prints what each subscriber got next to what an oracle computed from the filters
says it should have got, and how much traffic each overlay link carried.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from pathlib import Path

from broker.client import Client, Subscription
from broker.filters import parse_filter
from broker.local import start_overlay
from overlay.tree import broker_names, line_tree

SUBSCRIBERS = {
    # name: (broker index along the line, filter)
    "cheap-acme": (4, "class = 'stock' and symbol = 'ACME' and price < 50"),
    "tech-range": (
        2,
        "class = 'stock' and symbol in ('INIT', 'TECH') and price >= 20 and price <= 80",
    ),
    "all-stock": (4, "class = 'stock'"),
    "a-names": (1, "class = 'stock' and symbol prefix 'A'"),
    "bonds": (3, "class = 'bond'"),
}
SYMBOLS = ("ACME", "ABCO", "INIT", "TECH", "ZETA")


async def _collect(sub: Subscription, expected: int, deadline: float) -> int:
    got = 0
    while got < expected:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            await sub.get(remaining)
        except Exception:
            break
        got += 1
    return got


def _forwarded(metrics: str) -> dict[str, int]:
    pattern = r'trellis_publications_forwarded_total\{broker="[^"]+",link="([^"]+)"\} (\S+)'
    return {m.group(1): int(float(m.group(2))) for m in re.finditer(pattern, metrics)}


async def run_demo(workdir: Path, count: int = 2000, brokers: int = 5, seed: int = 7) -> int:
    rng = random.Random(seed)
    names = broker_names(brokers)
    tree = line_tree(names)
    print(f"starting {brokers} broker processes in a line: {' - '.join(names)}")
    overlay = await asyncio.to_thread(start_overlay, workdir, tree)
    for b, proc in sorted(overlay.brokers.items()):
        print(f"  {b}: pid {proc.pid}, clients on {proc.endpoint}, metrics on {proc.admin_url}")
    try:
        quotes = [
            {
                "class": "stock",
                "symbol": rng.choice(SYMBOLS),
                "price": round(rng.uniform(1, 100), 2),
            }
            for _ in range(count)
        ]
        expected = {
            name: sum(parse_filter(text).matches(q) for q in quotes)
            for name, (_, text) in SUBSCRIBERS.items()
        }
        clients = []
        subs = {}
        for name, (at, text) in SUBSCRIBERS.items():
            client = Client(overlay.endpoint(names[min(at, brokers - 1)]), client_id=name)
            await client.connect()
            subs[name] = client.subscribe(text)
            await subs[name].__aenter__()
            clients.append(client)
        async with Client(overlay.endpoint(names[0]), client_id="ticker") as pub:
            await pub.advertise("class = 'stock'")
            await asyncio.to_thread(overlay.wait_quiet)
            started = time.perf_counter()
            deadline = time.monotonic() + 60
            collectors = {
                name: asyncio.create_task(_collect(sub, expected[name], deadline))
                for name, sub in subs.items()
            }
            for quote in quotes:
                payload = f"quote {quote['symbol']} {quote['price']}".encode()
                await pub.publish(quote, payload, ack=False)
            await pub.drain()
            received = {name: await task for name, task in collectors.items()}
            elapsed = time.perf_counter() - started
            # Anything beyond the expected count would be a wrong delivery.
            for name, sub in subs.items():
                while True:
                    try:
                        await sub.get(0.2)
                        received[name] += 1
                    except Exception:
                        break
            health = await asyncio.to_thread(overlay.health)
            links = {b: _forwarded(await asyncio.to_thread(overlay.metrics, b)) for b in names}
        for client in clients:
            await client.close()
    finally:
        await asyncio.to_thread(overlay.stop)
    total = sum(received.values())
    print(
        f"\npublished {count} quotes at {names[0]} in {elapsed:.2f} s; "
        f"{total} deliveries ({total / elapsed:,.0f}/s end to end)"
    )
    print(f"\n{'subscriber':<11} {'broker':<7} {'expected':>8} {'received':>8}  filter")
    ok = True
    for name, (at, text) in SUBSCRIBERS.items():
        mark = "" if received[name] == expected[name] else "  <-- MISMATCH"
        ok &= received[name] == expected[name]
        print(
            f"{name:<11} {names[min(at, brokers - 1)]:<7} {expected[name]:>8} "
            f"{received[name]:>8}  {text}{mark}"
        )
    print("\nbroker  SRT  PRT  publications forwarded per link")
    for b in names:
        per_link = ", ".join(f"->{k}: {v}" for k, v in sorted(links[b].items())) or "-"
        print(f"{b:<7} {health[b]['srt']:>3} {health[b]['prt']:>4}  {per_link}")
    print("\n" + ("all deliveries match the oracle" if ok else "MISMATCH: see above"))
    return 0 if ok else 1
