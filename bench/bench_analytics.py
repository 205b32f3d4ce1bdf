"""The analytics job end to end (JVM start included) beside pandas and polars (SPEC §10).

For each size, generated traffic logs (:mod:`analytics.generate`: 4 VNs × 3 replicas, one
dropping and one corrupting replica, late copies) are written once, then in the same run:

* ``spark``: ``python -m analytics.job --master local[N]`` as a fresh process, timed from
  spawn to exit: JVM start, the logs compacted to Parquet (beside the JVM start), and all six
  tables written as Parquet;
* ``pandas`` and ``polars``: a fresh process each that reads the same logs into Arrow with
  the job's own reader (:func:`analytics.compact.table_of`, one file at a time in one
  process) and computes the two group-by tables that need no join across brokers' records
  beyond the publication's own (global traffic classes and per-broker local views), written
  as Parquet. They do less than the job (no failure or trust tables), so the ratio flatters
  them.

Each runs ``--repeat`` times (default 3, interleaved); the table shows medians, and the peak
resident memory of the process tree (``ru_maxrss`` of the children: the largest process,
for Spark the JVM). Goals: 10M records < 60 s on 2 cores for the job, linear growth. Usage::

    .venv/bin/python bench/bench_analytics.py --sizes 1e6,1e7 [--cores 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analytics.generate import generate  # noqa: E402
from analytics.schema import log_files  # noqa: E402

RECORDS_PER_PUBLICATION = 19.0  # what generate() writes on average with its defaults
WINDOW = 60.0


def make_logs(root: Path, records: int) -> int:
    return generate(root, int(records / RECORDS_PER_PUBLICATION), torn=False, rate=2000.0)


def _child_rss_mib() -> float:
    """The peak resident memory of the largest child waited for so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def run_spark(logs: Path, out: Path, cores: int) -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "analytics.job",
            "--logs",
            str(logs),
            "--out",
            str(out),
            "--window",
            f"{WINDOW:g}s",
            "--master",
            f"local[{cores}]",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    summary = json.loads(done.stdout)
    return {
        "seconds": seconds,
        "job_seconds": summary["seconds"],
        "compacted_at": _progress_at(done.stderr, "logs compacted"),
        "read_at": _progress_at(done.stderr, "records read"),
        "records": summary["records"],
        "rss": _child_rss_mib(),
    }


def _progress_at(stderr: str, text: str) -> float | None:
    """When (seconds after the job's start) its progress line holding ``text`` came: the
    split between the compaction (with the JVM start beside it) and the Spark stages."""
    for line in stderr.splitlines():
        if text in line and line.startswith("["):
            return float(line[1 : line.index("s]")])
    return None


def run_peer(peer: str, logs: Path, out: Path) -> dict[str, float]:
    """One peer in a fresh process: its wall time and peak memory."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, __file__, "--peer", peer, "--logs", str(logs), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return {"seconds": time.monotonic() - started, "rss": _child_rss_mib()}


def read_arrow(logs: Path) -> Any:
    """The logs as one Arrow table, with the job's reader."""
    import pyarrow as pa

    from analytics.compact import table_of

    return pa.concat_tables([table_of(p) for p in log_files(logs)])


