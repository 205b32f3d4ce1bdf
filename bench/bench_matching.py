"""Benchmark: MatchIndex against a linear scan over every filter, in the same process (SPEC §10).

The workload is a stock-quote feed: tens of classes, hundreds of symbols, subscriptions mostly
``class = 'stockN' and symbol = 'S…' and price < x`` with some price bands, class-wide range
subscriptions, symbol prefixes and ``in`` sets. Each publication's match set is checked against
the scan, so the figures cannot come from a wrong answer.

Run: ``.venv/bin/python bench/bench_matching.py`` (``--sizes 10000 100000`` by default).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from collections.abc import Callable

from broker.language.filters import Filter, Value
from broker.language.grammar import parse_filter
from broker.routing.matching import MatchIndex

CLASSES = 30
SYMBOLS = 400


def make_filter(rng: random.Random) -> Filter:
    """Draw one subscription from the workload mix."""
    cls = f"stock{rng.randrange(CLASSES)}"
    symbol = f"S{rng.randrange(SYMBOLS)}"
    price = rng.randrange(1, 1000)
    roll = rng.random()
    if roll < 0.70:
        text = f"class = '{cls}' and symbol = '{symbol}' and price < {price}"
    elif roll < 0.85:
        text = (
            f"class = '{cls}' and symbol = '{symbol}' and price > {price} and price <= {price + 50}"
        )
    elif roll < 0.95:
        volume = rng.randrange(0, 10_000)
        text = f"class = '{cls}' and price >= {price} and volume > {volume}"
    elif roll < 0.98:
        text = f"class = '{cls}' and symbol prefix '{symbol[:2]}'"
    else:
        others = ", ".join(f"'S{rng.randrange(SYMBOLS)}'" for _ in range(3))
        text = f"symbol in ('{symbol}', {others}) and price < {price}"
    return parse_filter(text)


def make_publication(rng: random.Random) -> dict[str, Value]:
    """Draw one quote."""
    return {
        "class": f"stock{rng.randrange(CLASSES)}",
        "symbol": f"S{rng.randrange(SYMBOLS)}",
        "price": round(rng.uniform(0, 1000), 2),
        "volume": rng.randrange(0, 10_000),
    }


def time_each(
    fn: Callable[[dict[str, Value]], object], pubs: list[dict[str, Value]]
) -> list[float]:
    """Return the time of ``fn(pub)`` for each publication, in microseconds, sorted."""
    samples = []
    for pub in pubs:
        start = time.perf_counter_ns()
        fn(pub)
        samples.append((time.perf_counter_ns() - start) / 1000)
    return sorted(samples)


def run(size: int, index_pubs: int, scan_pubs: int, seed: int) -> dict[str, float]:
    """Build ``size`` subscriptions and time both matchers on the same publications."""
    rng = random.Random(seed)
    filters = [(key, make_filter(rng)) for key in range(size)]
    start = time.perf_counter()
    index: MatchIndex[int] = MatchIndex()
    for key, flt in filters:
        index.add(key, flt)
    build_s = time.perf_counter() - start

    def scan(attrs: dict[str, Value]) -> set[int]:
        return {key for key, flt in filters if flt.matches(attrs)}

    pubs = [make_publication(rng) for _ in range(index_pubs)]
    matched = [len(index.match(pub)) for pub in pubs]
    for pub in pubs[:scan_pubs]:
        assert index.match(pub) == scan(pub), pub
    index_us = time_each(index.match, pubs)
    scan_us = time_each(scan, pubs[:scan_pubs])
    return {
        "size": size,
        "build_s": build_s,
        "index_us": statistics.median(index_us),
        "index_mean_us": statistics.mean(index_us),
        "index_p99_us": index_us[int(len(index_us) * 0.99)],
        "scan_us": statistics.median(scan_us),
        "ratio": statistics.median(scan_us) / statistics.median(index_us),
        "matches": statistics.mean(matched),
    }


def main() -> None:
    """Parse arguments, run every size, print one line per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--index-pubs", type=int, default=5_000)
    parser.add_argument("--scan-pubs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, seed {args.seed}")
    print(
        "subscriptions  build s  index µs: median    mean     p99  scan µs: median   ratio"
        "  mean matches"
    )
    for size in args.sizes:
        r = run(size, args.index_pubs, args.scan_pubs, args.seed)
        print(
            f"{r['size']:>13,}  {r['build_s']:>7.2f}  {r['index_us']:>16.1f}  "
            f"{r['index_mean_us']:>6.1f}  {r['index_p99_us']:>6.0f}  {r['scan_us']:>15.0f}  "
            f"{r['ratio']:>6.0f}x  {r['matches']:>12.1f}"
        )


if __name__ == "__main__":
    main()
