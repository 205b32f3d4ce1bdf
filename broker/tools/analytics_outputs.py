"""Reading what ``trellis analytics run`` wrote, for the commands that plan from it.

The tools may not import the ``analytics`` package (its Spark job is run as a subprocess), so
its outputs are read here straight from their files: the Parquet tables and ``summary.json``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

__all__ = ["OUTPUT_VERSION", "read_table"]

OUTPUT_VERSION = 1
"""The analytics outputs' version this reader understands (``summary.json``'s ``version``)."""


def read_table(out: Path, name: str) -> list[dict[str, Any]]:
    """Rows of one of the analytics job's Parquet tables (none when the job wrote none).

    Raises:
        ValueError: ``out`` is not an analytics output directory of a version we read.
    """
    summary_path = out / "summary.json"
    if not summary_path.is_file():
        raise ValueError(
            f"{out} is not an analytics output (no summary.json); run: "
            f"trellis analytics run --logs LOGS --out {out}"
        )
    try:
        version = json.loads(summary_path.read_text("utf-8")).get("version")
    except (ValueError, AttributeError):
        raise ValueError(f"{summary_path}: not an analytics summary") from None
    if version != OUTPUT_VERSION:
        raise ValueError(
            f"{summary_path}: outputs version {version!r}, this reads {OUTPUT_VERSION}"
        )
    table_dir = out / name
    if not table_dir.exists():
        return []
    # Through importlib: pyarrow ships no type information, and it loads only when asked.
    pq: Any = importlib.import_module("pyarrow.parquet")
    rows: list[dict[str, Any]] = pq.read_table(table_dir).to_pylist()
    return rows