def run_pandas(logs: Path, out: Path) -> float:
    import pandas as pd

    started = time.monotonic()
    df = read_arrow(logs).to_pandas()
    pubs = df[df["k"] == "pub"]
    has_local = pubs["loc"].map(len) + pubs["drop"].map(len) > 0
    t0 = pubs.groupby(["p", "s"])["t"].min().rename("t0")
    src = pubs[pubs["pc"] == True].groupby(["p", "s"])["vn"].min().rename("src")  # noqa: E712
    dsts = (
        pubs[has_local].groupby(["p", "s"])["vn"].agg(lambda v: ",".join(sorted(set(v))))
    ).rename("dsts")
    info = pd.concat([t0, src, dsts], axis=1).dropna()
    info["w"] = (info["t0"] // WINDOW) * WINDOW
    classes = info.groupby(["w", "src", "dsts"]).size().rename("demand").reset_index()
    members = [
        ",".join(sorted({prev, *n, *lo, *dr}))
        for prev, n, lo, dr in zip(
            pubs["prev"], pubs["next"], pubs["loc"], pubs["drop"], strict=True
        )
    ]
    views = (
        pubs.assign(members=members, w=(pubs["t"] // WINDOW) * WINDOW)
        .groupby(["w", "b", "members"])
        .size()
        .rename("demand")
        .reset_index()
    )
    out.mkdir(parents=True, exist_ok=True)
    classes.to_parquet(out / "classes.parquet")
    views.to_parquet(out / "local_views.parquet")
    return time.monotonic() - started


def run_polars(logs: Path, out: Path) -> float:
    import polars as pl

    started = time.monotonic()
    df = pl.from_arrow(read_arrow(logs))
    assert isinstance(df, pl.DataFrame)
    pubs = df.filter(pl.col("k") == "pub")
    info = pubs.group_by("p", "s").agg(
        pl.col("t").min().alias("t0"),
        pl.col("vn").filter(pl.col("pc")).min().alias("src"),
        pl.col("vn")
        .filter((pl.col("loc").list.len() + pl.col("drop").list.len()) > 0)
        .unique()
        .sort()
        .alias("dsts"),
    )
    classes = (
        info.filter(pl.col("src").is_not_null() & (pl.col("dsts").list.len() > 0))
        .with_columns(((pl.col("t0") / WINDOW).floor() * WINDOW).alias("w"))
        .group_by("w", "src", "dsts")
        .len()
    )
    views = (
        pubs.with_columns(
            pl.concat_list(pl.col("prev"), "next", "loc", "drop")
            .list.unique()
            .list.sort()
            .alias("members"),
            ((pl.col("t") / WINDOW).floor() * WINDOW).alias("w"),
        )
        .filter(pl.col("members").list.len() > 1)
        .group_by("w", "b", "members")
        .len()
    )
    out.mkdir(parents=True, exist_ok=True)
    classes.write_parquet(out / "classes.parquet")
    views.write_parquet(out / "local_views.parquet")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e6,1e7", help="records per run, comma-separated")
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    parser.add_argument("--peers", default="pandas,polars", help="peers to run ('' for none)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (medians shown)")
    parser.add_argument("--keep", help="keep generated logs here (reused when present)")
    parser.add_argument("--peer", help=argparse.SUPPRESS)  # internal: run one peer
    parser.add_argument("--logs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        {"pandas": run_pandas, "polars": run_polars}[args.peer](Path(args.logs), Path(args.out))
        return 0
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-analytics-"))
    peers = [p for p in args.peers.split(",") if p]
    rows = []
    try:
        for size in (int(float(s)) for s in args.sizes.split(",")):
            logs, out = base / f"logs-{size}", base / f"out-{size}"
            if not logs.exists():
                started = time.monotonic()
                made = make_logs(logs, size)
                print(
                    f"generated {made:,} records in {time.monotonic() - started:.1f} s", flush=True
                )
            mib = sum(p.stat().st_size for p in log_files(logs)) / 2**20
            runs: dict[str, list[dict[str, Any]]] = {"spark": [], **{p: [] for p in peers}}
            records = 0
            for rep in range(args.repeat):
                spark = run_spark(logs, out / "spark", args.cores)
                records = spark["records"]
                runs["spark"].append(spark)
                print(
                    f"[{rep + 1}/{args.repeat}] {records:,} records ({mib:,.0f} MiB): spark "
                    f"{spark['seconds']:.1f} s (in the job {spark['job_seconds']:.1f} s; logs "
                    f"compacted at {spark['compacted_at']} s, cached at {spark['read_at']} s; "
                    f"load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                for peer in peers:
                    got = run_peer(peer, logs, out / peer)
                    runs[peer].append(got)
                    print(f"  {peer} {got['seconds']:.1f} s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
            row: dict[str, Any] = {"records": records, "mib": mib}
            for name, results in runs.items():
                if results:
                    row[name] = statistics.median(r["seconds"] for r in results)
                    row[f"{name}_range"] = (
                        min(r["seconds"] for r in results),
                        max(r["seconds"] for r in results),
                    )
                    row[f"{name}_rss"] = max(r["rss"] for r in results)
            rows.append(row)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} cores, "
        f"Spark local[{args.cores}], medians of {args.repeat}, load {os.getloadavg()[0]:.1f}"
    )
    print(
        "| records | MiB | Spark end to end (s), median (min–max) | µs/record | Spark peak MiB "
        "| pandas (s) | polars (s) | Spark/pandas | Spark/polars |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        spark_s = r["spark"]
        low, high = r["spark_range"]
        pd_s, pl_s = r.get("pandas"), r.get("polars")
        cells = [
            f"{r['records']:,}",
            f"{r['mib']:,.0f}",
            f"{spark_s:.1f} ({low:.1f}–{high:.1f})",
            f"{spark_s / r['records'] * 1e6:.2f}",
            f"{r['spark_rss']:,.0f}",
            "—" if pd_s is None else f"{pd_s:.1f}",
            "—" if pl_s is None else f"{pl_s:.1f}",
            "—" if pd_s is None else f"{spark_s / pd_s:.1f}×",
            "—" if pl_s is None else f"{spark_s / pl_s:.1f}×",
        ]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
