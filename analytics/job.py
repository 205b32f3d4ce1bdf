"""The traffic-log job (SPEC §7) on PySpark DataFrames: classes, local views, failures, trust.

``trellis analytics run --logs DIR --out DIR`` runs it in local mode; on a cluster the same
file runs under spark-submit (the driver's Python must have the project installed)::

    PYSPARK_PYTHON=.venv/bin/python spark-submit --master spark://HOST:7077 \
        "$(.venv/bin/python -c 'import analytics.job as j; print(j.__file__)')" \
        --logs DIR --out DIR

Every aggregation is a DataFrame operation executed by Spark; the driver only collects the
few rows of the summary. The semantics, table by table, are those of
:mod:`analytics.reference` (the pure-Python reference the tests compare this job with).

Outputs under ``--out``: one Parquet directory per table (``classes``, ``local_views``,
``trust_feedback``, ``broker_failures``, ``link_failures``, ``path_failures``) and
``summary.json``; both carry ``version`` (:data:`analytics.schema.OUTPUT_VERSION`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from analytics.compact import (
    KINDS,
    NAMES_DIR,
    RARE_DIR,
    RECORDS_DIR,
    ROUTES_DIR,
    compact,
    names_schema,
    numeric_schema,
    rare_schema,
    routes_schema,
    spark_ddl,
)
from analytics.reference import FEEDBACK_COUNTS, TABLES
from analytics.schema import OUTPUT_VERSION, schema_version

PUB, COPY, SIG, SHARE = (KINDS[kind] for kind in ("pub", "copy", "sig", "share"))
"""The kind codes of the numeric records (:func:`analytics.compact.encode`)."""
RECORDS_PER_PARTITION = 500_000
"""Records per shuffle partition: a few seconds of work per task on this machine, so small
logs run as few tasks (each stage costs tens of milliseconds per task to schedule) and large
ones in enough partitions to fit in memory (30M records failed in 4)."""
INPUT_DIR = "_input"
"""Under ``--out``: the logs compacted to Parquet (:mod:`analytics.compact`), removed after."""

Progress = Callable[[str], None]


class NameClash(RuntimeError):
    """Two names the logs hold share a code (:func:`analytics.compact.name_code`)."""


def session(master: str | None = None, app: str = "trellis-analytics", **conf: str) -> Any:
    """A SparkSession for the job: ``master`` when given, else the one spark-submit set,
    else local[*] (which needs only the pyspark package and a JVM)."""
    from pyspark.sql import SparkSession

    cores = os.cpu_count() or 2
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    builder = (
        builder.appName(app)
        # 16+ partitions and 8 GiB: 30M records failed with 4 and 3 GiB on 2 cores.
        .config("spark.sql.shuffle.partitions", str(max(16, 4 * cores)))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", conf.pop("spark.driver.memory", "8g"))
        .config("spark.sql.session.timeZone", "UTC")
        # The records are hash-partitioned by publication (p, s) once; joins keyed by
        # (p, s) and more then reuse that partitioning instead of shuffling again.
        .config("spark.sql.requireAllClusterKeysForCoPartition", "false")
        # Cached frames are read a few times each, right away: compressing them cost more
        # (1M records: 24 s against 7 s to cache the records) than it saved.
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        # A publication's subscriber VNs are a collect_set per publication: past this many
        # keys per task Spark sorts instead of hashing (default 128, i.e. always here).
        .config("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", str(1 << 18))
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Inputs(NamedTuple):
    """The compacted logs as DataFrames (see :func:`analytics.compact.encode`)."""

    records: Any
    """pub, copy, sig and share records, names as codes (fixed-width columns only)."""
    rare: Any
    """meta and link records, names as strings."""
    routes: Any
    """Each route's hops (names as strings), by ``rid``."""
    names: Any
    """Code ``h`` → ``name`` of every name the records hold."""


