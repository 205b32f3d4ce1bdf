"""The Spark job equals the pure-Python reference on generated logs (SPEC §7).

The logs have several windows, copies written late (after their publication's window
closed, at the end of their file), a dropping and a corrupting replica, confidential
publications with rejected shares, slow-consumer drops and a torn last line. The local
SparkSession is the one the analytics tests share (``conftest.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analytics import job, reference
from analytics.generate import generate
from analytics.logfile import frames
from analytics.schema import log_files, read_records

pyspark = pytest.importorskip("pyspark")

pytestmark = [
    pytest.mark.slow,
    # py4j (PySpark's bridge to the JVM) leaves its sockets to the garbage collector.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WINDOW = 20.0


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logs")
    generate(root, 1500, window=WINDOW, rate=20.0, late=0.05, confidential=0.3)
    return root


def rows(spark: Any, out: Path, name: str) -> list[dict[str, Any]]:
    got = []
    for row in spark.read.parquet(str(out / name)).collect():
        record = row.asDict(recursive=True)
        assert record.pop("version") == 1
        got.append(record)
    return got


def ordered(table: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    columns = reference.TABLES[table]
    return sorted(items, key=lambda r: tuple(str(r[c]) for c in columns))


def test_the_generated_logs_exercise_what_the_job_must_handle(logs: Path) -> None:
    last = log_files(logs)[-1].read_bytes()
    assert sum(8 + len(body) for body in frames(last)) < len(last)  # a torn last frame
    records = list(read_records(logs))
    windows = {reference.window_of(r["t"], WINDOW) for r in records if r["k"] == "pub"}
    assert len(windows) >= 3
    first_t: dict[tuple[str, int], float] = {}
    for r in records:
        if r["k"] == "pub":
            key = (r["p"], r["s"])
            first_t[key] = min(first_t.get(key, r["t"]), r["t"])
    late = [
        r
        for r in records
        if r["k"] == "copy"
        and reference.window_of(r["t"], WINDOW)
        != reference.window_of(first_t[(r["p"], r["s"])], WINDOW)
    ]
    assert late, "some copies must land in a later window than their publication"
    assert any(r["k"] == "share" and not r["ok"] for r in records)
    assert any(r["k"] == "pub" and r["drop"] for r in records)


def test_the_job_equals_the_reference(spark: Any, logs: Path, tmp_path: Path) -> None:
    summary = job.run(spark, logs, tmp_path, WINDOW)
    want = reference.compute(read_records(logs), WINDOW)
    for table in reference.TABLES:
        got = rows(spark, tmp_path, table)
        assert ordered(table, got) == ordered(table, want[table]), table
    on_disk = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert on_disk["version"] == 1
    assert on_disk["log_schema_version"] == 2
    assert summary["publications"] == sum(r["demand"] for r in want["classes"])
    culprits = {b["broker"] for b in summary["brokers_with_failures"]}
    assert culprits == {"v1.2", "v2.1"}


def test_the_culprits_come_out_of_the_trust_feedback(
    spark: Any, logs: Path, tmp_path: Path
) -> None:
    job.run(spark, logs, tmp_path, 3600.0)
    trust = rows(spark, tmp_path, "trust_feedback")
    by_broker: dict[str, list[dict[str, Any]]] = {}
    for r in trust:
        by_broker.setdefault(r["broker"], []).append(r)
    assert all(r["delivery_ratio"] == 0.0 for r in by_broker["v1.2"])  # the dropper
    assert all(r["missing"] == r["expected"] for r in by_broker["v1.2"])
    corrupt = by_broker["v2.1"]
    assert all(r["conflicting"] == r["received"] for r in corrupt)
    assert all(r["share_integrity"] in (0.0, None) for r in corrupt)
    assert any(r["share_integrity"] == 0.0 for r in corrupt)
    for broker, pairs in by_broker.items():
        if broker not in ("v1.2", "v2.1"):
            assert all(r["failures"] == 0 for r in pairs), broker
            assert all(r["delivery_ratio"] in (1.0, None) for r in pairs), broker


def test_version_1_logs_with_signature_records_still_read(
    spark: Any, logs: Path, tmp_path: Path
) -> None:
    """JSON Lines logs (version 1, and the export) with ``sig`` records, which brokers no
    longer write, and a torn last line: the job still equals the reference."""
    legacy = tmp_path / "legacy"
    files: dict[str, list[str]] = {}
    for i, record in enumerate(read_records(logs)):
        r = {**record, "v": 1}
        if r["k"] == "copy" and i % 7 == 0:
            r["k"] = "sig"
        files.setdefault(r["b"], []).append(json.dumps(r) + "\n")
    for broker, lines in files.items():
        (legacy / broker).mkdir(parents=True)
        (legacy / broker / "traffic-0.jsonl").write_text("".join(lines) + '{"v":1,"k":"pu')
    records = list(read_records(legacy))
    assert any(r["k"] == "sig" for r in records)
    out = tmp_path / "out"
    job.run(spark, legacy, out, WINDOW)
    want = reference.compute(records, WINDOW)
    assert any(r["bad_signatures"] for r in want["trust_feedback"])
    for table in reference.TABLES:
        assert ordered(table, rows(spark, out, table)) == ordered(table, want[table]), table


def test_two_names_sharing_a_code_stop_the_job(spark: Any) -> None:
    """The big table holds names as 64-bit codes; two names with one code would be merged
    (one broker's copies counted as another's), so the job refuses them."""
    schema = "h long, name string"
    job.check_names(spark.createDataFrame([(1, "v1.0"), (2, "v1.1"), (1, "v1.0")], schema))
    with pytest.raises(job.NameClash):
        job.check_names(spark.createDataFrame([(1, "v1.0"), (1, "v1.1"), (2, "v2")], schema))
