"""Traffic logs → Parquet: the job's input step (one Parquet file per log file).

Spark reads Parquet columns in parallel at a few hundredths of a microsecond per value; it
parses JSON at several microseconds per record, the largest part of the job's time with
version-1 logs. So the job first turns every log file into a Parquet file with the flat
columns of the schema's ``fields`` (the types of :func:`arrow_schema`), in worker processes
while the JVM starts. A version-2 file becomes columns almost without Python work per
value: each record's fields go onto its kind's list, each column is a slice of that list
handed to Arrow, and a ``pub``'s hops are gathered from its file's route table with one
``take``. Version-1 files
(JSON Lines) go through the plain reader. Torn tails are skipped as everywhere else.

What the job reads (:func:`job_tables`) keeps the routes apart, as the brokers write them:
the records carry a route id ``rid`` (unique across the compacted files) and ``hl`` (the
route delivered or dropped locally) instead of the ``next``, ``loc`` and ``drop`` arrays, and
a small routes table per file holds each route's hops once. Arrays of strings cost Spark
most per row (in the shuffle, the cache and the set operations of the local views); a route
is shared by thousands of publications. Then :func:`encode` turns the names of the big
table into 64-bit codes (:func:`name_code`) and sets the ``meta`` and ``link`` records and
a names table apart: what :func:`compact_file` writes and the job loads.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from analytics.logfile import VERSION, WIDTHS, unpacked_fields
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


HOPS = ("next", "loc", "drop")
"""The flat fields that the job reads from the routes table, not from each record."""
ROUTE_ID_BITS = 32
"""A compacted file's route ids are its index shifted by this, plus the id in the file."""


@cache
def records_schema() -> Any:
    """What the job reads of each record: the flat schema without the hops' arrays, with
    ``rid`` (its route, for a ``pub``) and ``hl`` (delivered or dropped locally)."""
    import pyarrow as pa

    kept = [field for field in arrow_schema() if field.name not in HOPS]
    return pa.schema([*kept, ("rid", pa.int64()), ("hl", pa.bool_())])


@cache
def routes_schema() -> Any:
    """The routes table: a route's id and hops (previous hop and the three arrays)."""
    import pyarrow as pa

    flat = arrow_schema()
    return pa.schema(
        [("rid", pa.int64()), flat.field("prev"), *(flat.field(name) for name in HOPS)]
    )


def spark_ddl(schema: Any) -> str:
    """An Arrow schema of the compacted tables as a Spark DDL string."""
    import pyarrow as pa

    types = {**field_types(), "rid": "long", "hl": "boolean", "h": "long", "name": "string"}

    def ddl(field: Any) -> str:
        if pa.types.is_int8(field.type):
            return "tinyint"
        if pa.types.is_int64(field.type):
            return "long"
        return types[field.name]

    return ", ".join(f"`{field.name}` {ddl(field)}" for field in schema)


def _table(columns: dict[str, Any], rows: int, schema: Any = None) -> Any:
    """A table of ``schema`` (default: the flat one) from some columns (the rest null)."""
    import pyarrow as pa

    schema = schema or arrow_schema()
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
    fast = _fast(path, None)
    if fast is not None:
        return fast[0]
    return _checked(list(read_log(path)), arrow_schema())


def job_tables(path: Path, index: int) -> tuple[Any, Any]:
    """One log file (either version) as the job reads it: its records (:func:`records_schema`)
    and its routes (:func:`routes_schema`), route ids starting at ``index << 32``."""
    fast = _fast(path, index << ROUTE_ID_BITS)
    if fast is not None:
        return fast
    rows = list(read_log(path))
    routes: dict[tuple[Any, ...], int] = {}
    base = index << ROUTE_ID_BITS
    for row in rows:
        if row["k"] == "pub":
            hops = tuple(tuple(row.pop(name, None) or ()) for name in HOPS)
            key = (row.get("prev"), *hops)
            rid = routes.get(key)
            if rid is None:
                rid = routes[key] = base + len(routes)
            row["rid"], row["hl"] = rid, bool(hops[1] or hops[2])
    route_rows = [
        {"rid": rid, "prev": key[0], **{n: list(h) for n, h in zip(HOPS, key[1:], strict=True)}}
        for key, rid in routes.items()
    ]
    return _checked(rows, records_schema()), _checked(route_rows, routes_schema())


