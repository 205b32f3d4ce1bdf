"""Memory a broker keeps per publisher it hears through a replicated VN (copy agreement).

Every publisher whose copies come from a neighbouring VN of three or more replicas gets a
:class:`security.agreement.ReplicatedStream` at the receiving broker (and at each of its
subscribers' SDKs). This measures, with ``tracemalloc``, the bytes such streams hold after
``--publications`` publications each (three copies each, all agreed), per stream, for many
streams; run it at two commits to compare. Not a test:

    .venv/bin/python bench/bench_publisher_memory.py [--streams 5000] [--publications 1]
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.wire.protocol import Forward
from security.agreement import ReplicatedStream

REPLICAS = ("b0.0", "b0.1", "b0.2")


def bytes_per_stream(streams: int, publications: int) -> float:
    """Traced bytes held per stream once each agreed on ``publications`` publications."""
    kept: dict[tuple[str, str], ReplicatedStream[str, Forward]] = {}
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(streams):
        publisher = f"client-{i:012x}"
        stream = kept[("b0", publisher)] = ReplicatedStream(1)
        for seq in range(1, publications + 1):
            msg = Forward(publisher, seq, {"class": "x"}, b"p", None)
            content = (msg.payload, None, (("class", "x"),), (str,))
            for replica in REPLICAS:
                stream.offer(replica, seq, content, msg)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / streams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--publications", type=int, nargs="+", default=[1, 10, 100, 10000])
    args = parser.parse_args()
    for publications in args.publications:
        streams = max(1, min(args.streams, 2_000_000 // max(1, publications)))
        per = bytes_per_stream(streams, publications)
        print(
            f"{publications:>6} publication(s) per publisher: {per:10,.0f} B per stream "
            f"({streams} streams)"
        )


if __name__ == "__main__":
    main()
