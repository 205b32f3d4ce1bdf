"""One local SparkSession for every analytics test that runs the job in the test process.

Starting the JVM is most of a small job's time (5–20 s on this machine), so the tests that
call :func:`analytics.job.run` share one session, started on first use and stopped after the
package's last test (package scope: the JVM does not idle through the rest of the suite).
The job keeps no state in the session between runs (it unpersists its caches and reads
only its own ``--out``), so sharing it hides nothing. The command line and ``spark-submit``
are still run as processes of their own: ``tests/analytics/test_cluster.py`` (standalone
master and worker) and ``tests/broker/tools/test_placement_cli.py`` (``trellis analytics
run``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    """The shared local[2] session (1 GiB driver: the tests' logs are small)."""
    pytest.importorskip("pyspark")
    from analytics import job

    session = job.session("local[2]", **{"spark.driver.memory": "1g"})
    yield session
    session.stop()
