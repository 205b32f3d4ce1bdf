"""The traffic-log schema (SPEC §7), defined once for the brokers' writer and the job.

The schema itself is data: ``traffic_log_schema.json`` beside this module, shipped as
package data. The broker's writer (:mod:`broker.daemon.traffic_log`) reads the same file
at start and refuses to log in a layout the file does not describe; this module turns it
into a Spark ``StructType`` for the job and reads logs in plain Python for the reference
implementation and the tests.

Version 2 logs are framed msgpack (:mod:`analytics.logfile`, ``*.tlog``); version 1 logs
(JSON Lines, ``*.jsonl``) are still read. Both are append-only, so a crash loses at most the
batch not yet written and leaves at worst one torn last frame or line, which every reader
here skips. The flat records of the schema's ``fields`` are what readers return, what the
JSON Lines export holds and the columns the job compacts the logs to
(:mod:`analytics.compact`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import IO, Any

SCHEMA_FILE = "traffic_log_schema.json"
LOG_SUFFIX = ".tlog"
LEGACY_SUFFIX = ".jsonl"
LEGACY_VERSION = 1

OUTPUT_VERSION = 1
"""Version of the job's outputs (Parquet tables and summary.json)."""


@cache
def schema_document() -> dict[str, Any]:
    """The parsed schema file."""
    doc: dict[str, Any] = json.loads(files("analytics").joinpath(SCHEMA_FILE).read_text("utf-8"))
    return doc


def schema_version() -> int:
    """The version of the traffic-log records this code reads and writes."""
    return int(schema_document()["version"])


def field_names() -> list[str]:
    """Every field a record may carry, in schema order."""
    return [name for name, _type, _doc in schema_document()["fields"]]


def field_types() -> dict[str, str]:
    """Field name → Spark DDL type."""
    return {name: kind for name, kind, _doc in schema_document()["fields"]}


def spark_ddl() -> str:
    """The record schema as a Spark DDL string (``spark.read.schema(...)`` takes it)."""
    return ", ".join(f"`{name}` {kind}" for name, kind in field_types().items())


def record_layouts() -> dict[str, list[str]]:
    """Kind → the positional layout of its records in a version-2 file."""
    layouts: dict[str, list[str]] = schema_document()["records"]
    return layouts


def log_files(root: str | Path) -> list[Path]:
    """Every traffic-log file (either version) under ``root`` (a file or a tree), sorted."""
    path = Path(root)
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("traffic-*")
        if p.suffix in (LOG_SUFFIX, LEGACY_SUFFIX) and p.is_file()
    )


def parse_lines(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Records from lines of a version-1 JSON Lines log (or the export); skips blank, torn
    and foreign-version lines."""
    versions = (LEGACY_VERSION, schema_version())
    for line in lines:
        if not line.endswith("\n"):
            continue  # torn: the writer died inside this line
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("v") in versions:
            yield record


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """The flat records of one log file of either version (torn tail skipped)."""
    if path.suffix == LEGACY_SUFFIX:
        with path.open(encoding="utf-8", errors="replace", newline="") as handle:
            yield from parse_lines(handle)
    else:
        from analytics.logfile import read_file

        yield from read_file(path)


def read_records(root: str | Path) -> Iterator[dict[str, Any]]:
    """Every valid record under ``root``, file by file (torn last frames or lines skipped)."""
    for path in log_files(root):
        yield from read_log(path)


def export_jsonl(root: str | Path, out: IO[str]) -> int:
    """Write every record under ``root`` as JSON Lines (the documented flat schema, one
    object per line, absent fields omitted); returns the count."""
    count = 0
    for record in read_records(root):
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
        count += 1
    return count