def _fast(path: Path, base: int | None) -> tuple[Any, Any] | None:
    """:func:`_columns` of a version-2 file, or None where the careful reader must decide."""
    import pyarrow as pa

    if path.suffix == LEGACY_SUFFIX:
        return None
    try:
        flat = _grouped(path)
        return None if flat is None else _columns(flat, base)
    except (pa.ArrowException, TypeError, ValueError, KeyError, IndexError):
        return None


def _grouped(path: Path) -> dict[str, list[Any]] | None:
    """A version-2 file's records as one flat list of fields per kind, in file order (each
    list a run of records of its kind's width), or None unless the first record is a
    ``meta``: the records of :func:`analytics.logfile.raw_records`, torn tail skipped
    alike, without a tuple per record. Columns are then slices (``flat[j::width]``), cut at
    C speed; a tuple per record and Arrow's struct conversion cost three times as much."""
    items = unpacked_fields(path)
    flat: dict[str, list[Any]] = {kind: [] for kind in WIDTHS}
    extend = {kind: group.extend for kind, group in flat.items()}
    widths = WIDTHS
    at, end = 0, len(items)
    while at < end:
        kind = items[at]
        try:
            width = widths[kind]
        except (KeyError, TypeError):
            break
        if at + width > end:
            break
        extend[kind](items[at : at + width])
        at += width
    if not flat["meta"] or items[0] != "meta":
        return None
    return flat


def _checked(rows: list[dict[str, Any]], schema: Any) -> Any:
    """Rows from the careful reader (version 1, or a record out of layout) as a table; a row
    whose fields have the wrong types is dropped like a torn line."""
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowException, TypeError, ValueError):
        good = []
        for row in rows:
            try:
                pa.Table.from_pylist([row], schema=schema)
            except (pa.ArrowException, TypeError, ValueError):
                continue
            good.append(row)
        return pa.Table.from_pylist(good, schema=schema)