def load(spark: Any, compacted: str | Path) -> Inputs:
    """The tables compacted under ``compacted`` (see :func:`analytics.compact.compact`)."""
    root = Path(compacted)

    def read(sub: str, schema: Any) -> Any:
        return spark.read.schema(spark_ddl(schema)).parquet(str(root / sub))

    return Inputs(
        read(RECORDS_DIR, numeric_schema()),
        read(RARE_DIR, rare_schema()),
        read(ROUTES_DIR, routes_schema()),
        read(NAMES_DIR, names_schema()).distinct(),
    )


def check_names(names: Any) -> None:
    """Raise :class:`NameClash` if two names share a code (the tables would merge them)."""
    from pyspark.sql import functions as F

    clashes = (
        names.groupBy("h")
        .agg(F.countDistinct("name").alias("n"))
        .where(F.col("n") > 1)
        .select("h")
        .limit(5)
        .collect()
    )
    if clashes:
        raise NameClash(f"names share a code in the logs: {[r['h'] for r in clashes]}")


def compute(
    records: Any,
    routes: Any,
    width: float,
    timely: float = 1.0,
    rare: Any | None = None,
    names: Any | None = None,
) -> dict[str, Any]:
    """Every output table as a DataFrame (same semantics as :func:`analytics.reference.compute`).

    ``records``: the numeric records (:attr:`Inputs.records`, names as codes), best
    partitioned by (p, s); ``routes``: the hops of every ``rid`` the pub records name;
    ``rare``: the ``meta`` and ``link`` records; ``names``: code → name, without clashes
    (:func:`check_names`). The big frames carry codes only; names come back on the small
    aggregated tables (Spark hashes and compares 8-byte codes several times faster than
    strings, and keeps their min or max in a hash aggregation where strings need a sort)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if rare is None or names is None:
        raise ValueError("compute needs the rare records and the names")
    col, lit = F.col, F.lit

    def window_of(t: Any) -> Any:
        return F.floor(t / lit(width)) * lit(width)

    def ratio(num: Any, den: Any) -> Any:
        return F.when(den > 0, num / den)

    # Codes ↔ names. ``rank`` orders the names as strings do: a publication's edge VN is
    # the least *name* among its edge records (the reference's min), not the least code.
    by_code = names.select("h", "name", F.row_number().over(Window.orderBy("name")).alias("rank"))
    by_code = by_code.cache()

    def named(df: Any, *columns: str, key: str = "h") -> Any:
        """``df`` with each code (or ``key`` = "rank") column replaced by its name."""
        for column in columns:
            lookup = F.broadcast(by_code.select(col(key).alias("_c"), col("name").alias("_n")))
            df = (
                df.join(lookup, df[column] == lookup["_c"], "left")
                .withColumn(column, col("_n"))
                .drop("_c", "_n")
            )
        return df

    def coded(df: Any, *columns: str) -> Any:
        """``df`` with each name column replaced by its code."""
        for column in columns:
            lookup = F.broadcast(by_code.select(col("name").alias("_n"), col("h").alias("_c")))
            df = (
                df.join(lookup, df[column] == lookup["_n"], "left")
                .withColumn(column, col("_c"))
                .drop("_c", "_n")
            )
        return df

    def named_sets(df: Any, column: str) -> Any:
        """``df`` with an array of codes replaced by the sorted array of their names (done
        once per distinct array: ``df`` is small, an output table)."""
        sets = df.select(column).distinct()
        lookup = F.broadcast(by_code.select(col("h").alias("_c"), col("name").alias("_n")))
        spelled = (
            sets.select(column, F.explode(column).alias("_c"))
            .join(lookup, "_c", "left")
            .groupBy(column)
            .agg(F.array_sort(F.collect_list("_n")).alias("_names"))
        )
        return df.join(spelled, column).withColumn(column, col("_names")).drop("_names")

    recs = records
    meta = rare.where(col("k") == "meta")
    members = (
        meta.select(col("b").alias("broker"), col("vn").alias("broker_vn"))
        .unionByName(
            meta.select(F.explode("nb").alias("n")).select(
                col("n.id").alias("broker"), col("n.vn").alias("broker_vn")
            )
        )
        .distinct()
    )
    members_coded = coded(members, "broker", "broker_vn").cache()
    pubs = recs.where(col("k") == PUB)
    vn_rank = F.broadcast(by_code.select(col("h").alias("vn"), col("rank").alias("vr")))
    pub_info = (
        pubs.select("p", "s", "t", "vn", "pc", "hl")
        .join(vn_rank, "vn", "left")
        .groupBy("p", "s")
        .agg(
            F.min("t").alias("t0"),
            F.min(F.when(col("pc"), col("vr"))).alias("src"),  # a rank: named(key="rank")
            F.array_sort(F.collect_set(F.when(col("hl"), col("vn")))).alias("dsts"),  # codes
        )
    )
    pub_info = pub_info.withColumn("w", window_of(col("t0"))).drop("t0").cache()
    win = pub_info.select("p", "s", col("w").alias("pw"))

    def windowed(df: Any) -> Any:
        """``df`` with ``w``: its publication's window, else its own time's."""
        return (
            df.join(win.hint("shuffle_hash"), ["p", "s"], "left")
            .withColumn("w", F.coalesce(col("pw"), window_of(col("t"))))
            .drop("pw")
        )

    classes = (
        pub_info.where(col("src").isNotNull() & (F.size("dsts") > 0))
        .groupBy("w", "src", "dsts")
        .agg(F.count(lit(1)).alias("demand"))
    )
    classes = named_sets(named(classes, "src", key="rank"), "dsts")

    # A route's members and drops are computed once per route (a few hundred), not per
    # publication: publications are counted per (window, broker, route) first.
    members_set = F.array_sort(
        F.array_distinct(
            F.concat(
                F.array(col("prev")),
                F.coalesce(col("next"), F.array()),
                F.coalesce(col("loc"), F.array()),
                F.coalesce(col("drop"), F.array()),
            )
        )
    )
    hops = routes.select(
        "rid", members_set.alias("members"), F.coalesce(F.size("drop"), lit(0)).alias("nd")
    )
    per_route = (
        windowed(pubs.select("p", "s", "t", "b", "rid"))
        .groupBy("w", col("b").alias("broker"), "rid")
        .agg(F.count(lit(1)).alias("c"))
        .join(F.broadcast(hops), "rid")
        .cache()
    )
    local_views = named(
        per_route.where(F.size("members") > 1)
        .groupBy("w", "broker", "members")
        .agg(F.sum("c").alias("demand")),
        "broker",
    )
    dropped = named(
        per_route.where(col("nd") > 0)
        .groupBy("w", "broker")
        .agg(F.sum(col("nd") * col("c")).alias("dropped_deliveries")),
        "broker",
    )

    # What each evaluator e saw of each publication (p, s) it routed from a neighbour VN,
    # in hash aggregations of fixed-width columns only: per (e, p, s, digest) the copies;
    # per (e, p, s, count) the least digest with that many copies, so that the majority
    # digest (most copies, then the least digest) is a max_by over distinct counts; per
    # (e, p, s) the first copy and the previous VN; per (e, p, s, broker) what that broker
    # sent. Every grouping is keyed by (p, s) and more, so none moves data (see
    # ``session``: the records are partitioned by p, s).
    evidence = recs.where(((col("k") == PUB) & ~col("pc")) | col("k").isin(COPY, SIG)).select(
        col("b").alias("e"), "p", "s", "k", col("from").alias("broker"), "dig", "t", "prev"
    )
    is_copy = col("k") != SIG
    per_digest = (
        evidence.where(is_copy)
        .groupBy("e", "p", "s", "dig")
        .agg(
            F.count(lit(1)).alias("c"),
            F.min("t").alias("t"),
            F.max(F.when(col("k") == PUB, col("prev"))).alias("pv"),
        )
    )
    per_count = per_digest.groupBy("e", "p", "s", "c").agg(
        F.min("dig").alias("d"), F.min("t").alias("t"), F.max("pv").alias("pv")
    )
    seen = (
        per_count.groupBy("e", "p", "s")
        .agg(
            F.max("pv").alias("prev_vn"),
            F.min("t").alias("first_t"),
            F.max_by("d", "c").alias("maj"),
        )
        .where(col("prev_vn").isNotNull())
        .join(win.hint("shuffle_hash"), ["p", "s"])
        .withColumnRenamed("pw", "w")
        .cache()
    )
    sent = evidence.groupBy("e", "p", "s", "broker").agg(
        F.max(is_copy.cast("int")).alias("has"),
        F.max((~is_copy).cast("int")).alias("sig"),
        F.min(F.when(is_copy, col("t"))).alias("t"),
        F.min(F.when(is_copy, col("dig"))).alias("lo"),
        F.max(F.when(is_copy, col("dig"))).alias("hi"),
        F.max((is_copy & col("dig").isNull()).cast("int")).alias("nulls"),
    )
    member_vn = F.broadcast(members_coded.select("broker", col("broker_vn").alias("bvn")))
    conflicting = (col("has") == 1) & (
        ~col("lo").eqNullSafe(col("maj"))
        | ~col("hi").eqNullSafe(col("maj"))
        | ((col("nulls") == 1) & col("maj").isNotNull())
    )
    per_pub = (
        sent.join(seen.hint("shuffle_hash"), ["e", "p", "s"])
        .join(member_vn, "broker")
        .where(col("bvn") == col("prev_vn"))
        .select(
            "w",
            "e",
            "p",
            "s",
            "broker",
            ((col("has") == 1) | (col("sig") == 1)).cast("int").alias("received"),
            conflicting.cast("int").alias("conflicting"),
            col("sig").alias("bad_signatures"),
            ((col("has") == 1) & (col("t") - col("first_t") <= lit(timely)))
            .cast("int")
            .alias("timely"),
        )
        .cache()
    )
    by_vn = members_coded.select(col("broker_vn").alias("prev_vn"), "broker")
    expected = (
        seen.groupBy("w", "e", "prev_vn")
        .agg(F.count(lit(1)).alias("expected"))
        .join(F.broadcast(by_vn), "prev_vn")
        .select("w", "e", "broker", "expected")
    )
    copy_counts = (
        per_pub.groupBy("w", "e", "broker")
        .agg(*(F.sum(n).alias(n) for n in ("received", "conflicting", "bad_signatures", "timely")))
        .join(expected, ["w", "e", "broker"], "right")
        .select(
            "w",
            "e",
            "broker",
            "expected",
            *(
                F.coalesce(col(n), lit(0)).alias(n)
                for n in ("received", "conflicting", "bad_signatures", "timely")
            ),
        )
        .withColumn("missing", col("expected") - col("received"))
    )
    shares = windowed(
        recs.where(col("k") == SHARE).select("p", "s", "t", "b", "from", "ok", "cul")
    ).cache()
    share_counts = (
        shares.where(col("ok"))
        .groupBy("w", col("b").alias("e"), col("from").alias("broker"))
        .agg(F.count(lit(1)).alias("shares_ok"))
        .join(
            shares.where(~col("ok") & col("cul").isNotNull())
            .groupBy("w", col("b").alias("e"), col("cul").alias("broker"))
            .agg(F.count(lit(1)).alias("bad_shares")),
            ["w", "e", "broker"],
            "full",
        )
    )
    pairs = copy_counts.join(share_counts, ["w", "e", "broker"], "full").select(
        "w",
        col("e").alias("evaluator"),
        "broker",
        *(F.coalesce(col(n), lit(0)).cast("long").alias(n) for n in FEEDBACK_COUNTS),
    )
    pairs = named(pairs, "evaluator", "broker").join(members, "broker", "left")
    failures = col("missing") + col("conflicting") + col("bad_signatures") + col("bad_shares")
    events = col("expected") + col("shares_ok") + col("bad_shares")
    trust = (
        pairs.withColumn("failures", failures)
        .withColumn("events", events)
        .withColumn("failure_ratio", ratio(col("failures"), col("events")))
        .withColumn(
            "delivery_ratio",
            ratio(col("received") - col("conflicting") - col("bad_signatures"), col("expected")),
        )
        .withColumn(
            "share_integrity", ratio(col("shares_ok"), col("shares_ok") + col("bad_shares"))
        )
        .withColumn("timeliness", ratio(col("timely"), col("received") - col("bad_signatures")))
        .select(*TABLES["trust_feedback"])
        .cache()
    )

    of_brokers = trust.where(col("broker_vn").isNotNull())
    sums = [F.sum(n).alias(n) for n in ("expected", "failures", "events")]
    broker_failures = (
        of_brokers.groupBy("w", "broker")
        .agg(*sums)
        .join(dropped, ["w", "broker"], "full")
        .select(
            "w",
            "broker",
            *(F.coalesce(col(n), lit(0)).alias(n) for n in ("expected", "failures", "events")),
            F.coalesce(col("dropped_deliveries"), lit(0)).alias("dropped_deliveries"),
        )
        .withColumn("failure_ratio", ratio(col("failures"), col("events")))
        .select(*TABLES["broker_failures"])
    )
    evaluator_vn = members.select(col("broker").alias("evaluator"), col("broker_vn").alias("ev"))
    link_sums = (
        of_brokers.join(evaluator_vn, "evaluator", "left")
        .groupBy(
            "w", col("broker_vn").alias("src_vn"), F.coalesce(col("ev"), lit("?")).alias("dst_vn")
        )
        .agg(*sums)
    )
    peer_vn = members.select(col("broker").alias("peer"), col("broker_vn").alias("pv"))
    links_down = (
        rare.where(col("k") == "link")
        .join(peer_vn, "peer", "left")
        .groupBy(
            window_of(col("t")).alias("w"),
            col("vn").alias("src_vn"),
            F.coalesce(col("pv"), lit("?")).alias("dst_vn"),
        )
        .agg(F.count(lit(1)).alias("links_down"))
    )
    link_failures = (
        link_sums.join(links_down, ["w", "src_vn", "dst_vn"], "full")
        .select(
            "w",
            "src_vn",
            "dst_vn",
            *(F.coalesce(col(n), lit(0)).alias(n) for n in ("expected", "failures", "events")),
            F.coalesce(col("links_down"), lit(0)).alias("links_down"),
        )
        .withColumn("failure_ratio", ratio(col("failures"), col("events")))
        .select(*TABLES["link_failures"])
    )

    # A publication met a failure when some evaluator missed a copy it expected (fewer
    # received than expected, summed over evaluators and brokers), got a conflicting or
    # badly signed one, or rejected a share of its epoch.
    size_of = members_coded.groupBy(col("broker_vn").alias("prev_vn")).agg(
        F.count(lit(1)).alias("m")
    )
    owed = seen.join(F.broadcast(size_of), "prev_vn").groupBy("p", "s").agg(F.sum("m").alias("m"))
    got = per_pub.groupBy("p", "s").agg(
        F.sum("received").alias("got"),
        F.sum(col("conflicting") + col("bad_signatures")).alias("bad"),
    )
    failed = (
        owed.join(got, ["p", "s"], "left")
        .where((F.coalesce(col("got"), lit(0)) < col("m")) | (F.coalesce(col("bad"), lit(0)) > 0))
        .select("p", "s")
        .unionByName(shares.where(~col("ok") & col("cul").isNotNull()).select("p", "s"))
        .distinct()
        .withColumn("bad", lit(1))
    )
    path_failures = (
        pub_info.where(col("src").isNotNull())
        .join(failed.hint("shuffle_hash"), ["p", "s"], "left")
        .select(
            "w", "src", F.explode("dsts").alias("dst"), F.coalesce(col("bad"), lit(0)).alias("bad")
        )
        .groupBy("w", "src", "dst")
        .agg(F.count(lit(1)).alias("publications"), F.sum("bad").alias("failed"))
        .withColumn("failure_ratio", ratio(col("failed"), col("publications")))
    )
    path_failures = named(named(path_failures, "src", key="rank"), "dst")
    return {
        "classes": classes.select(*TABLES["classes"]),
        "local_views": local_views.select(*TABLES["local_views"]),
        "trust_feedback": trust,
        "broker_failures": broker_failures,
        "link_failures": link_failures,
        "path_failures": path_failures.select(*TABLES["path_failures"]),
    }


def summarise(tables: dict[str, Any], records: int, width: float, top: int = 5) -> dict[str, Any]:
    """The small JSON summary (collects only a handful of aggregated rows)."""
    from pyspark.sql import functions as F

    classes = tables["classes"]
    totals = classes.agg(
        F.count(F.lit(1)).alias("rows"),
        F.countDistinct("src", "dsts").alias("classes"),
        F.countDistinct("w").alias("windows"),
        F.sum("demand").alias("publications"),
    ).first()
    talkers = (
        classes.groupBy("src")
        .agg(F.sum("demand").alias("demand"))
        .orderBy(F.col("demand").desc(), "src")
        .limit(top)
        .collect()
    )
    culprits = (
        tables["broker_failures"]
        .groupBy("broker")
        .agg(F.sum("failures").alias("failures"), F.sum("events").alias("events"))
        .where(F.col("failures") > 0)
        .orderBy(F.col("failures").desc(), "broker")
        .collect()
    )
    return {
        "version": OUTPUT_VERSION,
        "log_schema_version": schema_version(),
        "window_seconds": width,
        "records": records,
        "windows": int(totals["windows"] or 0),
        "classes": int(totals["classes"] or 0),
        "publications": int(totals["publications"] or 0),
        "top_talkers": [{"src": r["src"], "demand": int(r["demand"])} for r in talkers],
        "brokers_with_failures": [
            {
                "broker": r["broker"],
                "failures": int(r["failures"]),
                "events": int(r["events"]),
                "failure_ratio": r["failures"] / r["events"] if r["events"] else None,
            }
            for r in culprits
        ],
    }


def run(
    spark: Any,
    logs: str | Path,
    out: str | Path,
    width: float = 60.0,
    timely: float = 1.0,
    progress: Progress | None = None,
    pending: Future[int] | None = None,
) -> dict[str, Any]:
    """Read the logs, compute every table, write them as Parquet with ``summary.json``.

    The logs are first compacted to Parquet under ``out/_input`` (removed at the end);
    ``pending`` is that compaction already under way (:func:`run_cli` starts it beside the
    JVM)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    say = progress or (lambda _msg: None)
    started = time.monotonic()
    out_dir = Path(out)
    input_dir = out_dir / INPUT_DIR
    if pending is None:
        say("compacting logs to Parquet")
        compacted = compact(logs, input_dir)
    else:
        compacted = pending.result()
    say(f"logs compacted ({time.monotonic() - started:.1f} s)")
    configured = spark.conf.get("spark.sql.shuffle.partitions")
    cores = spark.sparkContext.defaultParallelism
    partitions = shuffle_partitions(compacted, int(configured), cores)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    # One shuffle up front: every record of a publication in one partition. Every later
    # grouping and join is keyed by (publication, ...) and reuses this partitioning; only
    # the small per-window aggregates move again. Meta and link records stay aside.
    inputs = load(spark, input_dir)
    names = inputs.names.cache()
    check_names(names)
    rare = inputs.rare.cache()
    records = inputs.records.repartition(partitions, "p", "s").persist(StorageLevel.MEMORY_AND_DISK)
    say("reading logs")
    count = records.count() + rare.count()
    say(f"{count} records read ({time.monotonic() - started:.1f} s)")
    tables = compute(records, inputs.routes.cache(), width, timely, rare, names)
    for name, df in tables.items():
        say(f"writing {name}")
        df.withColumn("version", F.lit(OUTPUT_VERSION)).write.mode("overwrite").parquet(
            str(out_dir / name)
        )
    summary = summarise({n: spark.read.parquet(str(out_dir / n)) for n in tables}, count, width)
    summary["seconds"] = round(time.monotonic() - started, 3)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    # Every frame cached on the way (records and intermediates) goes, and the setting
    # returns: a session that runs the job again starts as it was.
    spark.catalog.clearCache()
    spark.conf.set("spark.sql.shuffle.partitions", configured)
    shutil.rmtree(input_dir, ignore_errors=True)
    say(f"done in {summary['seconds']:.1f} s")
    return summary


