"""The adaptive loop's record of its cycles (``DIR/adaptive-cycles.jsonl``): written by
``trellis up --adaptive`` (:mod:`broker.tools.adaptive`), read by ``trellis reconfig``.

Kept apart from the loop so that reading it costs ``trellis reconfig`` no imports of the
planner or the protocol.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

__all__ = ["CYCLES_FILE", "append_cycle", "describe_cycle", "read_cycles"]

CYCLES_FILE = "adaptive-cycles.jsonl"
"""Where the loop records its cycles, one JSON object a line, in the overlay's directory."""


def append_cycle(workdir: Path, record: dict[str, Any]) -> None:
    with (workdir / CYCLES_FILE).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


def read_cycles(workdir: Path) -> list[dict[str, Any]]:
    """The cycles recorded so far (none without a file; a torn last line is skipped)."""
    path = workdir / CYCLES_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text("utf-8").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def describe_cycle(record: dict[str, Any]) -> str:
    """One line for people: the cycle's outcome, times and what the plan changed."""
    parts = [f"cycle {record['cycle']}: {record.get('outcome', '?')}"]
    if "job_seconds" in record:
        parts.append(
            f"job {record['job_seconds']:.1f} s, plan {record.get('plan_seconds', 0):.2f} s, "
            f"moves {record.get('moves_seconds', 0):.2f} s"
        )
    plan = record.get("plan")
    if plan:
        b, a = plan["before"], plan["after"]
        parts.append(
            f"social trust {b['social_trust']:.3f} -> {a['social_trust']:.3f}, "
            f"cost {b['cost']:g} -> {a['cost']:g} (budget {plan['budget']:g}), "
            f"distrusted {','.join(plan['distrusted']) or 'none'}"
        )
    return "; ".join(parts)