def _columns(flat: dict[str, list[Any]], base: int | None) -> tuple[Any, Any] | None:
    """Records as Arrow from a file's fields grouped by kind (:func:`_grouped`): each
    column a slice of its kind's list converted by Arrow, each ``pub``'s route gathered
    from the route table with one ``take``.

    ``base`` None: the flat records (the hops expanded into every ``pub``), and no routes
    table. Else the job's records and routes tables (see :func:`job_tables`), route ids
    ``base`` + the id in the file. None (or an exception) when a record does not fit its
    layout: then :func:`analytics.logfile.read_file` decides what to keep."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    schema = arrow_schema() if base is None else records_schema()
    types = {field.name: field.type for field in arrow_schema()}
    types["route"] = pa.int64()

    def tuples(kind: str) -> list[tuple[Any, ...]]:
        """The records of a (rare) kind as tuples."""
        width, fields = WIDTHS[kind], flat[kind]
        return list(zip(*(fields[j::width] for j in range(width)), strict=True))

    def pick(kind: str, layout: tuple[str, ...]) -> dict[str, Any]:
        """The columns of ``kind``'s records (ArrowInvalid: one does not fit ``layout``)."""
        fields, width = flat[kind], len(layout)
        return {
            name: pa.array(fields[j::width], type=types[name])
            for j, name in enumerate(layout)
            if name != "k"
        }

    metas = tuples("meta")
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
            schema,
        )
    ]
    routes = {rec[1]: rec[2:] for rec in tuples("route")}
    # Routed mode: the file's routes, then one per distinct inline hops of a pubx record.
    route_ids = sorted(routes)
    hops_of = [routes[id_] for id_ in route_ids]
    inline_at: dict[tuple[Any, ...], int] = {}
    for kind, layout in _LAYOUTS.items():
        if not flat[kind]:
            continue
        data = pick(kind, layout)
        rows = len(flat[kind]) // len(layout)
        data["k"] = pa.repeat(pa.scalar("pub" if kind == "pubx" else kind), rows)
        if kind == "pub":
            ids = data.pop("route")
            if ids.null_count or not set(pc.unique(ids).to_pylist()) <= routes.keys():
                return None
            if base is None:
                top = max(routes) + 1
                hops = [routes.get(i, (None, None, (), (), ())) for i in range(top)]
                names = ("prev", "pc", "next", "loc", "drop")
                for name, values in zip(names, zip(*hops, strict=True), strict=True):
                    data[name] = pa.array(values, types[name]).take(ids)
            else:
                at = pc.index_in(ids, value_set=pa.array(route_ids, pa.int64()))
                for i, name in enumerate(("prev", "pc")):
                    data[name] = pa.array([h[i] for h in hops_of], types[name]).take(at)
                local = [bool(h[3]) or bool(h[4]) for h in hops_of]
                data["hl"] = pa.array(local, pa.bool_()).take(at)
                data["rid"] = pc.add(at.cast(pa.int64()), base)
        elif kind == "pubx" and base is not None:
            places = []
            inline_records = tuples(kind)
            for rec in inline_records:
                inline = (rec[4], rec[5], *(tuple(x or ()) for x in rec[7:10]))
                place = inline_at.get(inline)
                if place is None:
                    place = inline_at[inline] = len(hops_of)
                    hops_of.append(inline)
                places.append(place)
            data["rid"] = pa.array([base + x for x in places], pa.int64())
            data["hl"] = pa.array([bool(rec[8]) or bool(rec[9]) for rec in inline_records])
        tables.append(_table(data, rows, schema))
    whole = pa.concat_tables(tables)
    rows = whole.num_rows
    whole = whole.set_column(0, "v", pa.repeat(pa.scalar(VERSION, pa.int32()), rows))
    for name, value, kind in (("b", b, pa.string()), ("vn", vn, pa.string()), ("r", r, pa.int32())):
        index = whole.schema.get_field_index(name)
        whole = whole.set_column(index, name, pa.repeat(pa.scalar(value, kind), rows))
    if base is None:
        return whole, None
    columns = list(zip(*hops_of, strict=True)) if hops_of else [(), (), (), (), ()]
    route_table = _table(
        {
            "rid": [base + x for x in range(len(hops_of))],
            "prev": columns[0],
            **{
                name: [list(h or ()) for h in values]
                for name, values in zip(HOPS, columns[2:], strict=True)
            },
        },
        len(hops_of),
        routes_schema(),
    )
    return whole, route_table


RECORDS_DIR, ROUTES_DIR = "records", "routes"
"""Under the compaction's destination: the job's records and routes tables."""
RARE_DIR, NAMES_DIR = "rare", "names"
"""Under the compaction's destination: the meta and link records, and the names table."""

KINDS: dict[str, int] = {"pub": 0, "copy": 1, "sig": 2, "share": 3}
"""The kinds of the numeric records table (:func:`encode`), as codes."""
NAMED = ("b", "vn", "p", "prev", "from", "cul")
"""The string columns of the records that the numeric table holds as name codes."""
NUMERIC = ("k", "t", "b", "vn", "p", "s", "prev", "pc", "from", "rid", "hl", "dig", "ok", "cul")
"""The columns of the numeric records table, in order: what the job's tables use."""
RARE = ("k", "t", "b", "vn", "nb", "peer")
"""The columns of the rare (``meta`` and ``link``) records the job uses, names kept."""


