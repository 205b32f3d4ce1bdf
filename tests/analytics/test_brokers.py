"""Real broker processes log their traffic; the real job finds the injected faults (SPEC §7).

A line of 3 VNs × 3 replicas: b0.2 drops every publication and share, b1.1 corrupts every
payload and sub-share it forwards. A publisher at b0 sends plain and confidential
publications to a subscriber at b2. Then the job (Spark local mode, the session the analytics
tests share; ``trellis analytics run`` is the same :func:`analytics.job.run`) reads the
brokers' logs, and its outputs must say exactly what the faults imply: every copy b0.2
owed b1's replicas is missing, every copy b1.1 sent b2's replicas conflicts (plain) or fails
the publisher's signature (confidential), every share b2 rejected is blamed on b1.1 as the
brokers' own counters say, and every honest broker is clean. The job's local views equal
the brokers' live OCBR counters (``GET /reconfig``) on the same traffic.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from analytics import job
from broker.client import Client
from broker.tools.local import LocalOverlay, fetch_json, metric_by_label
from overlay.tree import line_tree

pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyspark")

pytestmark = [
    pytest.mark.slow,
    # py4j (PySpark's bridge to the JVM) leaves its sockets to the garbage collector.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

PLAIN, CONFIDENTIAL = 40, 10
DROPPER, CORRUPTER = "b0.2", "b1.1"
ONE_WINDOW = 1e9  # seconds: the whole run is one window


def table(out: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(out / name).to_pylist()
    return rows


async def traffic(overlay: LocalOverlay) -> int:
    pub = Client(overlay.endpoints("b0"), client_id="pub")
    sub_client = Client(overlay.endpoints("b2"), client_id="sub", manifest=overlay.manifest)
    async with pub, sub_client, sub_client.subscribe("class = 'q'") as sub:
        await pub.advertise("class = 'q'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(PLAIN + CONFIDENTIAL):
            await pub.publish({"class": "q", "i": i}, b"x" * 50, confidential=i >= PLAIN)
        got = 0
        for _ in range(PLAIN + CONFIDENTIAL):
            await sub.get(15.0)
            got += 1
        return got


def test_the_job_names_the_culprits_of_a_real_overlay(
    run_overlay: Callable[..., LocalOverlay], spark: Any, tmp_path: Path
) -> None:
    logs, out = tmp_path / "traffic", tmp_path / "out"
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2"]),
        replicas={"b0": 3, "b1": 3, "b2": 3},
        overrides={DROPPER: {"byzantine": "drop"}, CORRUPTER: {"byzantine": "corrupt"}},
        heartbeat_interval=1.0,
        traffic_log={"dir": str(logs), "flush_interval": 0.2},
        reconfig={"interval": 3600.0},
    )
    assert asyncio.run(traffic(overlay)) == PLAIN + CONFIDENTIAL
    overlay.wait_quiet()
    live = {
        b: fetch_json(p.admin_url + "/reconfig")["window"]["classes"]
        for b, p in overlay.brokers.items()
    }
    blamed = {
        b: metric_by_label(overlay.metrics(b), "trellis_share_blame_total", "culprit")
        for b in overlay.brokers
    }
    overlay.stop()  # a graceful stop writes every broker's last batch

    summary = job.run(spark, logs, out, ONE_WINDOW)
    total = PLAIN + CONFIDENTIAL
    assert summary["publications"] == total
    assert {b["broker"] for b in summary["brokers_with_failures"]} == {DROPPER, CORRUPTER}

    assert [(r["src"], r["dsts"], r["demand"]) for r in table(out, "classes")] == [
        ("b0", ["b2"], total)
    ]

    # The job's local views are the brokers' live counters.
    views: dict[str, Counter[tuple[str, ...]]] = {b: Counter() for b in overlay.brokers}
    for r in table(out, "local_views"):
        views[r["broker"]][tuple(r["members"])] += r["demand"]
    for broker, classes in live.items():
        want = Counter({tuple(c["members"]): c["demand"] for c in classes})
        assert views[broker] == want, broker
    assert views[DROPPER] == Counter()

    trust = {(r["evaluator"], r["broker"]): r for r in table(out, "trust_feedback")}
    for evaluator in ("b1.0", "b1.1", "b1.2"):
        row = trust[(evaluator, DROPPER)]
        assert (row["expected"], row["missing"], row["delivery_ratio"]) == (total, total, 0.0)
    for evaluator in ("b2.0", "b2.1", "b2.2"):
        row = trust[(evaluator, CORRUPTER)]
        assert row["expected"] == total
        assert row["received"] == total
        # Every copy it sent is bad: a plain one conflicts with the majority; a confidential
        # one fails the signature when it comes first, else (already routed) conflicts.
        assert row["conflicting"] + row["bad_signatures"] == total
        assert row["bad_signatures"] <= CONFIDENTIAL
        assert row["delivery_ratio"] == 0.0
        assert row["bad_shares"] == blamed[evaluator].get(CORRUPTER, 0) > 0
        assert row["share_integrity"] == 0.0
    for (evaluator, broker), row in trust.items():
        if broker not in (DROPPER, CORRUPTER):
            assert row["failures"] == 0, (evaluator, broker, row)
            assert row["delivery_ratio"] in (1.0, None), (evaluator, broker, row)
            assert row["share_integrity"] in (1.0, None), (evaluator, broker, row)

    failures = {r["broker"]: r for r in table(out, "broker_failures")}
    assert failures[DROPPER]["failure_ratio"] == 1.0
    assert failures[CORRUPTER]["failures"] == 3 * total + sum(
        blamed[e].get(CORRUPTER, 0) for e in ("b2.0", "b2.1", "b2.2")
    )
    assert failures[CORRUPTER]["failure_ratio"] == 1.0
    for broker, row in failures.items():
        if broker not in (DROPPER, CORRUPTER):
            assert row["failures"] == 0, broker
    paths = table(out, "path_failures")
    assert [(r["src"], r["dst"], r["publications"], r["failed"]) for r in paths] == [
        ("b0", "b2", total, total)
    ]
