"""Traffic logs → Parquet: the job's input step (one Parquet file per log file).

Spark reads Parquet columns in parallel at a few hundredths of a microsecond per value; it
parses JSON at several microseconds per record, the largest part of the job's time with
version-1 logs. So the job first turns every log file into a Parquet file with the flat
columns of the schema's ``fields`` (the types of :func:`arrow_schema`), in worker processes
while the JVM starts. A version-2 file becomes columns almost without Python work per
value: records are split by kind, each kind transposed with ``zip`` and handed to Arrow, and
a ``pub``'s hops are gathered from its file's route table with one ``take``. Version-1 files
(JSON Lines) go through the plain reader. Torn tails are skipped as everywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from analytics.logfile import VERSION, raw_records
from analytics.schema import LEGACY_SUFFIX, field_types, log_files, read_log

# The flat field at each position of a version-2 record, per kind (the schema's "records").
_LAYOUTS: dict[str, tuple[str, ...]] = {
    "pub": ("k", "t", "p", "s", "route", "from", "n", "conf", "dig"),
    "pubx": ("k", "t", "p", "s", "prev", "pc", "from", "next", "loc", "drop", "n", "conf", "dig"),
    "copy": ("k", "t", "p", "s", "prev", "from", "dig"),
    "sig": ("k", "t", "p", "s", "prev", "from", "dig"),
    "share": ("k", "t", "p", "s", "from", "ok", "cul", "why"),
    "link": ("k", "t", "peer"),
}


@cache
def arrow_schema() -> Any:
    """The flat record schema as Arrow (what the Parquet files hold)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    simple = {
        "int": pa.int32(),
        "long": pa.int64(),
        "double": pa.float64(),
        "string": pa.string(),
        "boolean": pa.bool_(),
        "array<string>": pa.list_(pa.string()),
    }
    nb = pa.list_(pa.struct([("id", pa.string()), ("vn", pa.string()), ("r", pa.int32())]))
    return pa.schema([(name, simple.get(kind, nb)) for name, kind in field_types().items()])


def _table(columns: dict[str, Any], rows: int) -> Any:
    """A table of the full schema from some columns (the rest null)."""
    import pyarrow as pa

    schema = arrow_schema()
    arrays = []
    for field in schema:
        values = columns.get(field.name)
        if values is None:
            arrays.append(pa.nulls(rows, field.type))
        elif isinstance(values, pa.Array):
            arrays.append(values.cast(field.type) if values.type != field.type else values)
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def table_of(path: Path) -> Any:
    """One log file (either version) as an Arrow table of flat records."""
    import pyarrow as pa

    if path.suffix != LEGACY_SUFFIX:
        try:
            table = _columns(raw_records(path))
        except (pa.ArrowException, TypeError, ValueError, KeyError, IndexError):
            table = None
        if table is not None:
            return table
    # Version 1, or a record out of layout: the careful reader decides what to keep, and a
    # record whose fields have the wrong types is dropped like a torn line.
    rows = list(read_log(path))
    try:
        return pa.Table.from_pylist(rows, schema=arrow_schema())
    except (pa.ArrowException, TypeError, ValueError):
        good = []
        for row in rows:
            try:
                pa.Table.from_pylist([row], schema=arrow_schema())
            except (pa.ArrowException, TypeError, ValueError):
                continue
            good.append(row)
        return pa.Table.from_pylist(good, schema=arrow_schema())


def _columns(records: list[Any]) -> Any | None:
    """Flat records as Arrow from a file's positional records with one short Python step
    per record (onto its kind's list), then C++ loops: each kind's tuples converted by Arrow
    as a struct array, each ``pub``'s hops gathered from the route table with one ``take``.
    None (or an exception) when a record does not fit its layout: then
    :func:`analytics.logfile.read_file` decides what to keep."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    if not records or not isinstance(records[0], tuple) or records[0][:1] != ("meta",):
        return None
    groups: dict[str, list[Any]] = {kind: [] for kind in ("meta", "route", *_LAYOUTS)}
    add = {kind: group.append for kind, group in groups.items()}
    for rec in records:
        add[rec[0]](rec)  # KeyError, TypeError: not a record of this version
    schema = arrow_schema()
    types = {field.name: field.type for field in schema}
    types["route"] = pa.int64()

    def pick(kind: str, layout: tuple[str, ...]) -> dict[str, Any]:
        """The columns of ``kind``'s records (ArrowInvalid: one does not fit ``layout``)."""
        struct = pa.struct([(name, types[name]) for name in layout])
        array = pa.array(groups[kind], type=struct)
        return dict(zip(layout, array.flatten(), strict=True))

    metas = groups["meta"]
    _, _t, b, vn, r, _vs, _nb = metas[0]
    tables = [
        _table(
            {
                "k": [m[0] for m in metas],
                "t": [m[1] for m in metas],
                "vs": [m[5] for m in metas],
                "nb": [[{"id": i, "vn": v, "r": x} for i, v, x in m[6] or ()] for m in metas],
            },
            len(metas),
        )
    ]
    routes = {rec[1]: rec[2:] for rec in groups["route"]}
    for kind, layout in _LAYOUTS.items():
        if not groups[kind]:
            continue
        data = pick(kind, layout)
        rows = len(groups[kind])
        data["k"] = pa.repeat(pa.scalar("pub" if kind == "pubx" else kind), rows)
        if kind == "pub":
            ids = data.pop("route")
            if ids.null_count or not set(pc.unique(ids).to_pylist()) <= routes.keys():
                return None
            top = max(routes) + 1
            hops = [routes.get(i, (None, None, (), (), ())) for i in range(top)]
            names = ("prev", "pc", "next", "loc", "drop")
            for name, values in zip(names, zip(*hops, strict=True), strict=True):
                data[name] = pa.array(values, types[name]).take(ids)
        tables.append(_table(data, rows))
    whole = pa.concat_tables(tables)
    rows = whole.num_rows
    whole = whole.set_column(0, "v", pa.repeat(pa.scalar(VERSION, pa.int32()), rows))
    for name, value, kind in (("b", b, pa.string()), ("vn", vn, pa.string()), ("r", r, pa.int32())):
        index = whole.schema.get_field_index(name)
        whole = whole.set_column(index, name, pa.repeat(pa.scalar(value, kind), rows))
    return whole


def compact_file(path: str, dest: str) -> int:
    """Write one log file's records to ``dest`` as Parquet; returns the record count."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    table = table_of(Path(path))
    pq.write_table(table, dest, compression="snappy")
    return int(table.num_rows)


def compact(logs: str | Path, dest: str | Path, workers: int | None = None) -> int:
    """Every log file under ``logs`` as Parquet under ``dest`` (``part-NNNNN.parquet``),
    ``workers`` files at a time; returns the record count."""
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.parquet"):
        old.unlink()
    files: Sequence[Path] = log_files(logs)
    jobs = [(str(p), str(out / f"part-{i:05d}.parquet")) for i, p in enumerate(files)]
    workers = max(1, min(workers or os.cpu_count() or 2, len(jobs)))
    if workers == 1:
        return sum(compact_file(src, dst) for src, dst in jobs)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        return sum(pool.map(compact_file, *zip(*jobs, strict=True)))