def name_code(name: str) -> int:
    """A name's code: the first 8 bytes of its BLAKE2b digest as a signed 64-bit integer.

    Deterministic in every process (unlike ``hash``), so files compacted apart agree
    without a shared dictionary; the job checks that no two names it saw share a code
    and fails loudly if they do (about 10^-15 for a thousand names)."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@cache
def numeric_schema() -> Any:
    """The numeric records table: names as codes (int64), the kind as a small code."""
    import pyarrow as pa

    flat = records_schema()
    fields = []
    for name in NUMERIC:
        if name == "k":
            fields.append(pa.field("k", pa.int8()))
        elif name in NAMED:
            fields.append(pa.field(name, pa.int64()))
        else:
            fields.append(flat.field(name))
    return pa.schema(fields)


@cache
def rare_schema() -> Any:
    """The rare records table (meta and link records, names as strings)."""
    import pyarrow as pa

    flat = records_schema()
    return pa.schema([flat.field(name) for name in RARE])


@cache
def names_schema() -> Any:
    """The names table: every name the numeric table codes, with its code."""
    import pyarrow as pa

    return pa.schema([("h", pa.int64()), ("name", pa.string())])


def encode(records: Any) -> tuple[Any, Any, Any]:
    """A records table (:func:`records_schema`) as the job reads it: the numeric table
    (``pub``, ``copy``, ``sig`` and ``share`` records, names coded by :func:`name_code`),
    the rare table (``meta`` and ``link``) and the names table of the codes used.

    Spark aggregates and shuffles fixed-width columns several times faster than strings,
    and can keep a min or max of them in a hash aggregation (of strings it sorts). Each
    column is dictionary-encoded by Arrow, so only its few distinct names are hashed in
    Python. Records without a kind or a time are dropped, as the job always did."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if records["k"].null_count or records["t"].null_count:
        records = records.filter(pc.and_(pc.is_valid(records["k"]), pc.is_valid(records["t"])))
    is_rare = pc.is_in(records["k"], value_set=pa.array(["meta", "link"]))
    # Columns first, then rows: filtering the unused columns (lists, reasons) cost most.
    rare = records.select(list(RARE)).filter(is_rare)
    main = records.select(list(NUMERIC)).filter(pc.invert(is_rare))
    known: dict[str, int] = {}

    def codes(column: Any) -> Any:
        encoded = pc.dictionary_encode(column).combine_chunks()
        words = encoded.dictionary.to_pylist()
        for word in words:
            if word not in known:
                known[word] = name_code(word)
        table = pa.array([known[w] for w in words], pa.int64())
        return table.take(encoded.indices)

    kinds = main["k"].combine_chunks()
    kind_codes = pa.array(list(KINDS.values()), pa.int8())
    k = pc.index_in(kinds, value_set=pa.array(list(KINDS))).cast(pa.int32())
    columns = []
    for field in numeric_schema():
        if field.name == "k":
            columns.append(pc.fill_null(kind_codes.take(k), -1))  # -1: a kind no table uses
        elif field.name in NAMED:
            columns.append(codes(main[field.name]))
        else:
            columns.append(main[field.name].combine_chunks())
    numeric = pa.Table.from_arrays(columns, schema=numeric_schema())
    for row in rare.select(["b", "vn", "nb", "peer"]).to_pylist():
        words = [row["b"], row["vn"], row["peer"]]
        words += [x for n in row["nb"] or () for x in (n["id"], n["vn"])]
        for word in words:
            if word is not None and word not in known:
                known[word] = name_code(word)
    names = pa.Table.from_arrays(
        [pa.array(list(known.values()), pa.int64()), pa.array(list(known), pa.string())],
        schema=names_schema(),
    )
    return numeric, rare, names


def compact_file(path: str, dest: str, index: int) -> int:
    """Write one log file as the job reads it (:func:`job_tables`, :func:`encode`) to
    ``dest``'s records, rare, routes and names directories, ``part-<index>.parquet`` in
    each; returns the record count."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    records, routes = job_tables(Path(path), index)
    numeric, rare, names = encode(records)
    name = f"part-{index:05d}.parquet"
    root = Path(dest)
    for sub, table in (
        (RECORDS_DIR, numeric),
        (RARE_DIR, rare),
        (ROUTES_DIR, routes),
        (NAMES_DIR, names),
    ):
        pq.write_table(table, root / sub / name, compression="snappy")
    return int(numeric.num_rows + rare.num_rows)


def compact(logs: str | Path, dest: str | Path, workers: int | None = None) -> int:
    """Every log file under ``logs`` as the job's Parquet tables under ``dest``, ``workers``
    files at a time; returns the record count."""
    out = Path(dest)
    for sub in (RECORDS_DIR, ROUTES_DIR, RARE_DIR, NAMES_DIR):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for old in (out / sub).glob("part-*.parquet"):
            old.unlink()
    files: Sequence[Path] = log_files(logs)
    jobs = [(str(p), str(out), i) for i, p in enumerate(files)]
    workers = max(1, min(workers or os.cpu_count() or 2, len(jobs)))
    if workers == 1:
        return sum(compact_file(*job) for job in jobs)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        return sum(pool.map(compact_file, *zip(*jobs, strict=True)))
