"""`trellis demo`: the embedded default job.

Starts a real broker process, attaches subscribers with different content filters and a
publisher streaming stock quotes, then prints what each subscriber got next to what an
oracle computed from the filters says it should have got.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from broker.client import Client, Subscription
from broker.filters import parse_filter
from broker.launcher import start_broker

SUBSCRIBERS = {
    "cheap-acme": "class = 'stock' and symbol = 'ACME' and price < 50",
    "tech-range": "class = 'stock' and symbol in ('INIT', 'TECH') and price >= 20 and price <= 80",
    "all-stock": "class = 'stock'",
    "a-names": "class = 'stock' and symbol prefix 'A'",
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


async def run_demo(workdir: Path, count: int = 2000, seed: int = 7) -> int:
    rng = random.Random(seed)
    broker = start_broker(workdir, "demo-broker")
    print(
        f"broker demo-broker running as pid {broker.pid} on {broker.endpoint} (logs in {workdir})"
    )
    try:
        quotes = [
            {
                "class": "stock",
                "symbol": rng.choice(SYMBOLS),
                "price": round(rng.uniform(1, 100), 2),
            }
            for _ in range(count)
        ]
        filters = {name: parse_filter(text) for name, text in SUBSCRIBERS.items()}
        expected = {name: sum(f.matches(q) for q in quotes) for name, f in filters.items()}
        clients = [Client(broker.endpoint, client_id=f"sub-{name}") for name in SUBSCRIBERS]
        for c in clients:
            await c.connect()
        subs = [c.subscribe(filters[name]) for c, name in zip(clients, SUBSCRIBERS, strict=True)]
        for s in subs:
            await s.__aenter__()
        async with Client(broker.endpoint, client_id="ticker") as pub:
            await pub.advertise("class = 'stock'")
            started = time.perf_counter()
            deadline = time.monotonic() + 30
            collectors = [
                asyncio.create_task(_collect(s, expected[name], deadline))
                for s, name in zip(subs, SUBSCRIBERS, strict=True)
            ]
            for quote in quotes:
                await pub.publish(
                    quote, f"quote {quote['symbol']} {quote['price']}".encode(), ack=False
                )
            await pub.drain()
            received = dict(zip(SUBSCRIBERS, await asyncio.gather(*collectors), strict=True))
            elapsed = time.perf_counter() - started
        for s in subs:
            await s.unsubscribe()
        for c in clients:
            await c.close()
    finally:
        code = broker.stop()
    total = sum(received.values())
    print(
        f"\npublished {count} quotes in {elapsed:.2f} s; "
        f"{total} deliveries ({total / elapsed:,.0f}/s)"
    )
    print(f"{'subscriber':<12} {'expected':>9} {'received':>9}  filter")
    ok = True
    for name, text in SUBSCRIBERS.items():
        mark = "" if received[name] == expected[name] else "  <-- MISMATCH"
        ok &= received[name] == expected[name]
        print(f"{name:<12} {expected[name]:>9} {received[name]:>9}  {text}{mark}")
    print(
        f"broker stopped with exit code {code}; "
        + ("all deliveries match the oracle" if ok else "MISMATCH")
    )
    return 0 if ok and code == 0 else 1
