"""Where a broker's memory goes (``/debug/memory``), for an operator chasing growth.

It reads Python's own allocation tracer, which the standard ``PYTHONTRACEMALLOC=N``
environment variable starts with the broker (N frames kept per allocation; tracing slows
the broker and costs memory, so it is off unless asked for). Each request reports the
allocation sites holding most memory now and those that grew most since the previous
request, so two requests some minutes apart show what a long run accumulates.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

_HIDDEN = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<unknown>"),
)


class MemoryProbe:
    """Snapshots of the tracer, each compared with the one before it."""

    def __init__(self, limit: int = 25) -> None:
        self.limit = limit
        self.previous: tracemalloc.Snapshot | None = None

    def report(self) -> dict[str, Any]:
        """The ``/debug/memory`` document (blocking for as long as a snapshot takes: call
        it off the event loop)."""
        if not tracemalloc.is_tracing():
            return {
                "tracing": False,
                "hint": "start the broker with PYTHONTRACEMALLOC=1 (or N frames) in its "
                "environment to trace allocations",
            }
        snapshot = tracemalloc.take_snapshot().filter_traces(_HIDDEN)
        key = "traceback" if tracemalloc.get_traceback_limit() > 1 else "lineno"
        top = [
            {"where": _where(s.traceback), "bytes": s.size, "count": s.count}
            for s in snapshot.statistics(key)[: self.limit]
        ]
        growth = []
        if self.previous is not None:
            growth = [
                {
                    "where": _where(d.traceback),
                    "bytes": d.size,
                    "grew_bytes": d.size_diff,
                    "grew_count": d.count_diff,
                }
                for d in snapshot.compare_to(self.previous, key)[: self.limit]
            ]
        self.previous = snapshot
        current, peak = tracemalloc.get_traced_memory()
        return {
            "tracing": True,
            "traced_bytes": current,
            "peak_bytes": peak,
            "top": top,
            "growth_since_last_request": growth,
        }


def _where(trace: tracemalloc.Traceback) -> list[str]:
    """The allocation's frames, innermost last."""
    return [f"{frame.filename}:{frame.lineno}" for frame in trace]