def shuffle_partitions(records: int, most: int, least: int) -> int:
    """Shuffle partitions for ``records`` records: one per :data:`RECORDS_PER_PARTITION`,
    at least ``least`` (the cores) and at most ``most`` (the session's setting)."""
    wanted = -(-records // RECORDS_PER_PARTITION)
    return max(least, min(most, wanted))


def parse_seconds(text: str) -> float:
    """``60``, ``60s``, ``5m``, ``1h`` → seconds.

    Raises:
        argparse.ArgumentTypeError: not such a duration, or not greater than 0.
    """
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    text = text.strip()
    scale = units.get(text[-1:])
    try:
        value = float(text[:-1] if scale else text) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 60, 60s, 5m or 1h, got {text!r}"
        ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return value


def log_directory(text: str) -> str:
    """``--logs``: a directory that exists (or a single log file).

    Raises:
        argparse.ArgumentTypeError: nothing there.
    """
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"no such log directory: {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's options (shared by ``trellis analytics run`` and ``python -m``)."""
    parser.add_argument(
        "--logs",
        type=log_directory,
        required=True,
        help="traffic-log directory (searched deeply)",
    )
    parser.add_argument("--out", required=True, help="output directory (Parquet + summary.json)")
    parser.add_argument(
        "--window",
        type=parse_seconds,
        default=60.0,
        metavar="DURATION",
        help="Δt, e.g. 60s, 5m (default: 60s)",
    )
    parser.add_argument(
        "--timely",
        type=parse_seconds,
        default=1.0,
        metavar="DURATION",
        help="a copy later than this is not timely (default: 1s)",
    )
    parser.add_argument(
        "--master", default=None, help="Spark master, e.g. spark://HOST:7077 (default: local[*])"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def human_summary(summary: dict[str, Any]) -> str:
    """A few lines for people: classes, top talkers, brokers with failures."""
    lines = [
        f"{summary['records']} records, {summary['windows']} window(s) of "
        f"{summary['window_seconds']:g} s, {summary['publications']} publications in "
        f"{summary['classes']} traffic class(es), {summary['seconds']:.1f} s",
        "top talkers (publisher edge VN: publications): "
        + (", ".join(f"{t['src']}: {t['demand']}" for t in summary["top_talkers"]) or "none"),
    ]
    bad = summary["brokers_with_failures"]
    if not bad:
        lines.append("brokers with failures: none")
    else:
        lines.append("brokers with failures:")
        lines.extend(
            f"  {b['broker']}: {b['failures']} of {b['events']} ({b['failure_ratio']:.1%})"
            for b in bad
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m analytics.job`` (and spark-submit): run the job once."""
    parser = argparse.ArgumentParser(prog="analytics.job", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_cli(args)


def run_cli(args: argparse.Namespace) -> int:
    """Run the job for parsed arguments; progress on stderr, summary on stdout."""
    started = time.monotonic()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.monotonic() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    progress("compacting logs and starting Spark" + (f" ({args.master})" if args.master else ""))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(compact, args.logs, Path(args.out) / INPUT_DIR)
        spark = session(args.master)
        try:
            summary = run(spark, args.logs, args.out, args.window, args.timely, progress, pending)
        finally:
            spark.stop()
    print(json.dumps(summary, indent=2) if args.json else human_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
